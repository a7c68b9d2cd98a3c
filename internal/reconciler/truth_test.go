package reconciler_test

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// A start that hangs does not freeze the last reconciliation: it shows the
// newest config as soon as every other zone has settled, with the hung zone
// err, saying what it is doing, for how long and until when.
func TestLastReconciliationDoesNotWaitForAHungStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		zones := sledconfigtest.Crucibles(3)
		h.faults(map[string]sim.ZoneFaults{zones[0].ID: {Start: "hang"}})
		h.r.Update(sledconfigtest.Config(1, zones...))
		time.Sleep(time.Second)
		synctest.Wait()
		st := h.r.Status()
		if st.Phase != reconciler.PhaseRunning {
			t.Fatalf("phase = %q while a start is in flight", st.Phase)
		}
		if st.Last == nil || st.Last.Config.Generation != 1 {
			t.Fatalf("last reconciliation while a start hangs: %+v", st.Last)
		}

		// A new zone in a new generation: reported within a second.
		next := append(slices.Clone(zones), sledconfigtest.Crucible(3))
		h.r.Update(sledconfigtest.Config(2, next...))
		time.Sleep(time.Second)
		synctest.Wait()
		st = h.r.Status()
		if st.Last == nil || st.Last.Config.Generation != 2 {
			t.Fatalf("last reconciliation a second after generation 2: %+v", st.Last)
		}
		for _, z := range next[1:] {
			if res := st.Last.Zones[z.ID]; !res.OK {
				t.Errorf("zone %s: %+v, want ok", z.Name(), res)
			}
		}
		if st.Phase != reconciler.PhaseRunning {
			t.Errorf("phase = %q while a start is in flight", st.Phase)
		}

		// What it says of the hung start stays current.
		time.Sleep(12*time.Second + 500*time.Millisecond) // t = 14.5s
		synctest.Wait()
		res := h.r.Status().Last.Zones[zones[0].ID]
		if want := "starting for 14s (deadline 2m0s)"; res.OK || !strings.HasPrefix(res.Message, want) {
			t.Errorf("hung zone: %+v, want err beginning %q", res, want)
		}
		zs, _ := h.r.Zone(zones[0].Name())
		if !strings.HasPrefix(zs.Activity, "starting for 14s") {
			t.Errorf("hung zone's activity = %q", zs.Activity)
		}
	})
}

// A zone the agent knows is dead is err from that moment, also while it
// waits out its backoff.
func TestDeadZoneIsErrWhileItWaitsOutItsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{Backoff: reconciler.Backoff{Initial: 20 * time.Second, Max: time.Minute}}, sim.Options{})
		zones := sledconfigtest.Crucibles(2)
		h.faults(map[string]sim.ZoneFaults{zones[0].ID: {VanishAfter: "5s"}})
		h.r.Update(sledconfigtest.Config(1, zones...))
		// t=5: it vanishes and is started again at once; t=10: it vanishes
		// again and now waits 20s.
		time.Sleep(11 * time.Second)
		synctest.Wait()
		zs, _ := h.r.Zone(zones[0].Name())
		if zs.State != reconciler.StateFailed || zs.NextRetry == nil {
			t.Fatalf("zone after its second vanishing: %+v", zs)
		}
		st := h.r.Status()
		res := st.Last.Zones[zones[0].ID]
		if res.OK || !strings.Contains(res.Message, "vanished") || !strings.Contains(res.Message, "next try at") {
			t.Fatalf("dead zone's result = %+v, want err saying why and when the next try is", res)
		}
		if !st.Last.Zones[zones[1].ID].OK {
			t.Errorf("the other zone: %+v", st.Last.Zones[zones[1].ID])
		}
		if st.Last.CompletedAt.Before(time.Now().Add(-time.Second)) {
			t.Errorf("last reconciliation as of %v, now %v", st.Last.CompletedAt, time.Now())
		}
	})
}

