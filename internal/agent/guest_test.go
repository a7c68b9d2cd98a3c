package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/qemuvm"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// guestWait bounds a boot of the test guest through OVMF under TCG (about
// 20 s on a busy 2-vCPU machine): a hang detector, not a timing.
const guestWait = 3 * time.Minute

// guestSpec is vmmtest's spec with the test guest's disk, a file of the
// image directory, as its boot disk.
func guestSpec(disk string) map[string]any {
	s := vmmtest.Spec()
	comps(s)["boot-disk-backend"] = map[string]any{"type": "file_storage_backend", "component": map[string]any{"path": disk, "readonly": false, "block_size": 512}}
	return s
}

// linuxGuestAgent starts a Linux agent whose image directory holds a copy
// of the test guest, and returns it with the copy's path.
func linuxGuestAgent(t *testing.T) (*agent.Agent, string) {
	t.Helper()
	tag, prefix, dir, runDir := linuxEnv(t)
	image := testguest.Image(t) // skips without QEMU or OVMF
	images := t.TempDir()
	disk := filepath.Join(images, "boot.raw")
	if err := os.Rename(testguest.TempCopy(t, image), disk); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VMMImageDir: images, VMMAccel: "tcg", VMMQEMUIDs: testQEMUIDs, UnderlayIP: "fd00:1122:3344:1d0::1"})
	run(t, a)
	return a, disk
}

// serialHas waits for want in the guest's serial history from offset, read
// from the VMM's service at addr as Nexus reads it, and returns the offset
// after it.
func serialHas(t *testing.T, addr string, from uint64, want string) uint64 {
	t.Helper()
	c := propolisapi.NewClient(addr)
	deadline := time.Now().Add(guestWait)
	var seen string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		data, last, err := c.SerialHistory(ctx, propolisapi.SerialFromStart(from), 1<<20)
		cancel()
		if err == nil {
			seen = string(data)
			if i := strings.Index(seen, want); i >= 0 {
				return last - uint64(len(data)) + uint64(i+len(want))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no %q in the serial history within %s; it holds: %q", want, guestWait, seen[max(0, len(seen)-2000):])
	return 0
}

// testQEMUIDs is the range the tests' agents run QEMU in (0x60000000 on),
// not the default, to show it reaches the VMM services.
const testQEMUIDs = "1610612736:65536"

// TestLinuxGuestBootsRebootsAndStops is the outside check of a real guest:
// a VMM registered with the test guest's disk boots it through OVMF, whose
// console shows the guest's marker and the MAC local_config gave its NIC;
// it reboots, and stops at the power button, its zone torn down.
func TestLinuxGuestBootsRebootsAndStops(t *testing.T) {
	a, disk := linuxGuestAgent(t)
	const addr = "[fd00:1122:3344:1d0::9]:12400"
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, string(vmmtest.Body(testInstance, addr, guestSpec(disk), nil))); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
		t.Fatalf("run: %d %s", code, b)
	}
	waitVMM(t, a, "running")
	off := serialHas(t, addr, 0, testguest.ReadyPrefix+vmmtest.MAC)

	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"reboot"}}`); code != http.StatusOK {
		t.Fatalf("reboot: %d %s", code, b)
	}
	off = serialHas(t, addr, off, testguest.ReadyPrefix+vmmtest.MAC)
	waitVMM(t, a, "running")

	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"stopped"}}`); code != http.StatusOK {
		t.Fatalf("stop: %d %s", code, b)
	}
	waitVMMWithin(t, a, "destroyed", guestWait)
}

