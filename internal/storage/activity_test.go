package storage_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// A disk whose call has taken a second is err with the call, for how long
// and its deadline, its datasets waiting for it, its pool not ready; the
// status says so again every second, under a new version, until the call
// ends; then the result is the pass's, and nothing is published while
// nothing is in flight.
func TestSlowCallIsErrUntilItEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addDisk(a.Identity.Serial)
		b.setDelay("create_pool", "oxp_pool-a", 5*time.Second)
		h := start(t, b, storage.Options{})
		defer h.stop()
		datasets := []storage.DatasetConfig{dsCfg("zone", a.PoolID, "zone"), dsCfg("root", a.PoolID, "zone/oxz_x"), dsCfg("crucible", a.PoolID, "crucible")}
		t0 := time.Now()
		h.update([]storage.DiskConfig{a}, datasets)

		// A call under a second is no news.
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		wantResult(t, "a at 999ms", h.disk(a.ID).Result, "not yet managed: its first pass has not finished")
		v := h.r.Status().Version

		for sec := 1; sec <= 4; sec++ {
			time.Sleep(time.Until(t0.Add(time.Duration(sec) * time.Second)))
			synctest.Wait()
			call := fmt.Sprintf("creating pool oxp_pool-a for %ds (deadline 1m0s)", sec)
			st := h.r.Status()
			if st.Version == v {
				t.Errorf("at %ds: version %d, as a second before", sec, v)
			}
			v = st.Version
			if d := h.disk(a.ID); d.Result.OK || d.Result.Message != call {
				t.Errorf("at %ds: disk %+v, want err %q", sec, d.Result, call)
			}
			for _, ds := range datasets {
				if got, want := h.dataset(ds.Name()).Result, "waiting for disk disk-a: "+call; got.OK || got.Message != want {
					t.Errorf("at %ds: dataset %s %+v, want err %q", sec, ds.Kind, got, want)
				}
			}
			_, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", "")
			if want := "pool oxp_pool-a is not managed: disk disk-a: " + call; !errors.Is(err, storage.ErrNotReady) || err.Error() != want {
				t.Errorf("at %ds: ZoneStorage: %v, want %q", sec, err, want)
			}
		}

		// The call ends: the pass goes on, and its result is the disk's.
		time.Sleep(time.Until(t0.Add(5 * time.Second)))
		synctest.Wait()
		wantResult(t, "a after the call", h.disk(a.ID).Result, "")
		for _, ds := range datasets {
			wantResult(t, ds.Kind+" after the call", h.dataset(ds.Name()).Result, "")
		}
		if _, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", storage.DatasetName(a.PoolID, "crucible")); err != nil {
			t.Errorf("ZoneStorage after the call: %v", err)
		}
		v = h.r.Status().Version
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := h.r.Status().Version; got != v {
			t.Errorf("published %d times in 10s with nothing in flight", got-v)
		}
	})
}

// A zone about to start is told its pool is not ready while the pool's
// disk is busy with a slow call, with the call; OnReadyChange says when
// that begins and ends, not every second in between; what the last pass
// read of the pool is still shown meanwhile.
func TestSlowCallHoldsZoneStorage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addPool(a.Identity.Serial, a.PoolID)
		var readyChanges atomic.Int32
		h := start(t, b, storage.Options{OnReadyChange: func() { readyChanges.Add(1) }})
		defer h.stop()
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{dsCfg("zone", a.PoolID, "zone"), dsCfg("root", a.PoolID, "zone/oxz_x")})
		if _, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", ""); err != nil {
			t.Fatalf("ZoneStorage: %v", err)
		}

		b.setDelay("datasets", "oxp_pool-a", 3*time.Second)
		n := readyChanges.Load()
		h.r.Poke()
		synctest.Wait()
		if _, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", ""); err != nil || readyChanges.Load() != n {
			t.Errorf("a call under a second: ZoneStorage %v, %d ready changes", err, readyChanges.Load()-n)
		}
		for sec := 1; sec <= 2; sec++ {
			time.Sleep(time.Second)
			synctest.Wait()
			_, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", "")
			want := fmt.Sprintf("pool oxp_pool-a is not managed: disk disk-a: listing the datasets of pool oxp_pool-a for %ds (deadline 30s)", sec)
			if !errors.Is(err, storage.ErrNotReady) || err.Error() != want {
				t.Errorf("at %ds: ZoneStorage: %v, want %q", sec, err, want)
			}
			if got := readyChanges.Load() - n; got != 1 {
				t.Errorf("at %ds: %d ready changes, want 1", sec, got)
			}
			if st := h.r.Status(); len(st.Observed.Pools) != 1 || len(st.Observed.Datasets) != 2 {
				t.Errorf("at %ds: observed pools %+v, datasets %+v", sec, st.Observed.Pools, st.Observed.Datasets)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if _, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", ""); err != nil {
			t.Errorf("after the call: ZoneStorage: %v", err)
		}
		if got := readyChanges.Load() - n; got != 2 {
			t.Errorf("after the call: %d ready changes, want 2", got)
		}
	})
}

// A disk pulled out while its call hangs is reported gone as soon as a
// listing no longer shows it, not when the call gives up; its datasets and
// pool with it. The call here heeds no cancellation (as one stuck in the
// kernel may not), so the status says it is still in flight.
func TestDiskPulledOutWhileItsCallHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		b.stuck = true
		a := diskCfg("a")
		b.addPool(a.Identity.Serial, a.PoolID)
		h := start(t, b, storage.Options{})
		defer h.stop()
		zone := dsCfg("zone", a.PoolID, "zone")
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{zone})
		wantResult(t, "a", h.disk(a.ID).Result, "")

		b.setHang(a.Identity.Serial, true)
		h.r.Poke()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		wantResult(t, "a, hung", h.disk(a.ID).Result, "opening pool oxp_pool-a for 2s (deadline 1m0s)")

		b.removeDisk(a.Identity.Serial)
		t1 := time.Now()
		h.r.Poke() // a listing
		synctest.Wait()
		if time.Since(t1) != 0 {
			t.Fatalf("%s passed", time.Since(t1))
		}
		gone := "disk v/m/serial-a: disk not found"
		if got, want := h.disk(a.ID).Result, gone+"; a call on it is still in flight: opening pool oxp_pool-a for 2s (deadline 1m0s)"; got.OK || got.Message != want {
			t.Errorf("a, pulled out: %+v, want err %q", got, want)
		}
		wantResult(t, "zone, pulled out", h.dataset(zone.Name()).Result, "pool oxp_pool-a is not managed: disk disk-a: "+gone)
		if _, err := h.r.ZoneStorage("oxp_pool-a", "oxz_x", ""); !errors.Is(err, storage.ErrNotReady) || !strings.Contains(err.Error(), gone) {
			t.Errorf("ZoneStorage, pulled out: %v", err)
		}
		if st := h.r.Status(); len(st.Observed.Disks) != 0 || len(st.Observed.Pools) != 0 || len(st.Observed.Datasets) != 0 {
			t.Errorf("observed, pulled out: %+v", st.Observed)
		}

		// The call gives up at its deadline: the disk is still gone.
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := h.disk(a.ID).Result; got.OK || !strings.HasPrefix(got.Message, gone) {
			t.Errorf("a, after the deadline: %+v", got)
		}
	})
}
