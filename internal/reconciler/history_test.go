package reconciler_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// runUntil runs a reconciler over a new sim runtime until stop is called.
func runUntil(t *testing.T, opts reconciler.Options) (r *reconciler.Reconciler, stop func()) {
	t.Helper()
	rt := sim.New(sim.Options{})
	r = reconciler.New(rt, nil, opts)
	rt.SetNotify(r.Poke)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return r, stop
}

// A zone removed from the config keeps its last status and history, marked
// removed, the newest RemovedLen of them; they and every zone's history
// are in the history file within HistoryWriteEvery, and a reconciler
// started again with that file has them.
func TestRemovedZonesAndHistoriesOutliveThemAndTheAgent(t *testing.T) {
	file := filepath.Join(t.TempDir(), "zone-history.json")
	synctest.Test(t, func(t *testing.T) {
		opts := reconciler.Options{HistoryFile: file, RemovedLen: 2, HistoryWriteEvery: 5 * time.Second}
		r, stop := runUntil(t, opts)
		zones := sledconfigtest.Crucibles(4)
		r.Update(sledconfigtest.Config(1, zones...))
		synctest.Wait()
		r.Update(sledconfigtest.Config(2, zones[0]))
		synctest.Wait()
		removedAt := time.Now()

		removed := func(r *reconciler.Reconciler) int {
			n := 0
			for _, z := range zones[1:] {
				if _, ok := r.Zone(z.Name()); ok {
					t.Errorf("removed zone %s still listed", z.Name())
				}
				zs, ok := r.Removed(z.ID)
				if !ok {
					continue
				}
				n++
				if zs.RemovedAt == nil || !zs.RemovedAt.Equal(removedAt) {
					t.Errorf("zone %s removed at %v, want %v", z.Name(), zs.RemovedAt, removedAt)
				}
				if len(zs.History) < 2 || zs.History[len(zs.History)-1].Event != "removed" {
					t.Errorf("removed zone %s's history does not end with its removal: %+v", z.Name(), zs.History)
				}
			}
			return n
		}
		if n := removed(r); n != 2 {
			t.Fatalf("%d removed zones kept, want RemovedLen = 2", n)
		}
		if _, ok := r.Removed(zones[0].Name()); ok {
			t.Errorf("a wanted zone reads removed")
		}

		// Written within HistoryWriteEvery, not at once.
		if _, err := os.Stat(file); err == nil {
			t.Errorf("history file written before HistoryWriteEvery")
		}
		time.Sleep(opts.HistoryWriteEvery)
		synctest.Wait()
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("history file after %s: %v", opts.HistoryWriteEvery, err)
		}
		var doc struct {
			Zones   map[string][]reconciler.Event
			Removed []reconciler.ZoneStatus
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Removed) != 2 || len(doc.Zones[zones[0].Name()]) == 0 {
			t.Errorf("history file: %d removed zones, %d events of %s; want 2 and some", len(doc.Removed), len(doc.Zones[zones[0].Name()]), zones[0].Name())
		}
		before, _ := r.Zone(zones[0].Name())
		stop()

		// Started again: the removed zones and the histories are there.
		time.Sleep(time.Minute)
		restart := time.Now()
		r2, _ := runUntil(t, opts)
		r2.Update(sledconfigtest.Config(2, zones[0]))
		synctest.Wait()
		if n := removed(r2); n != 2 {
			t.Errorf("after a restart, %d removed zones, want 2", n)
		}
		after, ok := r2.Zone(zones[0].Name())
		if !ok || len(after.History) <= len(before.History) {
			t.Fatalf("after a restart, zone's history %+v, want the %d events before and more", after.History, len(before.History))
		}
		for i, e := range before.History {
			if a := after.History[i]; !a.At.Equal(e.At) || a.Event != e.Event || a.Detail != e.Detail {
				t.Errorf("after a restart, event %d = %+v, want %+v", i, after.History[i], e)
			}
		}
		if !after.History[len(after.History)-1].At.After(restart.Add(-time.Nanosecond)) {
			t.Errorf("no event since the restart: %+v", after.History)
		}
	})
}
