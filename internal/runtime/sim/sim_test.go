package sim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

func spec(i int) zone.Spec {
	z := sledconfigtest.Crucible(i)
	return zone.SpecFor(&z)
}

func names(t *testing.T, rt *sim.Runtime) map[string]bool {
	t.Helper()
	obs, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, o := range obs {
		out[o.Name] = o.Running
	}
	return out
}

func TestParseFaults(t *testing.T) {
	id := sledconfigtest.ZoneID(1)
	good := `{"zones":{"` + id + `":{"start":"hang","stop":"2s","vanish_after":"1m","health":"fail"}}}`
	if _, err := sim.ParseFaults([]byte(good)); err != nil {
		t.Fatalf("good map: %v", err)
	}
	for _, c := range []struct{ doc, want string }{
		{`{"zones":{"` + id + `":{"start":"sometimes"}}}`, id + `"].start`},
		{`{"zones":{"` + id + `":{"stop":"-1s"}}}`, id + `"].stop`},
		{`{"zones":{"` + id + `":{"vanish_after":"soon"}}}`, "vanish_after"},
		{`{"zones":{"` + id + `":{"health":"2s"}}}`, id + `"].health`},
		{`{"zones":{"zone-1":{}}}`, "zone-1"},
		{`{"zones":{"` + id + `":{"start_":"hang"}}}`, "unknown field"},
		{`[]`, "fault map"},
	} {
		if _, err := sim.ParseFaults([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFaults(%s) = %v, want an error mentioning %q", c.doc, err, c.want)
		}
	}
	rt := sim.New(sim.Options{})
	if err := rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{"x": {}}}); err == nil {
		t.Error("SetFaults took an invalid map")
	}
}

func TestStartFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		s0, s1, s2 := spec(0), spec(1), spec(2)
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{
			s0.ID: {Start: "hang"}, s1.ID: {Start: "fail"}, s2.ID: {Start: "3s"},
		}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t0 := time.Now()
		if err := rt.Ensure(ctx, s0); !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) != time.Minute {
			t.Errorf("hang: %v after %s", err, time.Since(t0))
		}
		if err := rt.Ensure(context.Background(), s1); !errors.Is(err, sim.ErrInjected) {
			t.Errorf("fail: %v", err)
		}
		t0 = time.Now()
		if err := rt.Ensure(context.Background(), s2); err != nil || time.Since(t0) != 3*time.Second {
			t.Errorf("delay: %v after %s", err, time.Since(t0))
		}
		got := names(t, rt)
		if got[s0.Name] || got[s1.Name] || !got[s2.Name] {
			t.Errorf("running: %v", got)
		}
		// Ensure of a running zone with its config is a no-op; with another, an error.
		if err := rt.Ensure(context.Background(), s2); err != nil {
			t.Errorf("second ensure: %v", err)
		}
		other := s2
		other.Hash = "different"
		if err := rt.Ensure(context.Background(), other); err == nil {
			t.Error("ensure with another config succeeded")
		}
	})
}

// A start that takes long or hangs says so through the progress reporter,
// while it waits.
func TestStartReportsProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		s0, s1, s2 := spec(0), spec(1), spec(2)
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s0.ID: {Start: "hang"}, s1.ID: {Start: "3s"}, s2.ID: {Stop: "2s"}}})
		for _, c := range []struct {
			s    zone.Spec
			want string
		}{{s0, "start hangs (sim fault)"}, {s1, "starting (simulated delay 3s)"}} {
			var got []string
			ctx, cancel := context.WithTimeout(zone.WithProgress(context.Background(), func(m string) { got = append(got, m) }), time.Minute)
			rt.Ensure(ctx, c.s)
			cancel()
			if len(got) != 1 || got[0] != c.want {
				t.Errorf("%s: progress %q, want %q", c.s.Name, got, c.want)
			}
		}
		if err := rt.Ensure(context.Background(), s2); err != nil {
			t.Fatal(err)
		}
		var got []string
		if err := rt.Destroy(zone.WithProgress(context.Background(), func(m string) { got = append(got, m) }), s2.Name); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != "stopping (simulated delay 2s)" {
			t.Errorf("destroy: progress %q", got)
		}
	})
}

func TestZoneDeletedDuringStartIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{StartDelay: func(zone.Spec) time.Duration { return time.Hour }})
		s := spec(0)
		errc := make(chan error)
		go func() { errc <- rt.Ensure(context.Background(), s) }()
		time.Sleep(time.Second)
		if !rt.Vanish(s.Name) {
			t.Fatal("zone did not exist while starting")
		}
		err := <-errc
		var gone *zone.GoneError
		if !errors.Is(err, zone.ErrGone) || !errors.As(err, &gone) || gone.Name != s.Name {
			t.Fatalf("err = %v, want a GoneError for %s", err, s.Name)
		}
	})
}

func TestVanishAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		notified := 0
		rt.SetNotify(func() { notified++ })
		s0, s1 := spec(0), spec(1)
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s0.ID: {VanishAfter: "10s"}}})
		rt.Ensure(context.Background(), s0)
		rt.Ensure(context.Background(), s1)
		time.Sleep(9 * time.Second)
		if got := names(t, rt); !got[s0.Name] {
			t.Fatalf("vanished early: %v", got)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := names(t, rt); len(got) != 1 || !got[s1.Name] || notified != 1 {
			t.Fatalf("after vanish: %v, notified %d", got, notified)
		}
		// A new map applies to zones already running, counted from their start.
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s1.ID: {VanishAfter: "5s"}}})
		synctest.Wait()
		if got := names(t, rt); len(got) != 0 || notified != 2 {
			t.Fatalf("running zone past its new vanish_after: %v, notified %d", got, notified)
		}
	})
}

func TestDestroy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{RecordCalls: true})
		s := spec(0)
		if err := rt.Destroy(context.Background(), s.Name); err != nil {
			t.Fatalf("destroying a missing zone: %v", err)
		}
		rt.Ensure(context.Background(), s)
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s.ID: {Stop: "fail"}}})
		if err := rt.Destroy(context.Background(), s.Name); !errors.Is(err, sim.ErrInjected) {
			t.Fatalf("stop fault: %v", err)
		}
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s.ID: {Stop: "hang"}}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := rt.Destroy(ctx, s.Name); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hanging stop: %v", err)
		}
		rt.SetFaults(sim.Faults{})
		if err := rt.Destroy(context.Background(), s.Name); err != nil {
			t.Fatal(err)
		}
		if got := names(t, rt); len(got) != 0 {
			t.Fatalf("left: %v", got)
		}
		if calls := rt.Calls(); len(calls) != 6 || calls[0] != (sim.Call{Op: "destroy", Zone: s.Name}) {
			t.Fatalf("calls %v", calls)
		}
	})
}

// A health fault makes a running zone's checks fail or hang, and a start
// (or an Ensure of a zone that runs) wait until the fault is cleared.
func TestHealthFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		s := spec(0)
		ctx := context.Background()
		if err := rt.Ensure(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := rt.Healthy(ctx, s); err != nil {
			t.Fatalf("healthy zone: %v", err)
		}
		if err := rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s.ID: {Health: "fail"}}}); err != nil {
			t.Fatal(err)
		}
		if err := rt.Healthy(ctx, s); !errors.Is(err, sim.ErrInjected) {
			t.Fatalf("zone with a failing health: %v", err)
		}
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := rt.Ensure(hctx, s); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not ready") {
			t.Fatalf("Ensure of an unhealthy zone: %v", err)
		}
		done := make(chan error)
		go func() { done <- rt.Ensure(ctx, s) }()
		time.Sleep(10 * time.Second)
		rt.SetFaults(sim.Faults{})
		if err := <-done; err != nil {
			t.Fatalf("Ensure once healthy: %v", err)
		}
		rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{s.ID: {Health: "hang"}}})
		hctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if err := rt.Healthy(hctx, s); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hanging health check: %v", err)
		}
		if err := rt.Healthy(ctx, spec(1)); !errors.Is(err, zone.ErrGone) {
			t.Fatalf("health of a zone that does not exist: %v", err)
		}
	})
}
