package reconciler_test

import (
	"errors"
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

// fakeStorage is the storage reconciler as the zone reconciler sees it:
// zones whose id is in missing have no storage yet.
type fakeStorage struct {
	mu      sync.Mutex
	missing map[string]string
	asked   map[string]int // how often, by zone id
}

func (f *fakeStorage) ZoneStorage(z *sledconfig.Zone) (zone.Storage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked == nil {
		f.asked = map[string]int{}
	}
	f.asked[z.ID]++
	if why, ok := f.missing[z.ID]; ok {
		return zone.Storage{}, errors.New(why)
	}
	return zone.Storage{Root: "/pools/" + z.Name()}, nil
}

func (f *fakeStorage) ready(id string) {
	f.mu.Lock()
	delete(f.missing, id)
	f.mu.Unlock()
}

// A zone whose storage is not ready is not started: it is waiting, naming
// what is missing (err in the last reconciliation), retried on the backoff, and started at once when storage
// says it changed, with its storage's paths; other zones start meanwhile.
func TestZoneWaitsForItsStorage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		zones := sledconfigtest.Crucibles(2)
		st := &fakeStorage{missing: map[string]string{zones[0].ID: "dataset oxp_x/crypt/zone/" + zones[0].Name() + " not yet ensured"}}
		h := start(t, reconciler.Options{Storage: st, Backoff: reconciler.Backoff{Initial: time.Minute, Max: time.Hour}}, sim.Options{})
		h.r.Update(sledconfigtest.Config(1, zones...))
		synctest.Wait()
		h.wantState(zones[1], reconciler.StateRunning)
		zs, _ := h.r.Zone(zones[0].Name())
		if zs.State != reconciler.StateWaiting || !strings.Contains(zs.WaitingFor, "storage not ready: dataset oxp_x/crypt/zone/") {
			t.Fatalf("zone without storage: %+v", zs)
		}
		if n := len(h.rec.times("ensure", zones[0].Name())); n != 0 {
			t.Fatalf("zone without storage started %d times", n)
		}
		if res := h.r.Status().Last.Zones[zones[0].ID]; res.OK || !strings.Contains(res.Message, "storage not ready") {
			t.Fatalf("result %+v", res)
		}
		time.Sleep(10 * time.Second)
		st.ready(zones[0].ID)
		h.r.StorageChanged()
		synctest.Wait()
		h.wantState(zones[0], reconciler.StateRunning)
		if got := h.rec.lastSpec(zones[0].Name()); got.Storage.Root != "/pools/"+zones[0].Name() {
			t.Fatalf("zone started with storage %+v", got.Storage)
		}
	})
}

// Waiting for storage is not failing: a zone held back many times (storage
// changing often, and never yet for it) has consumed none of its start
// failures' backoff, so when its storage is ready and its first start then
// fails, it is tried again after the backoff's first step, not its cap.
func TestStorageWaitsDoNotConsumeTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := sledconfigtest.Crucible(0)
		st := &fakeStorage{missing: map[string]string{z.ID: "pool oxp_x is not managed"}}
		h := start(t, reconciler.Options{Storage: st, Backoff: reconciler.Backoff{Initial: time.Second, Max: time.Hour}}, sim.Options{})
		h.r.Update(sledconfigtest.Config(1, z))
		for range 12 {
			synctest.Wait()
			h.r.StorageChanged()
		}
		synctest.Wait()
		if zs, _ := h.r.Zone(z.Name()); zs.State != reconciler.StateWaiting || zs.Attempts != 0 || !strings.Contains(zs.WaitingFor, "storage not ready: pool oxp_x") {
			t.Fatalf("held zone: %+v", zs)
		}
		h.faults(map[string]sim.ZoneFaults{z.ID: {Start: "fail"}})
		st.ready(z.ID)
		h.r.StorageChanged()
		synctest.Wait()
		if n := len(h.rec.times("ensure", z.Name())); n != 1 {
			t.Fatalf("%d starts once storage was ready, want 1", n)
		}
		h.faults(nil)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		h.wantState(z, reconciler.StateRunning)
	})
}

