package vmm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
)

// An unregister racing a state request (and the monitor's own updates)
// wins: once Unregister has returned, the VMM's record is gone and stays
// gone, and a restarted agent does not bring the VMM back.
func TestUnregisteredVMMStaysGone(t *testing.T) {
	dir := t.TempDir()
	rt := sim.New(sim.Options{})
	m := vmm.New(rt, vmm.InProcessHost{Options: simguest.Options{BootTime: time.Millisecond, StopTime: time.Millisecond}},
		vmm.Options{RecordDirs: recordDirs(dir), PollWait: 20 * time.Millisecond, Identity: testIdentity})
	rt.SetNotify(m.Poke)
	defer m.Close()
	const tries = 60
	resurrected := 0
	for i := range tries {
		id := fmt.Sprintf("%08x-5555-4000-8000-000000000000", i)
		if _, err := m.Register(id, registration()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.RequestState(context.Background(), id, vmm.RequestRunning); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(waitDeadline)
		for info, _ := m.Get(id); info.State.State != "running"; info, _ = m.Get(id) {
			if time.Now().After(deadline) {
				t.Fatalf("try %d: VMM not running: %+v", i, info)
			}
			time.Sleep(time.Millisecond)
		}
		// State requests, and the monitor following the guest as it stops,
		// race the unregister.
		var wg sync.WaitGroup
		for _, r := range []vmm.Request{vmm.RequestStopped, vmm.RequestReboot, vmm.RequestStopped} {
			wg.Go(func() {
				for {
					if _, _, err := m.RequestState(context.Background(), id, r); errors.Is(err, vmm.ErrNotFound) {
						return
					}
				}
			})
		}
		time.Sleep(time.Duration(i%4) * 500 * time.Microsecond)
		if _, err := m.Unregister(context.Background(), id); err != nil {
			t.Fatalf("try %d: unregister: %v", i, err)
		}
		// Unregister has answered: from now on nothing writes the record.
		wg.Wait()
		time.Sleep(5 * time.Millisecond) // what a late write would need to land
		if _, err := os.Stat(filepath.Join(dir, "a", id+".json")); err == nil {
			resurrected++
		}
	}
	m.Close()
	if resurrected > 0 {
		t.Errorf("%d of %d unregistered VMMs have a record again", resurrected, tries)
	}
	fresh := vmm.New(rt, vmm.InProcessHost{}, vmm.Options{RecordDirs: recordDirs(dir), Identity: testIdentity})
	defer fresh.Close()
	if n, err := fresh.Resume(); n != 0 || err != nil {
		t.Errorf("a restarted manager resumed %d unregistered VMMs (%v): %+v", n, err, fresh.List())
	}
}

// A VMM registered at the largest generation follows its guest all the
// same; its generation stays at the bound (upstream's i64::MAX) instead
// of passing it, and its history says why.
func TestGenerationStopsAtItsMaximum(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, simguest.Options{BootTime: time.Millisecond}, vmm.Options{RecordDirs: recordDirs(dir), Identity: testIdentity})
	reg := registration()
	reg.Initial.Gen = vmm.MaxGen
	if _, err := e.m.Register(vmmID, reg); err != nil {
		t.Fatal(err)
	}
	e.request(vmm.RequestRunning)
	info := e.waitState("running")
	if info.State.Gen != vmm.MaxGen {
		t.Fatalf("gen %d, want it to stay at %d", info.State.Gen, uint64(vmm.MaxGen))
	}
	exhausted := false
	for _, h := range info.History {
		exhausted = exhausted || h.Event == "generation exhausted"
	}
	if !exhausted {
		t.Errorf("history does not say the generation is exhausted: %+v", info.History)
	}
	// Kept as it is, and adopted as it is.
	e.m.Close()
	m2 := vmm.New(e.rt, vmm.InProcessHost{}, vmm.Options{RecordDirs: recordDirs(dir), Identity: testIdentity})
	defer m2.Close()
	if _, err := m2.Resume(); err != nil {
		t.Fatal(err)
	}
	if got, err := m2.Get(vmmID); err != nil || got.State.Gen != vmm.MaxGen {
		t.Fatalf("after a restart: gen %d (%v)", got.State.Gen, err)
	}
}

// A state asked for before the VMM's service is up is kept with the VMM,
// so that an agent killed before handing it over loses nothing it
// answered; once handed over it is no longer kept.
func TestPendingRequestIsKept(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, simguest.Options{BootTime: time.Millisecond}, vmm.Options{RecordDirs: recordDirs(dir)})
	if err := e.rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{vmmID: {Start: "hang"}}}); err != nil {
		t.Fatal(err)
	}
	e.register()
	e.request(vmm.RequestRunning)
	rec, err := os.ReadFile(filepath.Join(dir, "a", vmmID+".json"))
	if err != nil || !strings.Contains(string(rec), `"pending":"running"`) {
		t.Fatalf("the VMM's record after a request it could not hand over yet: %s (%v)", rec, err)
	}
	dir2 := t.TempDir()
	e2 := newEnv(t, simguest.Options{BootTime: time.Millisecond}, vmm.Options{RecordDirs: recordDirs(dir2)})
	e2.register()
	e2.request(vmm.RequestRunning)
	e2.waitState("running")
	// Handed over, the request is dropped from the record (soon after
	// the service took it: the wait is only a hang detector).
	deadline := time.Now().Add(waitDeadline)
	for {
		rec, err := os.ReadFile(filepath.Join(dir2, "a", vmmID+".json"))
		if err == nil && !strings.Contains(string(rec), `"pending"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record of a VMM whose request was handed over: %s (%v)", rec, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A stop the guest ignores is forced within StopGrace even when the agent
// was restarted meanwhile: the grace is kept with the VMM.
func TestStopOutlivesARestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, simguest.Options{BootTime: time.Millisecond, StopTime: time.Hour}, vmm.Options{RecordDirs: recordDirs(dir), StopGrace: 300 * time.Millisecond})
	e.register()
	e.request(vmm.RequestRunning)
	e.waitState("running")
	e.request(vmm.RequestStopped)
	e.waitState("stopping")
	e.m.Close()
	m2 := vmm.New(e.rt, vmm.InProcessHost{Options: simguest.Options{StopTime: time.Hour}},
		vmm.Options{RecordDirs: recordDirs(dir), Identity: testIdentity, StopGrace: 300 * time.Millisecond, PollWait: 50 * time.Millisecond})
	defer m2.Close()
	if _, err := m2.Resume(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitDeadline)
	for {
		info, err := m2.Get(vmmID)
		if err == nil && info.State.State == "destroyed" {
			if !strings.Contains(info.Detail, "forced") {
				t.Errorf("detail %q does not say the stop was forced", info.Detail)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a stop asked before a restart, ignored by the guest: %+v (%v)", info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
