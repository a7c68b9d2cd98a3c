package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// harness runs a reconciler over a sim runtime inside a synctest bubble.
type harness struct {
	t   *testing.T
	rt  *sim.Runtime
	r   *reconciler.Reconciler
	rec *recorder
}

// recorder wraps the sim runtime and timestamps every call.
type recorder struct {
	*sim.Runtime
	mu    sync.Mutex
	calls []timedCall
	// listFailures is how many Lists fail before they succeed.
	listFailures int
	// unhealthy zones fail their health check.
	unhealthy map[string]bool
	// specs is the spec of each zone's last Ensure.
	specs map[string]zone.Spec
}

func (c *recorder) Healthy(ctx context.Context, s zone.Spec) error {
	c.mu.Lock()
	c.calls = append(c.calls, timedCall{time.Now(), "health", s.Name})
	if c.unhealthy[s.Name] {
		c.mu.Unlock()
		return errors.New("connection refused")
	}
	c.mu.Unlock()
	return c.Runtime.Healthy(ctx, s)
}

type timedCall struct {
	at   time.Time
	op   string
	zone string
}

func (c *recorder) log(op, name string) {
	c.mu.Lock()
	c.calls = append(c.calls, timedCall{time.Now(), op, name})
	c.mu.Unlock()
}

func (c *recorder) Ensure(ctx context.Context, s zone.Spec) error {
	c.log("ensure", s.Name)
	c.mu.Lock()
	if c.specs == nil {
		c.specs = map[string]zone.Spec{}
	}
	c.specs[s.Name] = s
	c.mu.Unlock()
	return c.Runtime.Ensure(ctx, s)
}

// lastSpec is the spec of the last Ensure of the named zone.
func (c *recorder) lastSpec(name string) zone.Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.specs[name]
}

func (c *recorder) Destroy(ctx context.Context, name string) error {
	c.log("destroy", name)
	return c.Runtime.Destroy(ctx, name)
}

func (c *recorder) List(ctx context.Context) ([]zone.Observed, error) {
	c.mu.Lock()
	fail := c.listFailures > 0
	if fail {
		c.listFailures--
	}
	c.mu.Unlock()
	if fail {
		return nil, errors.New("injected list failure")
	}
	return c.Runtime.List(ctx)
}

// ops returns "op name" for every ensure and destroy call, in order.
func (c *recorder) ops() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, call := range c.calls {
		if call.op != "health" {
			out = append(out, call.op+" "+call.zone)
		}
	}
	return out
}

func (c *recorder) times(op, name string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, call := range c.calls {
		if call.op == op && call.zone == name {
			out = append(out, call.at)
		}
	}
	return out
}

// start runs a reconciler in the current bubble; it is stopped at cleanup.
func start(t *testing.T, opts reconciler.Options, simOpts sim.Options) *harness {
	t.Helper()
	rt := sim.New(simOpts)
	rec := &recorder{Runtime: rt}
	r := reconciler.New(rec, nil, opts)
	rt.SetNotify(r.Poke)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &harness{t: t, rt: rt, r: r, rec: rec}
}