// fakeTimeSync holds the zones of the kinds in wait until released.
type fakeTimeSync struct {
	mu      sync.Mutex
	synced  bool
	waiting map[string]bool // kinds that need time
	calls   int
}

func (f *fakeTimeSync) ZoneTimeSync(z *sledconfig.Zone) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.waiting[z.ZoneType.Type] && !f.synced {
		return errors.New("time not yet synchronized: no NTP zone in the config")
	}
	return nil
}

func (f *fakeTimeSync) set(synced bool) {
	f.mu.Lock()
	f.synced = synced
	f.mu.Unlock()
}

// A zone that needs synchronized time waits for it, waiting with the reason,
// while a zone that does not starts; once time is synchronized it starts
// at once; a later loss of sync stops nothing that runs.
func TestZoneWaitsForTimeSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		crucible, dns := sledconfigtest.Crucible(0), sledconfigtest.InternalDNS(0)
		ts := &fakeTimeSync{waiting: map[string]bool{"crucible": true}}
		h := start(t, reconciler.Options{TimeSync: ts, Backoff: reconciler.Backoff{Initial: time.Hour, Max: time.Hour}}, sim.Options{})
		h.r.Update(sledconfigtest.Config(1, crucible, dns))
		synctest.Wait()
		h.wantState(dns, reconciler.StateRunning)
		zs, _ := h.r.Zone(crucible.Name())
		if zs.State != reconciler.StateWaiting || zs.Attempts != 0 || !strings.Contains(zs.WaitingFor, "time not yet synchronized: no NTP zone") {
			t.Fatalf("zone waiting for time: %+v", zs)
		}
		if res := h.r.Status().Last.Zones[crucible.ID]; res.OK || !strings.Contains(res.Message, "time not yet synchronized") {
			t.Fatalf("result %+v", res)
		}
		if n := len(h.rec.times("ensure", crucible.Name())); n != 0 {
			t.Fatalf("started %d times before time was synchronized", n)
		}
		ts.set(true)
		h.r.TimeSyncChanged()
		synctest.Wait()
		h.wantState(crucible, reconciler.StateRunning)
		ts.set(false)
		h.r.TimeSyncChanged()
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		h.wantState(crucible, reconciler.StateRunning)
		if n := len(h.rec.times("ensure", crucible.Name())); n != 1 {
			t.Fatalf("%d starts, want 1", n)
		}
	})
}

