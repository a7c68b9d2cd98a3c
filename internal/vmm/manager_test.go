package vmm_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// A hang detector: nothing here asserts how fast anything is.
const waitDeadline = 10 * time.Second

const vmmID = "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01"

// testIdentity is the sled's, as the instance properties carry it.
var testIdentity = vmm.SledIdentity{ID: "7b1e3c5a-0000-4000-8000-000000000001", Serial: "test-sled", Model: "i86pc"}

type env struct {
	t  *testing.T
	rt *sim.Runtime
	m  *vmm.Manager
}

func newEnv(t *testing.T, guest simguest.Options, opts vmm.Options) *env {
	t.Helper()
	rt := sim.New(sim.Options{})
	opts.PollWait = 100 * time.Millisecond
	opts.Identity = testIdentity
	m := vmm.New(rt, vmm.InProcessHost{Options: guest}, opts)
	rt.SetNotify(m.Poke)
	t.Cleanup(m.Close)
	return &env{t: t, rt: rt, m: m}
}

func registration() vmm.Registration {
	return vmmtest.Registration("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", "[fd00:1122:3344:101::1:5]:12400", map[string]any{"extra": "kept"})
}

func (e *env) register() vmm.Info {
	e.t.Helper()
	info, err := e.m.Register(vmmID, registration())
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// waitState waits for the VMM to reach state and returns its info.
func (e *env) waitState(state string) vmm.Info {
	e.t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		info, err := e.m.Get(vmmID)
		if err == nil && info.State.State == state {
			return info
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("VMM not %s after %s: %+v (%v)", state, waitDeadline, info, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// request asks for r, retrying while the service is not yet up.
func (e *env) request(r vmm.Request) vmm.Info {
	e.t.Helper()
	info, _, err := e.m.RequestState(context.Background(), vmmID, r)
	if err != nil {
		e.t.Fatalf("requesting %s: %v", r, err)
	}
	return info
}

// waitEvent waits for an event in the VMM's history.
func (e *env) waitEvent(event string) {
	e.t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		info, err := e.m.Get(vmmID)
		if err == nil && slices.ContainsFunc(info.History, func(l vmm.LogEntry) bool { return l.Event == event }) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %q in the VMM's history within %s: %+v (%v)", event, waitDeadline, info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) zoneExists() bool {
	_, ok := e.rt.Incarnation(zone.VMMNamePrefix + vmmID)
	return ok
}

func TestRegisterRunStopRoundTrip(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: 50 * time.Millisecond, StopTime: 50 * time.Millisecond}, vmm.Options{})
	first := e.register()
	if first.State.State != "starting" || first.Zone != "oxz_propolis-server_"+vmmID || !strings.Contains(string(first.Registration), `"extra":"kept"`) {
		t.Fatalf("registered %+v", first)
	}
	e.request(vmm.RequestRunning)
	running := e.waitState("running")
	if running.State.Gen <= first.State.Gen {
		t.Fatalf("gen %d after %d", running.State.Gen, first.State.Gen)
	}
	if !e.zoneExists() {
		t.Fatal("no zone for a running VMM")
	}
	e.request(vmm.RequestStopped)
	gone := e.waitState("destroyed")
	if gone.State.Gen <= running.State.Gen || e.zoneExists() {
		t.Fatalf("after stop: %+v, zone exists %v", gone, e.zoneExists())
	}
	if _, _, err := e.m.RequestState(context.Background(), vmmID, vmm.RequestRunning); !errors.Is(err, vmm.ErrInvalid) {
		t.Fatalf("running a destroyed VMM: %v", err)
	}
}

func TestRegisterTwiceUnknownAndConflicts(t *testing.T) {
	e := newEnv(t, simguest.Options{}, vmm.Options{})
	e.register()
	if _, err := e.m.Register(vmmID, registration()); err != nil {
		t.Fatalf("registering again: %v", err)
	}
	other := registration()
	other.PropolisAddr = netip.MustParseAddrPort("[fd00:1122:3344:101::1:6]:12400")
	if _, err := e.m.Register(vmmID, other); !errors.Is(err, vmm.ErrConflict) {
		t.Fatalf("registering with another address: %v", err)
	}
	if _, err := e.m.Get("00000000-0000-4000-8000-000000000000"); !errors.Is(err, vmm.ErrNotFound) {
		t.Fatalf("unknown VMM: %v", err)
	}
	e.waitState("starting")
	if _, _, err := e.m.RequestState(context.Background(), vmmID, vmm.RequestReboot); !errors.Is(err, vmm.ErrInvalid) || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("rebooting a VMM that never ran: %v", err)
	}
	// Once the service is up too, the refusal still names the VMM's state
	// (the service would refuse it in its own words).
	e.waitEvent("guest starting")
	if _, _, err := e.m.RequestState(context.Background(), vmmID, vmm.RequestReboot); !errors.Is(err, vmm.ErrInvalid) || !strings.Contains(err.Error(), "the VMM is starting and cannot reboot") {
		t.Fatalf("rebooting a VMM whose service is up but never ran: %v", err)
	}
	if _, err := e.m.Unregister(context.Background(), vmmID); err != nil {
		t.Fatal(err)
	}
	if e.zoneExists() {
		t.Fatal("zone left after unregister")
	}
	if _, err := e.m.Get(vmmID); !errors.Is(err, vmm.ErrNotFound) {
		t.Fatalf("after unregister: %v", err)
	}
}

// vanish deletes the VMM's zone behind the agent's back and waits for the
// VMM to fail, and for nothing of the zone to be left.
func (e *env) vanish(phase string) {
	e.t.Helper()
	t0 := time.Now()
	if !e.rt.Vanish(zone.VMMNamePrefix + vmmID) {
		e.t.Fatal("no zone to vanish")
	}
	info := e.waitState("failed")
	e.t.Logf("%s: failed %s after the zone vanished: %s", phase, time.Since(t0).Round(time.Millisecond), info.Detail)
	if !strings.Contains(info.Detail, phase) {
		e.t.Errorf("failure detail %q does not say %q", info.Detail, phase)
	}
	if e.zoneExists() {
		e.t.Errorf("zone left behind")
	}
}

func TestZoneVanishingBeforeTheServiceIsUp(t *testing.T) {
	e := newEnv(t, simguest.Options{}, vmm.Options{})
	if err := e.rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{vmmID: {Start: "hang"}}}); err != nil {
		t.Fatal(err)
	}
	e.register()
	deadline := time.Now().Add(waitDeadline)
	for !e.zoneExists() {
		if time.Now().After(deadline) {
			t.Fatal("zone never created")
		}
		time.Sleep(time.Millisecond)
	}
	e.vanish("before its service was up")
}

