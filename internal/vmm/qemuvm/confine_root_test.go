package qemuvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
)

// confined is a test guest's cgroup: under a tag of the test's own,
// removed at cleanup whatever the test did.
type confined struct {
	host   guestcg.Host
	name   string
	limits guestcg.Limits // set when the VM asks for its confinement
}

// newConfinedGuest is newGuest confined by guestcg, as the VMM service
// confines it, with the limits changed by edit (if not nil), and the VM's
// options by more.
func newConfinedGuest(t *testing.T, edit func(*guestcg.Limits), more ...func(*Options)) (*guest, *confined) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes cgroups, network namespaces and QEMU")
	}
	host := guestcg.Detect()
	if host.V2 == "" && len(host.V1) == 0 {
		t.Skip("no cgroup file system is mounted")
	}
	var b [3]byte
	rand.Read(b[:])
	tag := "qz" + hex.EncodeToString(b[:])
	c := &confined{host: host, name: guestcg.Name(tag, "oxz_propolis-server_"+props.ID)}
	// Registered first, so it runs last: after the VM is closed.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := host.Remove(ctx, c.name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		host.RemoveEmpty(tag)
	})
	g := newGuestWith(t, func(o *Options) {
		o.Confine = func(gs Guest) Confinement {
			l := guestcg.LimitsFor(guestcg.Size{CPUs: gs.CPUs, MemoryMiB: gs.MemoryMiB, TCG: gs.Accel == qemu.TCG, HostMemory: guestcg.HostMemory()})
			if edit != nil {
				edit(&l)
			}
			c.limits = l
			return guestcg.Make(host, c.name, l)
		}
		for _, f := range more {
			f(o)
		}
	})
	return g, c
}

// dirs are the directories the guest's cgroup has.
func (c *confined) dirs() []string {
	var out []string
	for _, d := range c.host.Dirs(c.name) {
		if _, err := os.Stat(d.Path); err == nil {
			out = append(out, d.Path)
		}
	}
	return out
}

func (g *guest) pid() int {
	g.vm.mu.Lock()
	defer g.vm.mu.Unlock()
	return g.vm.proc.PID()
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The guest boots with QEMU in a cgroup of its own (in every hierarchy
// this host has), the memory and CPU limits written where the host keeps
// those controllers, the sandbox on, and the agent's view saying so;
// removing the cgroup, as the zone's teardown does, kills QEMU and leaves
// nothing.
func TestGuestConfinedInItsCgroup(t *testing.T) {
	g, c := newConfinedGuest(t, nil)
	g.ensureAndRun(t, false)
	pid := g.pid()
	dirs := c.dirs()
	if len(dirs) == 0 {
		t.Fatalf("no directory of cgroup %s", c.name)
	}
	var memory, cpu []string // where each limit was found
	for _, d := range dirs {
		procs := strings.Fields(readTrim(t, filepath.Join(d, "cgroup.procs")))
		if !slices.Equal(procs, []string{strconv.Itoa(pid)}) {
			t.Errorf("%s holds %v, want QEMU (%d) alone", d, procs, pid)
		}
		mem, quota, period := strconv.FormatInt(c.limits.MemoryBytes, 10), c.limits.CPUQuota.Microseconds(), c.limits.CPUPeriod.Microseconds()
		for file, want := range map[string]string{
			"memory.max":            mem,
			"memory.limit_in_bytes": mem,
			"cpu.max":               strconv.FormatInt(quota, 10) + " " + strconv.FormatInt(period, 10),
			"cpu.cfs_quota_us":      strconv.FormatInt(quota, 10),
			"cpu.cfs_period_us":     strconv.FormatInt(period, 10),
		} {
			p := filepath.Join(d, file)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if got := readTrim(t, p); got != want {
				t.Errorf("%s = %s, want %s", p, got, want)
			}
			if strings.HasPrefix(file, "memory") {
				memory = append(memory, p)
			} else if file != "cpu.cfs_period_us" {
				cpu = append(cpu, p)
			}
		}
	}
	if len(memory) != 1 || len(cpu) != 1 {
		t.Errorf("memory limit in %v, CPU limit in %v: want each in one place", memory, cpu)
	}
	t.Logf("QEMU %d in %v; limits %s in %v and %v", pid, dirs, c.limits, memory, cpu)
	if got := procStatus(t, pid, "Seccomp"); got != "2" {
		t.Errorf("seccomp mode %s, want 2 (QEMU's sandbox)", got)
	}
	d := g.vm.detailNow()
	if !strings.Contains(d, "QEMU confined in cgroup "+c.name+": memory ≤ ") || strings.Contains(d, "not limited") {
		t.Errorf("detail %q does not say QEMU is confined, and how", d)
	}
	t.Logf("detail: %s", d)

	// The guest boots within its limits.
	g.waitSerial(t, 0, testguest.ReadyPrefix+testMAC)
	for _, p := range memory {
		peak := filepath.Join(filepath.Dir(p), "memory.max_usage_in_bytes") // v1
		if strings.HasSuffix(p, "memory.max") {
			peak = filepath.Join(filepath.Dir(p), "memory.peak") // v2, Linux 5.19 on
		}
		if b, err := os.ReadFile(peak); err == nil {
			t.Logf("QEMU's memory at its peak, booted: %s MiB of %d", mib(strings.TrimSpace(string(b))), c.limits.MemoryBytes>>20)
		}
	}

	// The teardown: whatever runs in the cgroup is killed, and the
	// cgroup removed from every hierarchy.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	removed, err := c.host.Remove(ctx, c.name)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, dirs) {
		t.Errorf("removed %v, want %v", removed, dirs)
	}
	if left := c.dirs(); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	g.waitState(t, propolisapi.StateFailed)
	if d := g.vm.detailNow(); !strings.Contains(d, "signal: killed") || strings.Contains(d, "memory limit") {
		t.Errorf("detail %q: want QEMU killed, not by its memory limit", d)
	}
}

func mib(bytes string) string {
	n, err := strconv.ParseInt(bytes, 10, 64)
	if err != nil {
		return bytes
	}
	return strconv.FormatInt(n>>20, 10)
}

func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	for _, l := range strings.Split(readTrim(t, "/proc/"+strconv.Itoa(pid)+"/status"), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// A QEMU that reaches its memory limit is killed by the kernel, and the
// guest fails saying so.
func TestGuestKilledAtItsMemoryLimit(t *testing.T) {
	// QEMU starts within 128 MiB, and the guest's boot takes it beyond.
	g, c := newConfinedGuest(t, func(l *guestcg.Limits) { l.MemoryBytes = 128 << 20 })
	g.ensureAndRun(t, false)
	if d := g.vm.detailNow(); !strings.Contains(d, "memory ≤ 128 MiB") {
		t.Skipf("the memory limit could not be set here: %s", d)
	}
	g.waitState(t, propolisapi.StateFailed)
	d := g.vm.detailNow()
	if !strings.Contains(d, "QEMU signal: killed: killed by its cgroup's memory limit of 128 MiB (oom_kill ") {
		t.Errorf("detail %q does not say the memory limit killed QEMU", d)
	}
	t.Logf("detail: %s (cgroup %s)", d, c.name)
}
