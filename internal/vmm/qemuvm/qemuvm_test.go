package qemuvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet/zonenettest"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

const (
	nicID   = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"
	testMAC = "a8:40:25:f0:00:07"
	// bootWait bounds a boot through OVMF under TCG (about 20 s on a
	// busy 2-vCPU machine).
	bootWait = 3 * time.Minute
)

// guest is one test VM: its disk, its network namespace and the VM.
type guest struct {
	vm    *VM
	disk  string
	netns string
}

// newGuest makes a VM whose disk is a copy of the test guest, root's alone
// (0600, in a directory of mode 0700), and whose QEMU runs unprivileged
// (ids from DefaultIDs) in a network namespace of the test's own, where the
// VM makes its tap.
func newGuest(t *testing.T) *guest {
	t.Helper()
	return newGuestWith(t, nil)
}

// newGuestWith is newGuest with the VM's options changed by edit (if not
// nil) before the VM is made.
func newGuestWith(t *testing.T, edit func(*Options)) *guest {
	t.Helper()
	image := testguest.Image(t) // skips without root, QEMU or OVMF
	code, vars, err := testguest.OVMF()
	if err != nil {
		t.Fatal(err)
	}
	storage := t.TempDir()
	disk := filepath.Join(storage, "boot.raw")
	if err := os.Rename(testguest.TempCopy(t, image), disk); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(disk, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(storage, 0o700); err != nil {
		t.Fatal(err)
	}
	netns := zonenettest.Netns(t, "qvt-")
	opts := Options{
		Name:         "qemuvm-test",
		Dir:          t.TempDir(),
		FirmwareCode: code,
		FirmwareVars: vars,
		Accel:        qemu.TCG,
		// No NICs: the service finds each NIC's MAC in its vnic_name,
		// which the agent made.
		Sled:    spec.Sled{Threads: 2, FileRoots: []string{storage}},
		Start:   func(cmd *exec.Cmd) error { return zonenet.StartIn(netns, cmd) },
		IDs:     DefaultIDs,
		InNetns: func(f func() error) error { return zonenet.RunIn(netns, f) },
	}
	if edit != nil {
		edit(&opts)
	}
	vm := New(opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := vm.Close(ctx); err != nil {
			t.Errorf("closing the VM: %v", err)
		}
	})
	return &guest{vm: vm, disk: disk, netns: netns}
}

// tap is the tap name in the guest's namespace, or nil if there is none.
func (g *guest) tap(t *testing.T, name string) *netlink.Tuntap {
	t.Helper()
	l := zonenettest.Link(t, g.netns, name)
	if l == nil {
		return nil
	}
	tap, ok := l.(*netlink.Tuntap)
	if !ok {
		t.Fatalf("link %s is a %s, not a tap", name, l.Type())
	}
	return tap
}

func specJSON(disk string, pvpanic bool) json.RawMessage {
	comp := func(typ string, c map[string]any) map[string]any { return map[string]any{"type": typ, "component": c} }
	pci := func(dev int) map[string]any { return map[string]any{"bus": 0, "device": dev, "function": 0} }
	doc := map[string]any{
		"board": map[string]any{"cpus": 1, "memory_mb": 256, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": map[string]any{
			"boot-disk":         comp("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10)}),
			"boot-disk-backend": comp("file_storage_backend", map[string]any{"path": disk, "readonly": false, "block_size": 512}),
			"net0":              comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": pci(8)}),
			"net0-backend":      comp("virtio_network_backend", map[string]any{"vnic_name": spec.VNICName(mustMAC(testMAC))}),
			"com1":              comp("serial_port", map[string]any{"num": "com1"}),
			"pvpanic":           comp("qemu_pvpanic", map[string]any{"enable_isa": pvpanic}),
			"boot-settings":     comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": "boot-disk"}}}),
		},
	}
	b, _ := json.Marshal(doc)
	return b
}

var props = propolisapi.Properties{ID: "4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01", Name: "test", Description: "a test guest"}

// waitState waits for the VM to reach state, failing the test on any state
// in fail.
func (g *guest) waitState(t *testing.T, want propolisapi.InstanceState, fail ...propolisapi.InstanceState) propolisapi.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootWait)
	defer cancel()
	var gen uint64
	for {
		_, _, st, _ := g.vm.Instance()
		if st.State == want {
			return st
		}
		for _, f := range fail {
			if st.State == f {
				t.Fatalf("VM is %s (%s), waiting for %s", st.State, g.vm.detailNow(), want)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("VM is %s (%s) after %s, waiting for %s", st.State, g.vm.detailNow(), bootWait, want)
		}
		gen = st.Gen
		g.vm.Wait(ctx, gen)
	}
}

