package vmm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// A VMM whose zone is gone after the host restarted lost its guest with
// the host: Nexus is told it failed, and the sled then forgets it (404
// NO_SUCH_INSTANCE), as upstream's sled knows no VMM after a reboot. After
// a mere agent restart, a VMM whose zone is gone stays, failed.
func TestVMMsDoNotOutliveAHostRestart(t *testing.T) {
	for _, rebooted := range []bool{true, false} {
		t.Run(fmt.Sprintf("host restarted %v", rebooted), func(t *testing.T) {
			rt := sim.New(sim.Options{})
			dir := t.TempDir()
			m := vmm.New(rt, vmm.InProcessHost{Options: simguest.Options{BootTime: time.Millisecond}},
				vmm.Options{RecordDirs: recordDirs(dir), PollWait: 20 * time.Millisecond, Identity: testIdentity, Boot: "boot-1"})
			rt.SetNotify(m.Poke)
			if _, err := m.Register(vmmID, registration()); err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.RequestState(context.Background(), vmmID, vmm.RequestRunning); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "running", func() (bool, string) {
				info, err := m.Get(vmmID)
				return err == nil && info.State.State == vmm.StateRunning, fmt.Sprint(info.State, err)
			})
			m.Close()
			// The host goes down: the VMM's zone is gone.
			if !rt.Vanish(zone.VMMNamePrefix + vmmID) {
				t.Fatal("no zone to vanish")
			}
			boot := "boot-1"
			if rebooted {
				boot = "boot-2"
			}
			states := &recordStates{}
			m2 := restarted(t, rt, vmm.Options{RecordDirs: recordDirs(dir), Boot: boot, States: states})
			if !rebooted {
				waitFor(t, "failed", func() (bool, string) {
					info, err := m2.Get(vmmID)
					return err == nil && info.State.State == vmm.StateFailed, fmt.Sprint(info.State, err)
				})
				return
			}
			waitFor(t, "the VMM forgotten", func() (bool, string) {
				info, err := m2.Get(vmmID)
				return errors.Is(err, vmm.ErrNotFound) && len(m2.List()) == 0, fmt.Sprint(info.State, err, m2.List())
			})
			states.mu.Lock()
			defer states.mu.Unlock()
			last := states.states[len(states.states)-1]
			if last.State != vmm.StateFailed {
				t.Errorf("Nexus was last told %s, want failed (the guest died with the host): %+v", last.State, states.states)
			}
			if len(states.forgotten) != 1 || states.forgotten[0] != vmmID {
				t.Errorf("forgotten: %v", states.forgotten)
			}
			for _, d := range recordDirs(dir) {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					if strings.HasSuffix(e.Name(), ".json") {
						t.Errorf("record left: %s/%s", d, e.Name())
					}
				}
			}
			// The id is free again: Nexus may place a new VMM with it.
			if _, err := m2.Register(vmmID, registration()); err != nil {
				t.Errorf("registering the id again: %v", err)
			}
		})
	}
}
