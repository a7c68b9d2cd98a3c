package vmm_test

import (
	"context"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
)

// recordStates records what a vmm.States is told.
type recordStates struct {
	mu        sync.Mutex
	states    []vmm.RuntimeState
	forgotten []string
}

func (r *recordStates) VMMState(id string, st vmm.RuntimeState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, st)
}

func (r *recordStates) VMMForgotten(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgotten = append(r.forgotten, id)
}

// Every change of a VMM's state is told, in order, each with a newer
// generation, the last one being the state the manager reports; an
// unregistered VMM is told forgotten after its last state.
func TestEveryStateChangeIsToldInOrder(t *testing.T) {
	rec := &recordStates{}
	e := newEnv(t, simguest.Options{}, vmm.Options{States: rec})
	e.register()
	e.waitState("starting")
	e.request(vmm.RequestRunning)
	e.waitState("running")
	e.request(vmm.RequestReboot)
	e.waitState("running")
	e.request(vmm.RequestStopped)
	e.waitState("destroyed")
	last, err := e.m.Unregister(context.Background(), vmmID)
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	seen := map[string]bool{}
	for i, st := range rec.states {
		seen[st.State] = true
		if i > 0 && st.Gen <= rec.states[i-1].Gen {
			t.Fatalf("state %d (%+v) is not newer than the one before (%+v)", i, st, rec.states[i-1])
		}
	}
	for _, s := range []string{"running", "rebooting", "stopping", "stopped", "destroyed"} {
		if !seen[s] {
			t.Errorf("never told %q: %+v", s, rec.states)
		}
	}
	if got := rec.states[len(rec.states)-1]; got != last.State {
		t.Fatalf("last told %+v, manager reports %+v", got, last.State)
	}
	if len(rec.forgotten) != 1 || rec.forgotten[0] != vmmID {
		t.Fatalf("forgotten %v", rec.forgotten)
	}
}