func (h *harness) faults(f map[string]sim.ZoneFaults) {
	h.t.Helper()
	if err := h.rt.SetFaults(sim.Faults{Zones: f}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) state(z sledconfig.Zone) reconciler.State {
	zs, ok := h.r.Zone(z.Name())
	if !ok {
		return ""
	}
	return zs.State
}

func (h *harness) wantState(z sledconfig.Zone, want reconciler.State) {
	h.t.Helper()
	if got := h.state(z); got != want {
		zs, _ := h.r.Zone(z.Name())
		h.t.Fatalf("zone %s: state %q, want %q (status %+v)", z.Name(), got, want, zs)
	}
}

func TestConvergesAndReportsIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{StartDelay: func(zone.Spec) time.Duration { return time.Second }})
		if got := h.r.Status().Phase; got != reconciler.PhaseNotYetRun {
			t.Fatalf("phase before any config = %q", got)
		}
		zones := sledconfigtest.Crucibles(3)
		cfg := sledconfigtest.Config(1, zones...)
		h.r.Update(cfg)
		synctest.Wait()
		st := h.r.Status()
		if st.Phase != reconciler.PhaseRunning || st.Config != cfg {
			t.Fatalf("phase while starting = %q, config %v", st.Phase, st.Config)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		st = h.r.Status()
		if st.Phase != reconciler.PhaseIdle || st.Last == nil || st.Last.Config != cfg {
			t.Fatalf("status after start = %+v", st)
		}
		if st.RanFor != time.Second {
			t.Errorf("pass ran for %s, want 1s", st.RanFor)
		}
		for _, z := range zones {
			if res := st.Last.Zones[z.ID]; !res.OK {
				t.Errorf("zone %s result %+v", z.ID, res)
			}
			h.wantState(z, reconciler.StateRunning)
		}
		want := []string{zones[0].Name(), zones[1].Name(), zones[2].Name()}
		slices.Sort(want)
		if got := h.r.RunningZones(); !slices.Equal(got, want) {
			t.Errorf("RunningZones = %v, want %v", got, want)
		}
	})
}

func TestHangingZoneDelaysNothingElse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{StartTimeout: time.Minute}, sim.Options{StartDelay: func(zone.Spec) time.Duration { return time.Second }})
		zones := sledconfigtest.Crucibles(4)
		h.faults(map[string]sim.ZoneFaults{zones[0].ID: {Start: "hang"}})
		h.r.Update(sledconfigtest.Config(1, zones...))
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		h.wantState(zones[0], reconciler.StateStarting)
		for _, z := range zones[1:] {
			h.wantState(z, reconciler.StateRunning)
		}
		// Reads answer at once while the hang goes on.
		if st := h.r.Status(); st.Phase != reconciler.PhaseRunning {
			t.Fatalf("phase = %q while a start hangs", st.Phase)
		}
		// A new config is taken up at once: zone 3 removed, zone 4 added.
		next := append(slices.Clone(zones[:3]), sledconfigtest.Crucible(4))
		h.r.Update(sledconfigtest.Config(2, next...))
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		h.wantState(next[3], reconciler.StateRunning)
		if _, ok := h.r.Zone(zones[3].Name()); ok {
			t.Fatalf("removed zone %s still known", zones[3].Name())
		}
		h.wantState(zones[0], reconciler.StateStarting)
		// The hang ends at the deadline (t=60s), as a failure with a reason,
		// and the next try is 1s later.
		time.Sleep(57*time.Second + 500*time.Millisecond)
		synctest.Wait()
		zs, _ := h.r.Zone(zones[0].Name())
		if zs.State != reconciler.StateFailed || !strings.Contains(zs.LastError, "within 1m0s") || zs.NextRetry == nil {
			t.Fatalf("hung zone after deadline: %+v", zs)
		}
		st := h.r.Status()
		if st.Phase != reconciler.PhaseIdle {
			t.Fatalf("phase after deadline = %q", st.Phase)
		}
		if res := st.Last.Zones[zones[0].ID]; res.OK || res.Message == "" {
			t.Errorf("hung zone result = %+v, want an error", res)
		}
		if res := st.Last.Zones[next[3].ID]; !res.OK {
			t.Errorf("new zone result = %+v", res)
		}
	})
}

