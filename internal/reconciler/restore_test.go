package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// agentRun is one run of "the agent" over a simulated OS that outlives it: a
// reconciler given its ledgered config before it starts, as the agent does.
type agentRun struct {
	*harness
	stop func()
}

func runAgent(t *testing.T, rt *sim.Runtime, cfg *sledconfig.Config, listFailures int, unhealthy ...string) *agentRun {
	t.Helper()
	rec := &recorder{Runtime: rt, listFailures: listFailures, unhealthy: map[string]bool{}}
	for _, name := range unhealthy {
		rec.unhealthy[name] = true
	}
	r := reconciler.New(rec, nil, reconciler.Options{})
	rt.SetNotify(r.Poke)
	if cfg != nil {
		r.Update(cfg) // the ledger is read before the loop starts
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &agentRun{harness: &harness{t: t, rt: rt, r: r, rec: rec}, stop: stop}
}

func incarnations(t *testing.T, rt *sim.Runtime, zones ...sledconfig.Zone) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, z := range zones {
		n, ok := rt.Incarnation(z.Name())
		if !ok {
			t.Fatalf("zone %s does not exist", z.Name())
		}
		out[z.Name()] = n
	}
	return out
}

func TestRestartAdoptsRunningZonesWithoutRestartingThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		zones := sledconfigtest.Crucibles(5)
		cfg := sledconfigtest.Config(1, zones...)
		first := runAgent(t, rt, cfg, 0)
		synctest.Wait()
		before := incarnations(t, rt, zones...)
		first.stop()

		second := runAgent(t, rt, cfg, 0)
		<-second.r.Restored()
		// Adopted zones are running as soon as the state is restored.
		if got := second.r.RunningZones(); len(got) != len(zones) {
			t.Fatalf("running right after restore: %v", got)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if ops := second.rec.ops(); len(ops) != 0 {
			t.Fatalf("restart made runtime calls: %v", ops)
		}
		if after := incarnations(t, rt, zones...); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("zones restarted: incarnations %v → %v", before, after)
		}
		rs := second.r.Restore()
		if !rs.Done || rs.Found != 5 || rs.Adopted != 5 || rs.Repair+rs.Remove+rs.Unmanaged != 0 || !rs.HadConfig || !rs.Swept {
			t.Fatalf("restore status %+v", rs)
		}
		for _, z := range zones {
			zs, _ := second.r.Zone(z.Name())
			if zs.State != reconciler.StateRunning || zs.History[len(zs.History)-1].Event != "adopted" {
				t.Fatalf("zone %s: %+v", z.Name(), zs)
			}
		}
	})
}

func TestRestartAfterConfigChangeRestartsOnlyTheChangedZones(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		zones := sledconfigtest.Crucibles(5)
		first := runAgent(t, rt, sledconfigtest.Config(1, zones...), 0)
		synctest.Wait()
		before := incarnations(t, rt, zones...)
		first.stop()

		// Ledgered while the agent was down (or just before it died): zone
		// 1 changes, zone 2 goes, zone 5 is new.
		changed := zones[1]
		changed.ZoneType.Address = netip.AddrPortFrom(netip.MustParseAddrPort(changed.ZoneType.Address).Addr(), 40000).String()
		cfg := sledconfigtest.Config(2, zones[0], changed, zones[3], zones[4], sledconfigtest.Crucible(5))
		second := runAgent(t, rt, cfg, 0)
		synctest.Wait()

		ops := second.rec.ops()
		slices.Sort(ops)
		want := []string{
			"destroy " + zones[1].Name(), "destroy " + zones[2].Name(),
			"ensure " + zones[1].Name(), "ensure " + sledconfigtest.Crucible(5).Name(),
		}
		slices.Sort(want)
		if !slices.Equal(ops, want) {
			t.Fatalf("calls %v, want %v", ops, want)
		}
		after := incarnations(t, rt, zones[0], zones[3], zones[4])
		for name, n := range after {
			if before[name] != n {
				t.Errorf("unchanged zone %s restarted", name)
			}
		}
		if _, ok := rt.Incarnation(zones[2].Name()); ok {
			t.Errorf("removed zone still exists")
		}
		rs := second.r.Restore()
		if rs.Found != 5 || rs.Adopted != 3 || rs.Repair != 1 || rs.Remove != 1 {
			t.Fatalf("restore status %+v", rs)
		}
	})
}