// A running zone whose service stops answering is reported and repaired
// through the normal path; one that fails fewer checks than the threshold
// is left alone.
func TestUnhealthyZoneIsReportedAndRepaired(t *testing.T) {
	for _, fault := range []string{"fail", "hang"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, reconciler.Options{RelistPeriod: time.Hour}, sim.Options{})
				zones := sledconfigtest.Crucibles(2)
				h.r.Update(sledconfigtest.Config(1, zones...))
				synctest.Wait()
				h.wantState(zones[0], reconciler.StateRunning)
				h.faults(map[string]sim.ZoneFaults{zones[0].ID: {Health: fault}})

				// Checks at 5s and 10s fail: reported, not yet repaired.
				time.Sleep(10*time.Second + 100*time.Millisecond)
				synctest.Wait()
				zs, _ := h.r.Zone(zones[0].Name())
				if zs.State != reconciler.StateRunning || zs.Health.State != reconciler.HealthFailing || zs.Health.Failures < 1 {
					t.Fatalf("zone after failed checks: state %s, health %+v", zs.State, zs.Health)
				}
				if res := h.r.Status().Last.Zones[zones[0].ID]; !res.OK {
					t.Fatalf("zone below the failure threshold: %+v", res)
				}
				// By the third failure it is err and restarted.
				deadline := time.Now().Add(30 * time.Second)
				for len(h.rec.times("ensure", zones[0].Name())) < 2 && time.Now().Before(deadline) {
					time.Sleep(100 * time.Millisecond)
					synctest.Wait()
					if res := h.r.Status().Last.Zones[zones[0].ID]; !res.OK && !strings.Contains(res.Message, "unhealthy: 3 health checks in a row failed") {
						t.Fatalf("result = %+v", res)
					}
				}
				if n := len(h.rec.times("ensure", zones[0].Name())); n != 2 {
					t.Fatalf("unhealthy zone started %d times, want 2", n)
				}
				if n := len(h.rec.times("destroy", zones[0].Name())); n != 1 {
					t.Fatalf("unhealthy zone destroyed %d times before its restart, want 1", n)
				}
				zs, _ = h.r.Zone(zones[0].Name())
				if zs.Incidents != 1 || !slices.ContainsFunc(zs.History, func(e reconciler.Event) bool { return e.Event == "unhealthy" }) {
					t.Fatalf("zone after repair: %+v", zs)
				}
				// Healthy again: stays up, checks pass.
				h.faults(nil)
				time.Sleep(time.Minute)
				synctest.Wait()
				zs, _ = h.r.Zone(zones[0].Name())
				if zs.State != reconciler.StateRunning || zs.Health.State != reconciler.HealthOK || zs.Health.LastCheck == nil {
					t.Fatalf("zone after the fault cleared: state %s, health %+v", zs.State, zs.Health)
				}
				if n := len(h.rec.times("ensure", zones[1].Name())); n != 1 {
					t.Errorf("the healthy zone was started %d times", n)
				}
			})
		})
	}
}

// A zone that misses fewer checks in a row than the threshold is never
// restarted.
func TestHealthBlipRestartsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{RelistPeriod: time.Hour}, sim.Options{})
		z := sledconfigtest.Crucible(0)
		h.r.Update(sledconfigtest.Config(1, z))
		synctest.Wait()
		for range 5 {
			h.faults(map[string]sim.ZoneFaults{z.ID: {Health: "fail"}})
			time.Sleep(10 * time.Second) // two failed checks
			synctest.Wait()
			h.faults(nil)
			time.Sleep(5 * time.Second) // one good one
			synctest.Wait()
		}
		if n := len(h.rec.times("ensure", z.Name())); n != 1 {
			t.Fatalf("zone started %d times, want 1", n)
		}
		zs, _ := h.r.Zone(z.Name())
		if zs.Health.State != reconciler.HealthOK || !slices.ContainsFunc(zs.History, func(e reconciler.Event) bool { return e.Event == "healthy again" }) {
			t.Fatalf("zone: %+v", zs)
		}
	})
}