func TestVanishedZoneIsRecreated(t *testing.T) {
	for _, events := range []bool{true, false} {
		t.Run(fmt.Sprintf("events=%v", events), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, reconciler.Options{RelistPeriod: 5 * time.Second}, sim.Options{})
				if !events {
					h.rt.SetNotify(nil)
				}
				zones := sledconfigtest.Crucibles(2)
				h.r.Update(sledconfigtest.Config(1, zones...))
				synctest.Wait()
				h.wantState(zones[0], reconciler.StateRunning)

				at := time.Now()
				if !h.rt.Vanish(zones[0].Name()) {
					t.Fatal("zone did not exist")
				}
				// With events the zone is back at once; without, by the next relist.
				limit := time.Duration(0)
				if !events {
					limit = 5 * time.Second
				}
				time.Sleep(limit)
				synctest.Wait()
				h.wantState(zones[0], reconciler.StateRunning)
				ensures := h.rec.times("ensure", zones[0].Name())
				if len(ensures) != 2 || ensures[1].Sub(at) > limit {
					t.Fatalf("ensure calls %v, vanished at %v", ensures, at)
				}
				zs, _ := h.r.Zone(zones[0].Name())
				if zs.Incidents != 1 {
					t.Errorf("incidents = %d, want 1", zs.Incidents)
				}
				if !slices.ContainsFunc(zs.History, func(e reconciler.Event) bool { return e.Event == "vanished" }) {
					t.Errorf("history has no vanish: %+v", zs.History)
				}
				if n := len(h.rec.times("ensure", zones[1].Name())); n != 1 {
					t.Errorf("the other zone was started %d times", n)
				}
			})
		})
	}
}

func TestVanishAfterFaultKeepsBeingRepaired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		z := sledconfigtest.Crucible(0)
		h.faults(map[string]sim.ZoneFaults{z.ID: {VanishAfter: "10s"}})
		h.r.Update(sledconfigtest.Config(1, z))
		time.Sleep(35 * time.Second)
		synctest.Wait()
		zs, _ := h.r.Zone(z.Name())
		if zs.Incidents < 2 {
			t.Fatalf("incidents = %d after 35s of vanishing every 10s", zs.Incidents)
		}
		if zs.State != reconciler.StateRunning && zs.State != reconciler.StateFailed {
			t.Fatalf("state %q", zs.State)
		}
	})
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := reconciler.Options{Backoff: reconciler.Backoff{Initial: time.Second, Max: 30 * time.Second}}
		h := start(t, opts, sim.Options{})
		z := sledconfigtest.Crucible(0)
		h.faults(map[string]sim.ZoneFaults{z.ID: {Start: "fail"}})
		h.r.Update(sledconfigtest.Config(1, z))
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		ts := h.rec.times("ensure", z.Name())
		var gaps []time.Duration
		for i := 1; i < len(ts); i++ {
			gaps = append(gaps, ts[i].Sub(ts[i-1]))
		}
		want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30, 30}
		for i := range want {
			want[i] *= time.Second
		}
		if len(gaps) < len(want) || !slices.Equal(gaps[:len(want)], want) {
			t.Fatalf("gaps between attempts = %v, want %v…", gaps, want)
		}
		zs, _ := h.r.Zone(z.Name())
		if zs.State != reconciler.StateFailed || zs.Attempts != len(ts) || !strings.Contains(zs.LastError, "injected") {
			t.Fatalf("status %+v", zs)
		}
		// Fixing the fault lets the next retry succeed.
		h.faults(nil)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		h.wantState(z, reconciler.StateRunning)
	})
}

func TestRemovalPrecedesReplacementStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{StopTimeout: time.Minute}, sim.Options{})
		old := sledconfigtest.Crucible(0)
		other := sledconfigtest.Crucible(1)
		h.r.Update(sledconfigtest.Config(1, old, other))
		synctest.Wait()
		// The replacement has a new id but the old zone's address.
		repl := sledconfigtest.Crucible(7)
		repl.ZoneType.Address = old.ZoneType.Address
		unrelated := sledconfigtest.Crucible(8)
		h.faults(map[string]sim.ZoneFaults{old.ID: {Stop: "20s"}})
		h.r.Update(sledconfigtest.Config(2, other, repl, unrelated))
		time.Sleep(time.Second)
		synctest.Wait()
		h.wantState(old, reconciler.StateStopping)
		h.wantState(repl, reconciler.StatePending)
		h.wantState(unrelated, reconciler.StateRunning)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		h.wantState(repl, reconciler.StateRunning)
		ops := h.rec.ops()
		di := slices.Index(ops, "destroy "+old.Name())
		ei := slices.Index(ops, "ensure "+repl.Name())
		if di < 0 || ei < 0 || di > ei {
			t.Fatalf("calls %v: want destroy of %s before ensure of %s", ops, old.Name(), repl.Name())
		}
		if d, e := h.rec.times("destroy", old.Name()), h.rec.times("ensure", repl.Name()); e[0].Before(d[0].Add(20 * time.Second)) {
			t.Fatalf("replacement started at %v, before the old zone's stop finished (%v + 20s)", e[0], d[0])
		}
		if n := len(h.rec.times("ensure", other.Name())); n != 1 {
			t.Errorf("unchanged zone started %d times", n)
		}
	})
}