// Waiting is not failing: a zone held by the storage gate and one held by
// the time gate read waiting, each with its gate's reason and when it is
// looked at again, no failed attempt and no error of their own; the last
// reconciliation (upstream's inventory) has them err with the reason. A
// zone whose start failed before a gate held it keeps that failure's count
// and error beside its reason for waiting. Once the gates open they run,
// and nothing of the wait is left in their status.
func TestHeldZonesReadWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		forStorage, forTime, failedFirst := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1), sledconfigtest.InternalDNS(0)
		const storageWhy = "pool oxp_x is not managed"
		st := &fakeStorage{missing: map[string]string{forStorage.ID: storageWhy}}
		ts := &fakeTimeSync{waiting: map[string]bool{"crucible": true}}
		h := start(t, reconciler.Options{Storage: st, TimeSync: ts, Backoff: reconciler.Backoff{Initial: time.Minute, Max: time.Hour}}, sim.Options{})
		h.faults(map[string]sim.ZoneFaults{failedFirst.ID: {Start: "fail"}})
		h.r.Update(sledconfigtest.Config(1, forStorage, forTime, failedFirst))
		synctest.Wait()
		if zs, _ := h.r.Zone(failedFirst.Name()); zs.State != reconciler.StateFailed || zs.Attempts != 1 {
			t.Fatalf("zone whose start fails: %+v", zs)
		}
		// Its retry comes while its storage is gone.
		h.faults(nil)
		st.mu.Lock()
		st.missing[failedFirst.ID] = storageWhy
		st.mu.Unlock()
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()

		for _, tc := range []struct {
			z        sledconfig.Zone
			why      string
			attempts int
			lastErr  string
		}{
			{forStorage, "storage not ready: " + storageWhy, 0, ""},
			{forTime, "time not yet synchronized: no NTP zone in the config", 0, ""},
			{failedFirst, "storage not ready: " + storageWhy, 1, "injected"},
		} {
			zs, _ := h.r.Zone(tc.z.Name())
			if zs.State != reconciler.StateWaiting || zs.WaitingFor != tc.why || zs.Attempts != tc.attempts ||
				zs.NextRetry == nil || !strings.Contains(zs.LastError, tc.lastErr) || (tc.lastErr == "" && zs.LastError != "") {
				t.Errorf("zone %s: %+v; want waiting for %q, %d attempts, last error %q, a next look", tc.z.Name(), zs, tc.why, tc.attempts, tc.lastErr)
			}
			if last := zs.History[len(zs.History)-1]; last.Event != "start held back" || last.Detail != tc.why {
				t.Errorf("zone %s: last event %+v", tc.z.Name(), last)
			}
			res, ok := h.r.Status().Last.Zones[tc.z.ID]
			if !ok || res.OK || !strings.HasPrefix(res.Message, tc.why+" (looked at again when it changes, or at ") {
				t.Errorf("zone %s: last reconciliation %+v, want err with %q", tc.z.Name(), res, tc.why)
			}
			if n := len(h.rec.times("ensure", tc.z.Name())); n != tc.attempts {
				t.Errorf("zone %s started %d times, want %d", tc.z.Name(), n, tc.attempts)
			}
		}

		st.ready(forStorage.ID)
		st.ready(failedFirst.ID)
		h.r.StorageChanged()
		synctest.Wait()
		h.wantState(failedFirst, reconciler.StateRunning)
		if zs, _ := h.r.Zone(forStorage.Name()); zs.State != reconciler.StateWaiting || !strings.HasPrefix(zs.WaitingFor, "time not yet synchronized") {
			t.Fatalf("storage ready, time not: %+v", zs)
		}
		ts.set(true)
		h.r.TimeSyncChanged()
		synctest.Wait()
		for _, z := range []sledconfig.Zone{forStorage, forTime, failedFirst} {
			h.wantState(z, reconciler.StateRunning)
			if zs, _ := h.r.Zone(z.Name()); zs.WaitingFor != "" || zs.NextRetry != nil || zs.LastError != "" {
				t.Errorf("zone %s running: %+v", z.Name(), zs)
			}
		}
	})
}

func (f *fakeStorage) askedFor(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[id]
}

// A waiting zone's next_retry is when it is really looked at again, also
// after it was held again for the same reason (its hold's backoff grew).
func TestWaitingZonesNextLookIsTrue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := sledconfigtest.Crucible(0)
		st := &fakeStorage{missing: map[string]string{z.ID: "pool oxp_x is not managed"}}
		h := start(t, reconciler.Options{Storage: st, Backoff: reconciler.Backoff{Initial: time.Second, Max: time.Hour}}, sim.Options{})
		h.r.Update(sledconfigtest.Config(1, z))
		synctest.Wait()
		for range 3 {
			h.r.StorageChanged() // the same answer: held again, for longer
			synctest.Wait()
		}
		zs, _ := h.r.Zone(z.Name())
		if zs.State != reconciler.StateWaiting || zs.NextRetry == nil {
			t.Fatalf("held zone: %+v", zs)
		}
		next, asked := *zs.NextRetry, st.askedFor(z.ID)
		time.Sleep(time.Until(next) - time.Millisecond)
		synctest.Wait()
		if n := st.askedFor(z.ID); n != asked {
			t.Fatalf("looked at again %d times before its next_retry %v", n-asked, next)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if n := st.askedFor(z.ID); n != asked+1 {
			t.Fatalf("looked at again %d times at its next_retry %v, want once", n-asked, next)
		}
		if zs, _ := h.r.Zone(z.Name()); zs.NextRetry == nil || !zs.NextRetry.After(next) {
			t.Fatalf("after the look at %v: next_retry %v", next, zs.NextRetry)
		}
	})
}