func TestRestartRepairsAHalfMadeZoneAndSweepsLeftovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		whole, half := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
		if err := rt.Ensure(context.Background(), zone.SpecFor(&whole)); err != nil {
			t.Fatal(err)
		}
		halfMade(t, rt, half)
		if err := rt.AddLeftover(sim.Leftover{Kind: "link", Zone: sledconfigtest.Crucible(7).Name()}); err != nil {
			t.Fatal(err)
		}
		before := incarnations(t, rt, whole)

		a := runAgent(t, rt, sledconfigtest.Config(1, whole, half), 0)
		synctest.Wait()
		if got, want := a.rec.ops(), []string{"destroy " + half.Name(), "ensure " + half.Name()}; !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		if after := incarnations(t, rt, whole); after[whole.Name()] != before[whole.Name()] {
			t.Errorf("whole zone restarted")
		}
		if left := rt.Leftovers(); len(left) != 0 {
			t.Errorf("leftovers not swept: %v", left)
		}
		rs := a.r.Restore()
		if rs.Adopted != 1 || rs.Repair != 1 || !slices.Equal(rs.Leftovers, []string{"link of zone " + sledconfigtest.Crucible(7).Name()}) {
			t.Fatalf("restore status %+v", rs)
		}
		if got := a.r.RunningZones(); len(got) != 2 {
			t.Fatalf("running %v", got)
		}
	})
}

// halfMade leaves z created but never up, as a start interrupted by the
// agent's death does.
func halfMade(t *testing.T, rt *sim.Runtime, z sledconfig.Zone) {
	t.Helper()
	if err := rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{z.ID: {Start: "hang"}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := rt.Ensure(ctx, zone.SpecFor(&z)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("half-made start: %v", err)
	}
	if err := rt.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
}

func TestRestartWithoutAConfigDestroysNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		running, half := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
		if err := rt.Ensure(context.Background(), zone.SpecFor(&running)); err != nil {
			t.Fatal(err)
		}
		halfMade(t, rt, half)
		leftover := sim.Leftover{Kind: "process", Zone: sledconfigtest.Crucible(7).Name()}
		if err := rt.AddLeftover(leftover); err != nil {
			t.Fatal(err)
		}

		// The ledger was missing or corrupt: no config.
		a := runAgent(t, rt, nil, 0)
		time.Sleep(time.Hour)
		synctest.Wait()
		if ops := a.rec.ops(); len(ops) != 0 {
			t.Fatalf("calls without a config: %v", ops)
		}
		if got := rt.Leftovers(); !slices.Equal(got, []sim.Leftover{leftover}) {
			t.Fatalf("leftovers touched without a config: %v", got)
		}
		rs := a.r.Restore()
		if !rs.Done || rs.HadConfig || rs.Unmanaged != 2 || rs.Swept {
			t.Fatalf("restore status %+v", rs)
		}
		a.wantState(running, reconciler.StateUnmanaged)
		a.wantState(half, reconciler.StateUnmanaged)

		// The first config is when leftovers go, once.
		a.r.Update(sledconfigtest.Config(1, running))
		synctest.Wait()
		if got := rt.Leftovers(); len(got) != 0 {
			t.Fatalf("leftovers after the first config: %v", got)
		}
		if rs := a.r.Restore(); !rs.Swept || len(rs.Leftovers) != 1 {
			t.Fatalf("restore status after the first config %+v", rs)
		}
		if got, want := a.rec.ops(), []string{"destroy " + half.Name()}; !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
	})
}

func TestNothingActsUntilTheRuntimeCanBeListed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		z := sledconfigtest.Crucible(0)
		if err := rt.Ensure(context.Background(), zone.SpecFor(&z)); err != nil {
			t.Fatal(err)
		}
		before := incarnations(t, rt, z)
		a := runAgent(t, rt, sledconfigtest.Config(1, z, sledconfigtest.Crucible(1)), 3)
		synctest.Wait()
		rs := a.r.Restore()
		if rs.Done || rs.ListAttempts != 1 || rs.LastError == "" {
			t.Fatalf("restore status while listing fails %+v", rs)
		}
		if ops := a.rec.ops(); len(ops) != 0 {
			t.Fatalf("calls before a listing succeeded: %v", ops)
		}
		// Backoff 1s, 2s, 4s: the fourth listing, 7s in, succeeds.
		time.Sleep(7 * time.Second)
		synctest.Wait()
		if rs := a.r.Restore(); !rs.Done || rs.ListAttempts != 4 || rs.LastError != "" || rs.Adopted != 1 {
			t.Fatalf("restore status %+v", rs)
		}
		if got, want := a.rec.ops(), []string{"ensure " + sledconfigtest.Crucible(1).Name()}; !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		if after := incarnations(t, rt, z); after[z.Name()] != before[z.Name()] {
			t.Errorf("adopted zone restarted")
		}
	})
}

func TestRestartWaitsForARunningZoneThatDoesNotAnswerYet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		zones := sledconfigtest.Crucibles(3)
		for i := range zones {
			if err := rt.Ensure(context.Background(), zone.SpecFor(&zones[i])); err != nil {
				t.Fatal(err)
			}
		}
		before := incarnations(t, rt, zones...)
		slow := zones[1]
		a := runAgent(t, rt, sledconfigtest.Config(1, zones...), 0, slow.Name())
		synctest.Wait()
		// Ensure waits for it; nothing is torn down or restarted.
		if got, want := a.rec.ops(), []string{"ensure " + slow.Name()}; !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		if after := incarnations(t, rt, zones...); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("zones restarted: %v → %v", before, after)
		}
		if rs := a.r.Restore(); rs.Adopted != 2 || rs.Waited != 1 || rs.Repair != 0 {
			t.Fatalf("restore status %+v", rs)
		}
		a.wantState(slow, reconciler.StateRunning)
	})
}

