package qemuvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
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
	vm   *VM
	disk string
}

// newGuest makes a VM whose disk is a copy of the test guest, in a network
// namespace of the test's own, where QEMU makes its tap.
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
	if err := os.Link(testguest.TempCopy(t, image), disk); err != nil {
		t.Fatal(err)
	}
	netns := testNetns(t)
	opts := Options{
		Name:         "qemuvm-test",
		Dir:          t.TempDir(),
		FirmwareCode: code,
		FirmwareVars: vars,
		Accel:        qemu.TCG,
		// No NICs: the service finds each NIC's MAC in its vnic_name,
		// which the agent made.
		Sled:  spec.Sled{Threads: 2, FileRoots: []string{storage}},
		Start: func(cmd *exec.Cmd) error { return zonenet.StartIn(netns, cmd) },
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
	return &guest{vm: vm, disk: disk}
}

// testNetns makes a network namespace of the test's own, removed at
// cleanup (with the tap QEMU made in it).
func testNetns(t *testing.T) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "qvt-" + hex.EncodeToString(b[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name
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
// reboots, and stops at the power button: every state is QEMU's.
func TestGuestLifecycle(t *testing.T) {
	g := newGuest(t)
	g.ensureAndRun(t, true)
	off := g.waitSerial(t, 0, testguest.ReadyPrefix+testMAC)

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