func TestZoneVanishingWhileStarting(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: time.Hour}, vmm.Options{})
	e.register()
	e.request(vmm.RequestRunning)
	waitDetail(t, e, "booting")
	e.vanish("while the guest was starting")
}

func TestZoneVanishingWhileRunning(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: 10 * time.Millisecond}, vmm.Options{})
	e.register()
	e.request(vmm.RequestRunning)
	e.waitState("running")
	e.vanish("while the guest was running")
}

// A guest whose state does not change is a quiet guest, not a lost
// service: its state monitor's long poll holds, and the VMM stays running
// well past ServiceLost.
func TestQuietGuestIsNotLost(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: 10 * time.Millisecond}, vmm.Options{ServiceLost: 300 * time.Millisecond})
	e.register()
	e.request(vmm.RequestRunning)
	e.waitState("running")
	time.Sleep(time.Second)
	if info, err := e.m.Get(vmmID); err != nil || info.State.State != "running" {
		t.Fatalf("a quiet running guest after 1s (ServiceLost 300ms): %+v, %v", info, err)
	}
}

func TestZoneVanishingWhileStopping(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: 10 * time.Millisecond, StopTime: time.Hour}, vmm.Options{StopGrace: time.Hour})
	e.register()
	e.request(vmm.RequestRunning)
	e.waitState("running")
	e.request(vmm.RequestStopped)
	e.waitState("stopping")
	e.vanish("while the guest was stopping")
}

func TestStopThatDoesNotFinishIsForced(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: 10 * time.Millisecond, StopTime: time.Hour}, vmm.Options{StopGrace: 200 * time.Millisecond})
	e.register()
	e.request(vmm.RequestRunning)
	e.waitState("running")
	e.request(vmm.RequestStopped)
	info := e.waitState("destroyed")
	if !strings.Contains(info.Detail, "forced") || e.zoneExists() {
		t.Fatalf("after an overdue stop: %+v, zone exists %v", info, e.zoneExists())
	}
}

func waitDetail(t *testing.T, e *env, detail string) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		info, _ := e.m.Get(vmmID)
		if info.Detail == detail {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("detail %q, want %q", info.Detail, detail)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A request the service takes changes the VMM's state, even where the
// state upstream names is the same (propolis's Creating and Starting are
// both "starting"): the answer carries the new state, not null.
func TestRequestToAServiceThatIsUpChangesTheState(t *testing.T) {
	e := newEnv(t, simguest.Options{BootTime: time.Hour}, vmm.Options{})
	e.register()
	deadline := time.Now().Add(waitDeadline)
	for {
		info, _ := e.m.Get(vmmID)
		up := false
		for _, h := range info.History {
			up = up || h.Event == "service up"
		}
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service never came up: %+v", info.History)
		}
		time.Sleep(5 * time.Millisecond)
	}
	before, _ := e.m.Get(vmmID)
	info, changed, err := e.m.RequestState(context.Background(), vmmID, vmm.RequestRunning)
	if err != nil || !changed || info.State.Gen <= before.State.Gen || info.State.State != "starting" {
		t.Fatalf("running asked of a service that is up: %+v changed %v (%v); before gen %d", info.State, changed, err, before.State.Gen)
	}
}

// recordDirs are the two record directories of a test, under dir: "a" and
// "b", as the agent's ledger-a and ledger-b.
func recordDirs(dir string) []string {
	return []string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}
}