// waitSerial waits for a line holding want in com1's output from offset
// from, and returns the offset after it.
func (g *guest) waitSerial(t *testing.T, from uint64, want string) uint64 {
	t.Helper()
	con := g.vm.Console()
	deadline := time.Now().Add(bootWait)
	for {
		data, start := con.Read(from, 1<<20)
		if i := strings.Index(string(data), want); i >= 0 {
			return start + uint64(i+len(want))
		}
		if time.Now().After(deadline) {
			tail, _ := con.Read(0, 1<<20)
			t.Fatalf("no %q on com1 within %s; it printed: %q", want, bootWait, lastBytes(tail, 2000))
		}
		select {
		case <-con.Notify(con.End()):
		case <-time.After(time.Second):
		}
	}
}

func mustMAC(s string) net.HardwareAddr {
	mac, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return mac
}

func lastBytes(b []byte, n int) string { return string(b[max(0, len(b)-n):]) }

func (v *VM) detailNow() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.detail
}

func (g *guest) request(t *testing.T, r propolisapi.StateRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.vm.Request(ctx, r); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
}

func (g *guest) ensureAndRun(t *testing.T, pvpanic bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.vm.Ensure(ctx, props, specJSON(g.disk, pvpanic)); err != nil {
		t.Fatal(err)
	}
	if _, _, st, _ := g.vm.Instance(); st.State != propolisapi.StateCreating {
		t.Fatalf("after Ensure: %s, want Creating (paused until asked to run)", st.State)
	}
	g.request(t, propolisapi.RequestRun)
	g.waitState(t, propolisapi.StateRunning, propolisapi.StateFailed)
}

// The guest boots through OVMF from its disk, shows the MAC of its NIC,
// reboots, and stops at the power button: every state is QEMU's. QEMU
// runs unprivileged all along: as the VM's own ids, on every one of its
// real, effective and saved user and group ids, with no capabilities, in
// its sandbox; it boots from a disk file of root's alone that it is given,
// and its NIC is a tap the VM made, owned by QEMU's ids and gone with it.
func TestGuestLifecycle(t *testing.T) {
	g := newGuest(t)
	g.ensureAndRun(t, true)
	off := g.waitSerial(t, 0, testguest.ReadyPrefix+testMAC)

	pid := g.pid()
	uids, gids := strings.Fields(procStatus(t, pid, "Uid")), strings.Fields(procStatus(t, pid, "Gid"))
	ids := slices.Repeat(uids[:1], 4) // real, effective, saved, file system
	if ids[0] == "0" || !slices.Equal(uids, ids) || !slices.Equal(gids, ids) {
		t.Errorf("QEMU's uids %v, gids %v: want one id, not root's, for all of them", uids, gids)
	}
	// The VM's id, or the next free one up if a process held it: one of
	// the range's, wherever it lands.
	r := g.vm.opts.IDs
	if uid, err := strconv.ParseUint(ids[0], 10, 32); err != nil || uid < uint64(r.First) || uid > uint64(r.Last()) {
		t.Errorf("QEMU runs as uid %s, want one of the range %d to %d (%v)", ids[0], r.First, r.Last(), err)
	}
	if got := procStatus(t, pid, "Groups"); got != "" {
		t.Errorf("QEMU's supplementary groups %q, want none (TCG)", got)
	}
	for _, field := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if got := procStatus(t, pid, field); got != "0000000000000000" {
			t.Errorf("QEMU's %s %s, want none", field, got)
		}
	}
	if got := procStatus(t, pid, "Seccomp"); got != "2" {
		t.Errorf("seccomp mode %s, want 2 (QEMU's sandbox)", got)
	}
	if st, err := os.Stat(g.disk); err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("disk %s: %v, %v; want root's, 0600, as it was", g.disk, st.Mode(), err)
	}
	who := "QEMU runs as uid " + ids[0] + " gid " + ids[0]
	if d := g.vm.detailNow(); !strings.Contains(d, who) {
		t.Errorf("detail %q does not say %q", d, who)
	} else {
		t.Logf("detail: %s", d)
	}
	vnic := spec.VNICName(mustMAC(testMAC))
	tap := g.tap(t, vnic)
	if tap == nil {
		t.Fatalf("no tap %s while QEMU runs", vnic)
	}
	if strconv.FormatUint(uint64(tap.Owner), 10) != ids[0] || strconv.FormatUint(uint64(tap.Group), 10) != ids[0] || !tap.NonPersist {
		t.Errorf("tap %s owned by %d:%d, not persistent %v; want QEMU's ids, not persistent", vnic, tap.Owner, tap.Group, tap.NonPersist)
	}

	// Ensure again with the same spec changes nothing; another is refused.
	if err := g.vm.Ensure(context.Background(), props, specJSON(g.disk, true)); err != nil {
		t.Errorf("ensure again: %v", err)
	}
	if err := g.vm.Ensure(context.Background(), props, specJSON(g.disk, false)); err != propolisapi.ErrConflict {
		t.Errorf("ensure with another spec: %v, want ErrConflict", err)
	}

	// Input reaches the guest.
	if _, err := g.vm.Console().Write(context.Background(), []byte(testguest.CmdEcho+"hello-from-the-test\n")); err != nil {
		t.Fatal(err)
	}
	off = g.waitSerial(t, off, "\nhello-from-the-test")

	g.request(t, propolisapi.RequestReboot)
	g.waitState(t, propolisapi.StateRunning, propolisapi.StateFailed)
	off = g.waitSerial(t, off, testguest.ReadyPrefix+testMAC)

	g.request(t, propolisapi.RequestStop)
	g.waitState(t, propolisapi.StateDestroyed, propolisapi.StateFailed)
	g.waitSerial(t, off, testguest.PowerButton)
	if tap := g.tap(t, vnic); tap != nil {
		t.Errorf("tap %s left after the VM was destroyed: %+v", vnic, tap.Attrs())
	}
}

