package sim_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// A disk pulled out or put back by the fault map, or added, is a disk
// event; other faults are not; the channel closes when ctx ends.
func TestDiskEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		ch := rt.DiskEvents(ctx)
		got := func() bool {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		}
		no := false
		for _, step := range []struct {
			what string
			do   func() error
			want bool
		}{
			{"disk added", func() error { return rt.AddDisks(simDisk("a")) }, true},
			{"disk added again", func() error { return rt.AddDisks(simDisk("a")) }, false},
			{"ensure fault", func() error {
				return rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{"a": {Ensure: "hang"}}})
			}, false},
			{"pulled out", func() error {
				return rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{"a": {Ensure: "hang", Present: &no}}})
			}, true},
			{"still out", func() error {
				return rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{"a": {Present: &no}}})
			}, false},
			{"put back (the map emptied)", func() error { return rt.SetFaults(sim.Faults{}) }, true},
		} {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
			if g := got(); g != step.want {
				t.Errorf("%s: event %v, want %v", step.what, g, step.want)
			}
		}
		cancel()
		synctest.Wait()
		if _, ok := <-ch; ok {
			t.Error("channel not closed when ctx ended")
		}
	})
}

// The storage reconciler over the sim reports a disk pulled out by the
// fault map at once, not at its period, and manages it again at once when
// it is put back.
func TestReconcilerFollowsPresentFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		a := simDisk("a")
		rt.AddDisks(a)
		r := storage.New(rt, storage.Options{Period: 10 * time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		r.Update([]storage.DiskConfig{{ID: "da", Identity: a, PoolID: "pa"}}, nil)
		synctest.Wait()
		result := func() storage.Result { return r.Status().Disks[0].Result }
		if res := result(); !res.OK {
			t.Fatalf("disk a: %+v", res)
		}
		t0 := time.Now()
		no := false
		rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{"a": {Present: &no}}})
		synctest.Wait()
		if res := result(); res.OK || !strings.Contains(res.Message, "disk not found") {
			t.Errorf("disk a, pulled out: %+v", res)
		}
		rt.SetFaults(sim.Faults{})
		synctest.Wait()
		if res := result(); !res.OK {
			t.Errorf("disk a, put back: %+v", res)
		}
		if time.Since(t0) != 0 {
			t.Errorf("%s passed", time.Since(t0))
		}
		cancel()
		<-done
	})
}
