package guestcg

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// This machine's mounts (a hybrid layout: v1 hierarchies for the
// controllers, a cgroup2 with hugetlb alone), a pure v2 host's, and a v1
// host's with cpu and cpuacct mounted together.
const (
	hybridMountinfo = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	v2Mountinfo = `22 1 0:21 / / rw - ext4 /dev/sda1 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	v1Mountinfo = `36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory
`
)

func TestParseMountinfo(t *testing.T) {
	for _, tt := range []struct {
		name, info string
		want       Host
	}{
		{"hybrid", hybridMountinfo, Host{V2: "/sys/fs/cgroup/unified", V1: map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu", "pids": "/sys/fs/cgroup/pids"}}},
		{"v2", v2Mountinfo, Host{V2: "/sys/fs/cgroup", V1: map[string]string{}}},
		{"v1", v1Mountinfo, Host{V1: map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct"}}},
		{"none", "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n", Host{V1: map[string]string{}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := parseMountinfo(strings.NewReader(tt.info))
			if got.V2 != tt.want.V2 || !mapsEqual(got.V1, tt.want.V1) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestValidName(t *testing.T) {
	good := Name("zt0a1b2c", "oxz_propolis-server_4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01")
	if good != "sled-agent/zt0a1b2c/oxz_propolis-server_4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01.guest" {
		t.Errorf("Name = %q", good)
	}
	if err := ValidName(good); err != nil {
		t.Errorf("ValidName(%q): %v", good, err)
	}
	for _, bad := range []string{
		"", ".guest", "sled-agent/t/.guest", "sled-agent/t/z", "/sled-agent/t/z.guest", "sled-agent/../z.guest",
		"sled-agent/t/../z.guest", "other/t/z.guest", "sled-agent/t/x/z.guest", "sled-agent/t/z y.guest", "sled-agent//z.guest",
		"sled-agent/t/..guest",
	} {
		if err := ValidName(bad); err == nil {
			t.Errorf("ValidName(%q) accepted it", bad)
		}
	}
}

func TestLimitsFor(t *testing.T) {
	const gib = 1 << 30
	for _, tt := range []struct {
		name    string
		size    Size
		memMiB  int64
		quotaMs int64
	}{
		// 256 + 256 (QEMU) + 16 (a vCPU) + 8 (1/32) + 1024 (the cache).
		{"TCG, 256 MiB, 1 vCPU, 24 GiB host", Size{CPUs: 1, MemoryMiB: 256, TCG: true, HostMemory: 24 * gib}, 1560, 125},
		// The cache is an eighth of a 2 GiB host.
		{"TCG, small host", Size{CPUs: 1, MemoryMiB: 256, TCG: true, HostMemory: 2 * gib}, 792, 125},
		{"TCG, host unknown", Size{CPUs: 2, MemoryMiB: 512, TCG: true}, 512 + 256 + 32 + 16 + 1024, 225},
		// 16384 + 256 + 128 + 512.
		{"KVM, 16 GiB, 8 vCPUs", Size{CPUs: 8, MemoryMiB: 16384}, 17280, 825},
		{"KVM, 1 GiB, 1 vCPU", Size{CPUs: 1, MemoryMiB: 1024}, 1024 + 256 + 16 + 32, 125},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := LimitsFor(tt.size)
			if got := l.MemoryBytes; got != tt.memMiB<<20 {
				t.Errorf("memory %d MiB (%d), want %d MiB", got>>20, got, tt.memMiB)
			}
			if l.CPUPeriod != 100*time.Millisecond || l.CPUQuota != time.Duration(tt.quotaMs)*time.Millisecond {
				t.Errorf("CPU %v per %v, want %dms per 100ms", l.CPUQuota, l.CPUPeriod, tt.quotaMs)
			}
			// A guest that uses all its memory leaves QEMU at least
			// the 44 MiB measured (its own and the page cache), five
			// times over.
			if over := l.MemoryBytes - tt.size.MemoryMiB<<20; over < 5*44<<20 {
				t.Errorf("only %d MiB over the guest's memory", over>>20)
			}
		})
	}
	if p := LimitsFor(Size{CPUs: 8, MemoryMiB: 1024}).Pids; p != 256+8 {
		t.Errorf("tasks of 8 vCPUs: %d, want %d", p, 256+8)
	}
	if s := LimitsFor(Size{CPUs: 1, MemoryMiB: 256, TCG: true, HostMemory: 24 * gib}).String(); s != "memory ≤ 1560 MiB, CPU ≤ 1.25, tasks ≤ 257" {
		t.Errorf("String() = %q", s)
	}
}

func TestHostMemory(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo")
	}
	if m := HostMemory(); m < 64<<20 {
		t.Errorf("HostMemory() = %d", m)
	}
}

// fakeTree is a cgroup file system in a temporary directory: the files
// the kernel would have made, with their contents, and a transcript of
// every write.
type fakeTree struct {
	t      *testing.T
	root   string
	writes []string // "path relative to root: data"
}

func newFakeTree(t *testing.T, files map[string]string) *fakeTree {
	f := &fakeTree{t: t, root: t.TempDir()}
	for name, data := range files {
		p := filepath.Join(f.root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fakeTree) path(rel string) string {
	if rel == "" {
		return ""
	}
	return filepath.Join(f.root, rel)
}

// host is a Host whose hierarchies are in the tree, writes recorded.
func (f *fakeTree) host(v2, memory, cpu, pids string) Host {
	h := Host{V2: f.path(v2), V1: map[string]string{}}
	for c, dir := range map[string]string{"memory": memory, "cpu": cpu, "pids": pids} {
		if dir != "" {
			h.V1[c] = f.path(dir)
		}
	}
	h.write = func(path, data string) error {
		rel, _ := filepath.Rel(f.root, path)
		f.writes = append(f.writes, rel+": "+data)
		return writeFile(path, data)
	}
	return h
}

func (f *fakeTree) read(rel string) string {
	b, err := os.ReadFile(filepath.Join(f.root, rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

const (
	tag   = "zt0a1b2c"
	zone  = "oxz_propolis-server_4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01"
	guest = "sled-agent/" + tag + "/" + zone + ".guest"
)

var testLimits = LimitsFor(Size{CPUs: 1, MemoryMiB: 256, TCG: true, HostMemory: 24 << 30})

// v2Guest is a v2 guest cgroup's files, as the kernel makes them once its
// parent has the memory and cpu controllers enabled.
func v2Guest(dir string, m map[string]string) map[string]string {
	for _, f := range []string{"cgroup.procs", "cgroup.kill", "memory.max", "memory.events", "cpu.max", "pids.max"} {
		m[dir+"/"+f] = ""
	}
	return m
}

// On a pure v2 host QEMU's cgroup is a sibling of the zone's, the
// controllers enabled from the root down (where they are not already), and
// the limits in memory.max, cpu.max and pids.max.
func TestMakeV2(t *testing.T) {
	f := newFakeTree(t, v2Guest("cg/"+guest, map[string]string{
		"cg/cgroup.controllers":                               "cpuset cpu io memory hugetlb pids rdma misc\n",
		"cg/cgroup.subtree_control":                           "cpu memory pids\n", // systemd's
		"cg/sled-agent/cgroup.subtree_control":                "\n",
		"cg/sled-agent/" + tag + "/cgroup.subtree_control":    "memory\n", // another guest's
		"cg/sled-agent/" + tag + "/" + zone + "/cgroup.procs": "12\n",     // the zone's runsv
	}))
	g := Make(f.host("cg", "", "", ""), guest, testLimits)
	want := []string{
		"cg/sled-agent/cgroup.subtree_control: +memory",
		"cg/" + guest + "/memory.max: 1635778560",
		"cg/sled-agent/cgroup.subtree_control: +cpu",
		"cg/sled-agent/" + tag + "/cgroup.subtree_control: +cpu",
		"cg/" + guest + "/cpu.max: 125000 100000",
		"cg/sled-agent/cgroup.subtree_control: +pids",
		"cg/sled-agent/" + tag + "/cgroup.subtree_control: +pids",
		"cg/" + guest + "/pids.max: 257",
	}
	if !slices.Equal(f.writes, want) {
		t.Errorf("writes:\n%s\nwant:\n%s", strings.Join(f.writes, "\n"), strings.Join(want, "\n"))
	}
	if got, want := g.String(), "confined in cgroup "+guest+": memory ≤ 1560 MiB (cgroup v2), CPU ≤ 1.25 (cgroup v2), tasks ≤ 257 (cgroup v2)"; got != want {
		t.Errorf("String() = %q\nwant %q", got, want)
	}

	// QEMU is born in the cgroup: nothing to write after it starts.
	f.writes = nil
	cmd := exec.Command("qemu")
	if err := g.Start(fakeStart(4242))(cmd); err != nil {
		t.Fatal(err)
	}
	if a := cmd.SysProcAttr; a == nil || !a.UseCgroupFD || a.CgroupFD <= 0 {
		t.Errorf("SysProcAttr %+v: want QEMU cloned into its cgroup", a)
	}
	if len(f.writes) != 0 {
		t.Errorf("writes after the start: %q", f.writes)
	}

	// The kill by the memory limit is read from memory.events.
	if k := g.MemoryKill(); k != "" {
		t.Errorf("MemoryKill() = %q before any kill", k)
	}
	os.WriteFile(f.path("cg/"+guest+"/memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n"), 0o644)
	if k := g.MemoryKill(); !strings.Contains(k, "memory limit of 1560 MiB") || !strings.Contains(k, "oom_kill 1 in "+f.path("cg/"+guest+"/memory.events")) {
		t.Errorf("MemoryKill() = %q", k)
	}
}

// fakeStart "starts" a command as the process pid, which it is not.
func fakeStart(pid int) func(*exec.Cmd) error {
	return func(cmd *exec.Cmd) error {
		cmd.Process = &os.Process{Pid: pid}
		return nil
	}
}

// On a hybrid host (this machine's kind: v2 holds neither memory, cpu nor
// pids) QEMU is born in its v2 cgroup, which holds no limit, and its pid is
// written into its v1 cgroups of memory, cpu and pids, which hold them.
func TestMakeHybrid(t *testing.T) {
	f := newFakeTree(t, map[string]string{
		"unified/cgroup.controllers":                 "hugetlb\n",
		"unified/cgroup.subtree_control":             "\n",
		"unified/" + guest + "/cgroup.procs":         "",
		"memory/" + guest + "/cgroup.procs":          "",
		"memory/" + guest + "/memory.limit_in_bytes": "9223372036854771712\n",
		"memory/" + guest + "/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
		"cpu/" + guest + "/cgroup.procs":             "",
		"cpu/" + guest + "/cpu.cfs_period_us":        "100000\n",
		"cpu/" + guest + "/cpu.cfs_quota_us":         "-1\n",
		"pids/" + guest + "/cgroup.procs":            "",
		"pids/" + guest + "/pids.max":                "max\n",
	})
	g := Make(f.host("unified", "memory", "cpu", "pids"), guest, testLimits)
	want := []string{
		"memory/" + guest + "/memory.limit_in_bytes: 1635778560",
		"cpu/" + guest + "/cpu.cfs_period_us: 100000",
		"cpu/" + guest + "/cpu.cfs_quota_us: 125000",
		"pids/" + guest + "/pids.max: 257",
	}
	if !slices.Equal(f.writes, want) {
		t.Errorf("writes:\n%s\nwant:\n%s", strings.Join(f.writes, "\n"), strings.Join(want, "\n"))
	}
	if got, want := g.String(), "confined in cgroup "+guest+": memory ≤ 1560 MiB (cgroup v1), CPU ≤ 1.25 (cgroup v1), tasks ≤ 257 (cgroup v1)"; got != want {
		t.Errorf("String() = %q\nwant %q", got, want)
	}
	f.writes = nil
	cmd := exec.Command("qemu")
	if err := g.Start(fakeStart(4242))(cmd); err != nil {
		t.Fatal(err)
	}
	if a := cmd.SysProcAttr; a == nil || !a.UseCgroupFD {
		t.Errorf("SysProcAttr %+v: want QEMU cloned into its v2 cgroup", a)
	}
	want = []string{"memory/" + guest + "/cgroup.procs: 4242", "cpu/" + guest + "/cgroup.procs: 4242", "pids/" + guest + "/cgroup.procs: 4242"}
	if !slices.Equal(f.writes, want) {
		t.Errorf("writes after the start: %q, want %q", f.writes, want)
	}
	if k := g.MemoryKill(); k != "" {
		t.Errorf("MemoryKill() = %q before any kill", k)
	}
	os.WriteFile(f.path("memory/"+guest+"/memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644)
	if k := g.MemoryKill(); !strings.Contains(k, "oom_kill 2 in ") || !strings.Contains(k, "memory.oom_control") {
		t.Errorf("MemoryKill() = %q", k)
	}
}

// What cannot be done is said, and QEMU is not started: confinement
// fails closed.
func TestMakeFailsClosed(t *testing.T) {
	// refused checks that g's Start refuses to start QEMU, saying want.
	refused := func(t *testing.T, g *Group, want string) {
		t.Helper()
		started := false
		err := g.Start(func(*exec.Cmd) error { started = true; return nil })(exec.Command("qemu"))
		if !errors.Is(err, ErrNotConfined) || started || !strings.Contains(err.Error(), want) {
			t.Errorf("start: %v (QEMU started: %v), want %v saying %q", err, started, ErrNotConfined, want)
		}
	}
	t.Run("no cgroups", func(t *testing.T) {
		f := newFakeTree(t, nil)
		g := Make(f.host("", "", "", ""), guest, testLimits)
		want := "not confined; memory not limited: no cgroup hierarchy holds the memory controller (there is no cgroup v2 hierarchy); " +
			"CPU not limited: no cgroup hierarchy holds the cpu controller (there is no cgroup v2 hierarchy); " +
			"tasks not limited: no cgroup hierarchy holds the pids controller (there is no cgroup v2 hierarchy)"
		if got := g.String(); got != want {
			t.Errorf("String() = %q\nwant %q", got, want)
		}
		refused(t, g, "memory not limited: no cgroup hierarchy holds the memory controller")
		if len(f.writes) != 0 || g.MemoryKill() != "" {
			t.Errorf("writes %q, MemoryKill %q", f.writes, g.MemoryKill())
		}
	})
	t.Run("none", func(t *testing.T) {
		g := None("no guest cgroup given")
		if got := g.String(); got != "not confined: no guest cgroup given" {
			t.Errorf("String() = %q", got)
		}
		refused(t, g, "no guest cgroup given")
	})
	t.Run("no name", func(t *testing.T) {
		f := newFakeTree(t, nil)
		g := Make(f.host("cg", "", "", ""), "", testLimits)
		if got := g.String(); !strings.HasPrefix(got, "not confined: guest cgroup \"\": want sled-agent/<tag>/<zone>.guest") {
			t.Errorf("String() = %q", got)
		}
		refused(t, g, "want sled-agent/<tag>/<zone>.guest")
	})
	t.Run("v2 without pids", func(t *testing.T) {
		f := newFakeTree(t, v2Guest("cg/"+guest, map[string]string{
			"cg/cgroup.controllers":                            "memory cpu\n",
			"cg/cgroup.subtree_control":                        "memory cpu\n",
			"cg/sled-agent/cgroup.subtree_control":             "memory cpu\n",
			"cg/sled-agent/" + tag + "/cgroup.subtree_control": "memory cpu\n",
		}))
		g := Make(f.host("cg", "", "", ""), guest, testLimits)
		want := "confined in cgroup " + guest + ": memory ≤ 1560 MiB (cgroup v2), CPU ≤ 1.25 (cgroup v2); tasks not limited: no cgroup hierarchy holds the pids controller (cgroup v2 offers cpu memory)"
		if got := g.String(); got != want {
			t.Errorf("String() = %q\nwant %q", got, want)
		}
		refused(t, g, "pids not limited: no cgroup hierarchy holds the pids controller")
	})
	t.Run("controller not enabled", func(t *testing.T) {
		// The tag's directory lacks its subtree_control: as if it
		// could not be written.
		files := v2Guest("cg/"+guest, map[string]string{
			"cg/cgroup.controllers":                "cpu memory pids\n",
			"cg/cgroup.subtree_control":            "cpu memory pids\n",
			"cg/sled-agent/cgroup.subtree_control": "cpu memory pids\n",
		})
		f := newFakeTree(t, files)
		g := Make(f.host("cg", "", "", ""), guest, testLimits)
		got := g.String()
		if !strings.HasPrefix(got, "not confined; memory not limited: cgroup v2: enabling the memory controller in "+f.path("cg/sled-agent/"+tag)) ||
			!strings.Contains(got, "CPU not limited: cgroup v2: enabling the cpu controller") {
			t.Errorf("String() = %q", got)
		}
		refused(t, g, "enabling the memory controller")
	})
	t.Run("v1 pid not written", func(t *testing.T) {
		// The memory hierarchy's directory has no cgroup.procs: QEMU,
		// started (a real process here, which is killed), cannot be put
		// there.
		f := newFakeTree(t, map[string]string{
			"memory/" + guest + "/memory.limit_in_bytes": "",
			"cpu/" + guest + "/cgroup.procs":             "",
			"cpu/" + guest + "/cpu.cfs_period_us":        "",
			"cpu/" + guest + "/cpu.cfs_quota_us":         "",
			"pids/" + guest + "/cgroup.procs":            "",
			"pids/" + guest + "/pids.max":                "",
		})
		g := Make(f.host("", "memory", "cpu", "pids"), guest, testLimits)
		if got := g.String(); !strings.HasPrefix(got, "confined in cgroup "+guest+": memory ≤ 1560 MiB (cgroup v1)") {
			t.Errorf("String() = %q", got)
		}
		cmd := exec.Command("sleep", "60")
		err := g.Start(nil)(cmd)
		if !errors.Is(err, ErrNotConfined) || !strings.Contains(err.Error(), "QEMU could not be put in "+f.path("memory/"+guest)) {
			t.Errorf("start: %v", err)
		}
		if cmd.ProcessState == nil || cmd.ProcessState.Success() {
			t.Errorf("the process not placed was not killed and reaped: %v", cmd.ProcessState)
		}
	})
	t.Run("v2 directory not made", func(t *testing.T) {
		f := newFakeTree(t, map[string]string{
			"cg/sled-agent": "a file, where a directory should be",
			"memory/" + guest + "/memory.limit_in_bytes": "",
			"cpu/" + guest + "/cpu.cfs_period_us":        "",
			"cpu/" + guest + "/cpu.cfs_quota_us":         "",
			"pids/" + guest + "/pids.max":                "",
		})
		g := Make(f.host("cg", "memory", "cpu", "pids"), guest, testLimits)
		if got := g.String(); !strings.Contains(got, "; not born in its cgroup: cgroup v2: ") {
			t.Errorf("String() = %q", got)
		}
		refused(t, g, "cgroup v2: ")
	})
}

// A failed start is the start's error, saying where QEMU was to be born.
func TestStartFails(t *testing.T) {
	f := newFakeTree(t, map[string]string{
		"unified/cgroup.controllers":                 "hugetlb\n",
		"memory/" + guest + "/memory.limit_in_bytes": "",
		"cpu/" + guest + "/cpu.cfs_period_us":        "",
		"cpu/" + guest + "/cpu.cfs_quota_us":         "",
		"pids/" + guest + "/pids.max":                "",
	})
	g := Make(f.host("unified", "memory", "cpu", "pids"), guest, testLimits)
	err := g.Start(func(*exec.Cmd) error { return os.ErrPermission })(exec.Command("qemu"))
	if err == nil || !strings.Contains(err.Error(), "in cgroup "+f.path("unified/"+guest)) {
		t.Errorf("err = %v", err)
	}
}

// Guests finds every guest cgroup of a tag, in every hierarchy, and
// nothing else; Remove removes a guest's (here, empty directories: the
// real kernel's removal is the root tests'); RemoveEmpty leaves what holds
// another tag's.
func TestGuestsAndRemove(t *testing.T) {
	other := "sled-agent/" + tag + "/oxz_propolis-server_00000000-0000-4000-8000-000000000001.guest"
	f := newFakeTree(t, nil)
	for _, d := range []string{"unified/" + guest, "memory/" + guest, "cpu/" + guest, "memory/" + other,
		"unified/sled-agent/" + tag + "/" + zone, "unified/sled-agent/othertag/x.guest"} {
		os.MkdirAll(f.path(d), 0o755)
	}
	h := f.host("unified", "memory", "cpu", "")
	got, err := h.Guests(tag)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		zone: {f.path("unified/" + guest), f.path("memory/" + guest), f.path("cpu/" + guest)},
		"oxz_propolis-server_00000000-0000-4000-8000-000000000001": {f.path("memory/" + other)},
	}
	if len(got) != len(want) || !slices.Equal(got[zone], want[zone]) {
		t.Errorf("Guests = %q, want %q", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	removed, err := h.Remove(ctx, guest)
	if err != nil || !slices.Equal(removed, want[zone]) {
		t.Errorf("Remove: %q, %v; want %q", removed, err, want[zone])
	}
	if removed, err := h.Remove(ctx, guest); err != nil || len(removed) != 0 {
		t.Errorf("Remove again: %q, %v", removed, err)
	}
	if _, err := h.Remove(ctx, "sled-agent/../x.guest"); err == nil {
		t.Error("Remove of a bad name worked")
	}
	h.RemoveEmpty(tag)
	for _, d := range []string{"memory/" + other, "unified/sled-agent/othertag/x.guest"} {
		if _, err := os.Stat(f.path(d)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	for _, d := range []string{"cpu/sled-agent"} {
		if _, err := os.Stat(f.path(d)); err == nil {
			t.Errorf("%s is left", d)
		}
	}
}