func TestChangedZoneConfigRestartsOnlyThatZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		zones := sledconfigtest.Crucibles(3)
		h.r.Update(sledconfigtest.Config(1, zones...))
		synctest.Wait()
		changed := slices.Clone(zones)
		changed[1].ZoneType.Address = "[fd00:1122:3344:101::99]:32345"
		h.r.Update(sledconfigtest.Config(2, changed...))
		synctest.Wait()
		got := h.rec.ops()[3:]
		want := []string{"destroy " + zones[1].Name(), "ensure " + zones[1].Name()}
		if !slices.Equal(got, want) {
			t.Fatalf("calls after change = %v, want %v", got, want)
		}
		zs, _ := h.r.Zone(zones[1].Name())
		if zs.State != reconciler.StateRunning || zs.ConfigHash != changed[1].Hash() {
			t.Fatalf("changed zone: %+v", zs)
		}
	})
}

func TestNewestConfigWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		for gen := uint64(1); gen <= 50; gen++ {
			h.r.Update(sledconfigtest.Config(gen, sledconfigtest.Crucible(int(gen))))
		}
		synctest.Wait()
		want := []string{sledconfigtest.Crucible(50).Name()}
		if got := h.r.RunningZones(); !slices.Equal(got, want) {
			t.Fatalf("running %v, want %v", got, want)
		}
		if st := h.r.Status(); st.Last.Config.Generation != 50 {
			t.Fatalf("last reconciled generation %d", st.Last.Config.Generation)
		}
		obs, _ := h.rt.List(context.Background())
		if len(obs) != 1 || obs[0].Name != want[0] {
			t.Fatalf("runtime holds %v, want only %s", obs, want[0])
		}
	})
}

func TestUpdatesCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &recorder{Runtime: sim.New(sim.Options{})}
		r := reconciler.New(rt, nil, reconciler.Options{})
		for gen := uint64(1); gen <= 50; gen++ {
			r.Update(sledconfigtest.Config(gen, sledconfigtest.Crucible(int(gen))))
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		synctest.Wait()
		if st := r.Status(); st.Passes != 1 || st.Last.Config.Generation != 50 {
			t.Fatalf("passes %d, last generation %d; want one pass of generation 50", st.Passes, st.Last.Config.Generation)
		}
		if want := []string{"ensure " + sledconfigtest.Crucible(50).Name()}; !slices.Equal(rt.ops(), want) {
			t.Fatalf("calls %v, want %v", rt.ops(), want)
		}
		cancel()
		synctest.Wait()
	})
}

func TestRemovingAHangingZoneAbandonsItsStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{StartTimeout: time.Hour}, sim.Options{})
		z := sledconfigtest.Crucible(0)
		h.faults(map[string]sim.ZoneFaults{z.ID: {Start: "hang"}})
		h.r.Update(sledconfigtest.Config(1, z))
		synctest.Wait()
		h.wantState(z, reconciler.StateStarting)
		h.r.Update(sledconfigtest.Config(2))
		synctest.Wait()
		if _, ok := h.r.Zone(z.Name()); ok {
			t.Fatalf("zone still known after removal")
		}
		if obs, _ := h.rt.List(context.Background()); len(obs) != 0 {
			t.Fatalf("runtime still has %v", obs)
		}
		if st := h.r.Status(); st.Phase != reconciler.PhaseIdle || len(st.Last.Zones) != 0 {
			t.Fatalf("status %+v", st)
		}
	})
}

func TestNothingIsDestroyedWithoutAConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		z := sledconfigtest.Crucible(0)
		if err := h.rt.Ensure(context.Background(), zone.SpecFor(&z)); err != nil {
			t.Fatal(err)
		}
		h.r.Poke()
		time.Sleep(time.Minute)
		synctest.Wait()
		if ops := h.rec.ops(); len(ops) != 0 {
			t.Fatalf("calls without a config: %v", ops)
		}
		h.wantState(z, reconciler.StateUnmanaged)
		if st := h.r.Status(); st.Phase != reconciler.PhaseNotYetRun {
			t.Fatalf("phase %q", st.Phase)
		}
		// With a config that wants it, the running zone is adopted as it is.
		h.r.Update(sledconfigtest.Config(1, z))
		synctest.Wait()
		h.wantState(z, reconciler.StateRunning)
		if ops := h.rec.ops(); len(ops) != 0 {
			t.Fatalf("adopting a running zone made calls: %v", ops)
		}
	})
}

func TestUnwantedZoneFoundAtStartIsRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		stray := sledconfigtest.Crucible(9)
		if err := h.rt.Ensure(context.Background(), zone.SpecFor(&stray)); err != nil {
			t.Fatal(err)
		}
		h.r.Poke()
		synctest.Wait()
		h.r.Update(sledconfigtest.Config(1, sledconfigtest.Crucible(0)))
		synctest.Wait()
		if want := []string{sledconfigtest.Crucible(0).Name()}; !slices.Equal(h.r.RunningZones(), want) {
			t.Fatalf("running %v", h.r.RunningZones())
		}
		if got := h.rec.times("destroy", stray.Name()); len(got) != 1 {
			t.Fatalf("stray zone destroyed %d times", len(got))
		}
	})
}

func TestStopFailureIsRetriedAndReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, reconciler.Options{}, sim.Options{})
		z := sledconfigtest.Crucible(0)
		h.r.Update(sledconfigtest.Config(1, z))
		synctest.Wait()
		h.faults(map[string]sim.ZoneFaults{z.ID: {Stop: "fail"}})
		h.r.Update(sledconfigtest.Config(2))
		synctest.Wait()
		zs, ok := h.r.Zone(z.Name())
		if !ok || zs.State != reconciler.StateFailed || zs.Wanted {
			t.Fatalf("zone %+v", zs)
		}
		if res := h.r.Status().Last.Zones[z.ID]; res.OK || !strings.Contains(res.Message, "injected") {
			t.Fatalf("result %+v", res)
		}
		h.faults(nil)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if _, ok := h.r.Zone(z.Name()); ok {
			t.Fatal("zone still known after its stop succeeded")
		}
		if res, ok := h.r.Status().Last.Zones[z.ID]; ok {
			t.Fatalf("removed zone still in last reconciliation: %+v", res)
		}
	})
}

func TestConfigChangeAbandonsAStartOfTheOldConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		old := sledconfigtest.Crucible(0)
		oldHash := old.Hash()
		// Only the old config's start hangs.
		h := start(t, reconciler.Options{StartTimeout: time.Hour}, sim.Options{StartDelay: func(s zone.Spec) time.Duration {
			if s.Hash == oldHash {
				return 100 * time.Hour
			}
			return 0
		}})
		h.r.Update(sledconfigtest.Config(1, old))
		synctest.Wait()
		h.wantState(old, reconciler.StateStarting)
		changed := old
		changed.ZoneType.Address = "[fd00:1122:3344:101::99]:32345"
		h.r.Update(sledconfigtest.Config(2, changed))
		synctest.Wait()
		zs, _ := h.r.Zone(changed.Name())
		if zs.State != reconciler.StateRunning || zs.ConfigHash != changed.Hash() {
			t.Fatalf("zone after config change: %+v", zs)
		}
		want := []string{"ensure " + old.Name(), "destroy " + old.Name(), "ensure " + old.Name()}
		if got := h.rec.ops(); !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
	})
}
