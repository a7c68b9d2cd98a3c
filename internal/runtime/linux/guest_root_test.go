package linux_test

import (
	"context"
	"encoding/json"
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

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// guestStandInIfAsked plays a VMM zone's service: `<binary> guest-stand-in
// <listen> … --guest-cgroup <name>` confines a long sleep, its stand-in
// for QEMU, in the guest cgroup it was given (as vmm-service confines
// QEMU), says where on stderr, and accepts TCP on listen. Stopped, it leaves
// the sleep behind, as a service killed before it quits QEMU would.
func guestStandInIfAsked() {
	if len(os.Args) < 3 || os.Args[1] != "guest-stand-in" {
		return
	}
	name := ""
	for i, a := range os.Args {
		if a == "--guest-cgroup" && i+1 < len(os.Args) {
			name = os.Args[i+1]
		}
	}
	g := guestcg.Make(guestcg.Detect(), name, guestcg.LimitsFor(guestcg.Size{CPUs: 1, MemoryMiB: 64}))
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not killed with the service's group
	if err := g.Start(nil)(cmd); err != nil {
		fmt.Fprintln(os.Stderr, "guest stand-in:", err)
		syscall.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "guest stand-in: sleep %d %s\n", cmd.Process.Pid, g)
	ln, err := net.Listen("tcp", os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "guest stand-in:", err)
		syscall.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			syscall.Exit(1)
		}
		c.Close()
	}
}

// vmmSpec is a VMM zone (as the VMM manager asks for one) with index i.
func vmmSpec(i int) zone.Spec {
	id, addr := uuid.NewString(), fmt.Sprintf("[fd00:1122:3344:1%02x::a]:12400", i)
	z := sledconfig.Zone{ID: id, ZoneType: sledconfig.ZoneType{Type: zone.VMMZoneType, Address: addr}}
	return zone.Spec{Name: zone.VMMNamePrefix + id, ID: id, Hash: "vmm:" + addr, Config: z}
}

// guestEnv is a runtime whose VMM zones run the guest stand-in, told the
// agent's arguments.
func guestEnv(t *testing.T) (*env, guestcg.Host) {
	t.Helper()
	e := newEnvWith(t, map[string]linux.Image{zone.VMMZoneType: {Command: []string{"{agent}", "guest-stand-in", "{listen}"}}},
		func(o *linux.Options) { o.VMMArgs = func() []string { return []string{"--backend", "qemu"} } })
	host := guestcg.Detect()
	if host.V2 == "" && len(host.V1) == 0 {
		t.Skip("no cgroup file system is mounted")
	}
	// Whatever guest cgroup of the tag a failed test left: before the
	// env's cleanup, which removes the tag's directories.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		guests, _ := host.Guests(e.tag)
		for z := range guests {
			if _, err := host.Remove(ctx, guestcg.Name(e.tag, z)); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return e, host
}

// guestOf returns the stand-in's sleep in the zone's guest cgroup, checking
// that the zone's service was told its name, and that the sleep is in each
// of its directories.
func guestOf(t *testing.T, e *env, host guestcg.Host, s zone.Spec) (int, []string) {
	t.Helper()
	name := guestcg.Name(e.tag, s.Name)
	raw, err := os.ReadFile(filepath.Join(serviceDir(t, e, s), "run.args"))
	if err != nil {
		t.Fatal(err)
	}
	var args struct {
		Argv []string `json:"argv"`
	}
	if err := json.Unmarshal(raw, &args); err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(args.Argv, "--guest-cgroup"); i < 0 || i+1 == len(args.Argv) || args.Argv[i+1] != name {
		t.Fatalf("the service was not given --guest-cgroup %s: %q", name, args.Argv)
	}
	var dirs []string
	var pids []string
	for _, d := range host.Dirs(name) {
		b, err := os.ReadFile(filepath.Join(d.Path, "cgroup.procs"))
		if err != nil {
			t.Fatalf("guest cgroup: %v", err)
		}
		dirs = append(dirs, d.Path)
		pids = append(pids, strings.Fields(string(b))...)
	}
	slices.Sort(pids)
	pids = slices.Compact(pids)
	if len(pids) != 1 {
		t.Fatalf("guest cgroups %v hold %v, want the stand-in's sleep alone", dirs, pids)
	}
	pid, _ := strconv.Atoi(pids[0])
	return pid, dirs
}

// A VMM zone's service is told its guest's cgroup; Destroy kills what runs
// in it, whatever the service left, and removes it from every hierarchy;
// Sweep does the same for a zone whose root is gone, and leaves a live
// zone's alone.
func TestGuestCgroupGoesWithItsZone(t *testing.T) {
	e, host := guestEnv(t)
	live, dead, destroyed := vmmSpec(0x61), vmmSpec(0x62), vmmSpec(0x63)
	for _, s := range []zone.Spec{live, dead, destroyed} {
		e.ensure(s)
	}
	livePID, liveDirs := guestOf(t, e, host, live)
	deadPID, deadDirs := guestOf(t, e, host, dead)
	pid, dirs := guestOf(t, e, host, destroyed)
	t.Logf("guest cgroup of %s: %v", destroyed.Name, dirs)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := e.rt.Destroy(ctx, destroyed.Name); err != nil {
		t.Fatal(err)
	}
	if running(pid) {
		t.Errorf("the guest's process %d survived Destroy", pid)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s left after Destroy", d)
		}
	}

	// dead's root removed: an orphan, its guest cgroup with it.
	if err := os.RemoveAll(filepath.Join(e.dir, "pools", "nopool", "zones", dead.Name)); err != nil {
		t.Fatal(err)
	}
	lines, err := e.rt.Sweep(ctx)
	if err != nil {
		t.Fatalf("Sweep: %v (removed %q)", err, lines)
	}
	for _, d := range deadDirs {
		if !slices.Contains(lines, "cgroup "+d) {
			t.Errorf("Sweep did not say it removed %s: %q", d, lines)
		}
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s left after Sweep", d)
		}
	}
	if running(deadPID) {
		t.Errorf("the orphan guest's process %d survived Sweep", deadPID)
	}
	for _, l := range lines {
		if strings.Contains(l, live.Name) {
			t.Errorf("Sweep removed a part of the live zone: %s", l)
		}
	}
	if !running(livePID) {
		t.Errorf("the live zone's guest %d was killed by Sweep", livePID)
	}
	for _, d := range liveDirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("live zone's guest cgroup: %v", err)
		}
	}
}