func TestRunningSpecsFollowTheZones(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{StartDelay: func(zone.Spec) time.Duration { return time.Second }})
		changes := make(chan struct{}, 100)
		r := reconciler.New(rt, nil, reconciler.Options{OnRunningChange: func() { changes <- struct{}{} }})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		zones := sledconfigtest.Crucibles(2)
		r.Update(sledconfigtest.Config(1, zones...))
		synctest.Wait()
		if got := r.RunningSpecs(); len(got) != 0 || len(changes) != 0 {
			t.Fatalf("running while starting: %v, %d changes", got, len(changes))
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got := r.RunningSpecs()
		if len(got) != 2 || got[0].Name >= got[1].Name || got[0].Hash == "" || len(changes) != 2 {
			t.Fatalf("running after start: %+v, %d changes", got, len(changes))
		}
		r.Update(sledconfigtest.Config(2, zones[0]))
		synctest.Wait()
		if got := r.RunningSpecs(); len(got) != 1 || got[0].Name != zones[0].Name() || len(changes) != 3 {
			t.Fatalf("running after removal: %+v, %d changes", got, len(changes))
		}
	})
}

func TestVMMZonesAreLeftToTheVMMManager(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		vmm := zone.Spec{Name: zone.VMMNamePrefix + sledconfigtest.ZoneID(77), ID: sledconfigtest.ZoneID(77), Hash: "vmm"}
		vmm.Config.ZoneType.Type = zone.VMMZoneType
		if err := rt.Ensure(context.Background(), vmm); err != nil {
			t.Fatal(err)
		}
		a := runAgent(t, rt, sledconfigtest.Config(1, sledconfigtest.Crucible(0)), 0)
		time.Sleep(time.Minute) // relists included
		synctest.Wait()
		if got, want := a.rec.ops(), []string{"ensure " + sledconfigtest.Crucible(0).Name()}; !slices.Equal(got, want) {
			t.Fatalf("calls %v, want %v", got, want)
		}
		if _, ok := a.r.Zone(vmm.Name); ok {
			t.Fatalf("the zone reconciler took the VMM zone as its own")
		}
		if rs := a.r.Restore(); rs.Found != 0 {
			t.Fatalf("restore counted the VMM zone: %+v", rs)
		}
	})
}

// slowEnsure is a runtime whose Ensure of one zone waits until released or
// its deadline: a service that is slow to answer.
type slowEnsure struct {
	*recorder
	slow    string
	release chan struct{}
}

func (s *slowEnsure) Ensure(ctx context.Context, spec zone.Spec) error {
	if spec.Name == s.slow {
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.recorder.Ensure(ctx, spec)
}

// A zone found after a restart that does not answer yet is present (an
// internal DNS zone keeps its prefix) from the moment the state is
// restored, though it is not running; removed from the config, it is not.
func TestPresentSpecsIncludeAZoneWaitedForAfterARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		dns := sledconfigtest.InternalDNS(0)
		crucible := sledconfigtest.Crucible(0)
		for _, z := range []sledconfig.Zone{dns, crucible} {
			if err := rt.Ensure(context.Background(), zone.SpecFor(&z)); err != nil {
				t.Fatal(err)
			}
		}
		rec := &recorder{Runtime: rt, unhealthy: map[string]bool{dns.Name(): true}}
		slow := &slowEnsure{recorder: rec, slow: dns.Name(), release: make(chan struct{})}
		var changes atomic.Int32
		r := reconciler.New(slow, nil, reconciler.Options{OnPresentChange: func() { changes.Add(1) }})
		r.Update(sledconfigtest.Config(1, dns, crucible))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		<-r.Restored()
		synctest.Wait()
		names := func(specs []zone.Spec) []string {
			var out []string
			for _, s := range specs {
				out = append(out, s.Name)
			}
			return out
		}
		want := []string{dns.Name(), crucible.Name()}
		slices.Sort(want)
		if got := names(r.PresentSpecs()); !slices.Equal(got, want) {
			t.Fatalf("present while the DNS zone is waited for: %v, want %v", got, want)
		}
		if got := names(r.RunningSpecs()); slices.Contains(got, dns.Name()) {
			t.Fatalf("running includes the DNS zone that does not answer: %v", got)
		}
		if changes.Load() == 0 {
			t.Fatal("OnPresentChange was not called")
		}
		close(slow.release)
		r.Update(sledconfigtest.Config(2, crucible))
		synctest.Wait()
		if got := names(r.PresentSpecs()); !slices.Equal(got, []string{crucible.Name()}) {
			t.Fatalf("present after the DNS zone's removal: %v", got)
		}
	})
}