// TestLinuxGuestKilledFails: QEMU killed behind the agent's back fails the
// VMM, with QEMU's end in its detail, and its zone is removed.
func TestLinuxGuestKilledFails(t *testing.T) {
	a, disk := linuxGuestAgent(t)
	const addr = "[fd00:1122:3344:1d0::a]:12400"
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, string(vmmtest.Body(testInstance, addr, guestSpec(disk), nil))); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	waitVMM(t, a, "running")
	pids := qemuPIDs(t, disk)
	if len(pids) != 1 {
		t.Fatalf("QEMU processes of the guest's disk: %v, want one", pids)
	}
	// QEMU runs as a user of the range the agent was given.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	var uid uint64
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "Uid:" {
			uid, _ = strconv.ParseUint(f[1], 10, 32)
		}
	}
	r, err := qemuvm.ParseIDRange(testQEMUIDs)
	if err != nil {
		t.Fatal(err)
	}
	if uid < uint64(r.First) || uid > uint64(r.Last()) {
		t.Errorf("QEMU runs as uid %d, not one of --vmm-qemu-ids %s", uid, testQEMUIDs)
	}
	// Shut in: a mount namespace of its own (its network namespace, empty,
	// is qemuvm's tests'), its tasks limited.
	qemuNS, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pids[0]))
	ourNS, err2 := os.Readlink("/proc/self/ns/mnt")
	if err1 != nil || err2 != nil || qemuNS == ourNS {
		t.Errorf("QEMU's mount namespace %s, the host's %s (%v, %v): want one of its own", qemuNS, ourNS, err1, err2)
	}
	if d := vmmDetail(t, a); !strings.Contains(d, "tasks ≤ ") {
		t.Errorf("detail %q does not say QEMU's tasks are limited", d)
	}
	syscall.Kill(pids[0], syscall.SIGKILL)
	waitVMMWithin(t, a, "failed", guestWait)
	if got := vmmDetail(t, a); !strings.Contains(got, "signal: killed") {
		t.Errorf("detail %q does not say how QEMU ended", got)
	}
	waitFor(t, "no QEMU left", func() (bool, string) {
		p := qemuPIDs(t, disk)
		return len(p) == 0, fmt.Sprint("QEMU ", p)
	})
}

// waitVMMWithin is waitVMM with its own deadline.
func waitVMMWithin(t *testing.T, a *agent.Agent, state string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := vmmState(t, a)
		if st.VmmState.State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMM %s after %s, waiting for %s: %s", st.VmmState.State, d, state, vmmDetail(t, a))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// vmmDetail is what the agent's view says of the VMM.
func vmmDetail(t *testing.T, a *agent.Agent) string {
	t.Helper()
	code, b := call(t, a, http.MethodGet, "/agent/vmms", "")
	if code != http.StatusOK {
		t.Fatalf("GET /agent/vmms: %d %s", code, b)
	}
	var page api.VMMPage
	if err := json.Unmarshal(b, &page); err != nil {
		t.Fatal(err)
	}
	for _, v := range page.Items {
		if v.ID == testVMM {
			return v.Detail
		}
	}
	return "(no such VMM)"
}

// qemuPIDs are the QEMU processes whose command line holds all of what (a disk's
// path, guest=<propolis id>, the test's own data dir).
func qemuPIDs(t *testing.T, what ...string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmd), "qemu-system") && !slices.ContainsFunc(what, func(w string) bool { return !strings.Contains(string(cmd), w) }) {
			out = append(out, pid)
		}
	}
	return out
}

// TestLinuxGuestPowersItselfOff: a guest told on its serial console (the
// websocket Nexus proxies users' consoles to) to power off ends stopped,
// then destroyed, its zone torn down: the VMM's state is the guest's.
func TestLinuxGuestPowersItselfOff(t *testing.T) {
	a, disk := linuxGuestAgent(t)
	const addr = "[fd00:1122:3344:1d0::b]:12400"
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, string(vmmtest.Body(testInstance, addr, guestSpec(disk), nil))); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	waitVMM(t, a, "running")
	ctx, cancel := context.WithTimeout(t.Context(), guestWait)
	defer cancel()
	con, err := propolisapi.NewClient(addr).SerialConnect(ctx, propolisapi.SerialFromStart(0))
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	var seen []byte
	for !strings.Contains(string(seen), testguest.ReadyPrefix+vmmtest.MAC) {
		out, err := con.ReadOutput(ctx)
		if err != nil {
			t.Fatalf("reading the console: %v; it printed %q", err, seen)
		}
		seen = append(seen, out...)
	}
	if err := con.WriteInput(ctx, []byte(testguest.CmdPoweroff+"\n")); err != nil {
		t.Fatal(err)
	}
	waitVMMWithin(t, a, "destroyed", guestWait)
	if got := vmmDetail(t, a); !strings.Contains(got, "guest stopped") {
		t.Errorf("detail %q does not say the guest stopped", got)
	}
	if p := qemuPIDs(t, disk); len(p) != 0 {
		t.Errorf("QEMU %v still runs", p)
	}
}