// A guest that powers itself off is stopped, then destroyed.
func TestGuestPowersOff(t *testing.T) {
	g := newGuest(t)
	g.ensureAndRun(t, true)
	g.waitSerial(t, 0, testguest.ReadyPrefix)
	if _, err := g.vm.Console().Write(context.Background(), []byte(testguest.CmdPoweroff+"\n")); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, propolisapi.StateDestroyed, propolisapi.StateFailed)
}

// A guest's panic (pvpanic) fails the VM and QEMU is gone.
func TestGuestPanics(t *testing.T) {
	g := newGuest(t)
	g.ensureAndRun(t, true)
	g.waitSerial(t, 0, testguest.ReadyPrefix)
	if _, err := g.vm.Console().Write(context.Background(), []byte(testguest.CmdPanic+"\n")); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, propolisapi.StateFailed)
	if d := g.vm.detailNow(); !strings.Contains(d, "panicked") {
		t.Errorf("detail %q does not say the guest panicked", d)
	}
	g.waitNoQEMU(t)
}

// QEMU killed behind the VM's back fails it at once, with how QEMU ended.
func TestQEMUKilled(t *testing.T) {
	g := newGuest(t)
	g.ensureAndRun(t, false)
	g.vm.mu.Lock()
	pid := g.vm.proc.PID()
	g.vm.mu.Unlock()
	if err := exec.Command("kill", "-9", fmt.Sprint(pid)).Run(); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, propolisapi.StateFailed)
	if d := g.vm.detailNow(); !strings.Contains(d, "killed") {
		t.Errorf("detail %q does not say QEMU was killed", d)
	}
}

func (g *guest) waitNoQEMU(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		g.vm.mu.Lock()
		proc := g.vm.proc
		g.vm.mu.Unlock()
		if proc == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU %d still runs", proc.PID())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A spec this sled cannot realise is refused before anything starts.
func TestEnsureRefusesBadSpec(t *testing.T) {
	vm := New(Options{Dir: t.TempDir(), Sled: spec.Sled{Threads: 2, FileRoots: []string{t.TempDir()}}})
	err := vm.Ensure(context.Background(), props, specJSON("/etc/shadow", false))
	var se *propolisapi.SpecError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "outside this sled's guest storage") {
		t.Fatalf("err = %v; want a SpecError about the file", err)
	}
	if _, _, _, ok := vm.Instance(); ok {
		t.Error("a refused spec made an instance")
	}
}

// QEMU is the VM's, not the request's that made it: the agent that asked
// for the instance dying (its connection gone, the request's context
// ended) while QEMU starts leaves the VM starting, not failed with QEMU
// killed.
func TestQEMUOutlivesTheRequestThatStartedIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := newGuestWith(t, func(o *Options) {
		start := o.Start
		o.Start = func(cmd *exec.Cmd) error {
			err := start(cmd)
			cancel() // the request ends as QEMU has just started
			return err
		}
	})
	if err := g.vm.Ensure(ctx, props, specJSON(g.disk, false)); err != nil {
		t.Fatalf("Ensure with its request ended as QEMU started: %v", err)
	}
	if _, _, st, _ := g.vm.Instance(); st.State != propolisapi.StateCreating {
		t.Fatalf("after Ensure: %s (%s), want Creating", st.State, g.vm.detailNow())
	}
	g.request(t, propolisapi.RequestRun)
	g.waitState(t, propolisapi.StateRunning, propolisapi.StateFailed)
}

// A run whose client went away as it asked (an agent killed meanwhile)
// still runs the guest: the request is the VM's once taken. Cut short
// between the state it set and QEMU's part, it would leave the guest
// starting and paused for good, a run asked again being a no-op.
func TestRunOutlivesTheRequestThatAskedIt(t *testing.T) {
	g := newGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := g.vm.Ensure(ctx, props, specJSON(g.disk, false)); err != nil {
		t.Fatal(err)
	}
	gone, stop := context.WithCancel(context.Background())
	stop()
	if err := g.vm.Request(gone, propolisapi.RequestRun); err != nil {
		t.Fatalf("run asked by a client already gone: %v", err)
	}
	g.waitState(t, propolisapi.StateRunning, propolisapi.StateFailed)
}
