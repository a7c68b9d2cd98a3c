package storage_test

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// One disk whose every call hangs delays no other disk's work, nor Status,
// nor ZoneStorage; its calls give up at their deadline and are retried.
func TestHungDiskDelaysNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		dead, good := diskCfg("dead"), diskCfg("good")
		b.addDisk(dead.Identity.Serial)
		b.addDisk(good.Identity.Serial)
		b.setHang(dead.Identity.Serial, true)
		var readyChanges atomic.Int32
		h := start(t, b, storage.Options{OnReadyChange: func() { readyChanges.Add(1) }})
		defer h.stop()
		datasets := func(poolID string) []storage.DatasetConfig {
			return []storage.DatasetConfig{dsCfg("zone-"+poolID, poolID, "zone"), dsCfg("root-"+poolID, poolID, "zone/oxz_ntp_"+poolID), dsCfg("dns-"+poolID, poolID, "internal_dns")}
		}
		t0 := time.Now()
		h.update([]storage.DiskConfig{dead, good}, append(datasets(dead.PoolID), datasets(good.PoolID)...))

		// All of it happened without the clock moving: nothing waited for
		// the dead disk.
		if time.Since(t0) != 0 {
			t.Fatalf("%s passed", time.Since(t0))
		}
		wantResult(t, "good", h.disk(good.ID).Result, "")
		for _, ds := range datasets(good.PoolID) {
			wantResult(t, ds.Name(), h.dataset(ds.Name()).Result, "")
		}
		st := h.disk(dead.ID)
		wantResult(t, "dead", st.Result, "not yet managed")
		if !strings.HasPrefix(st.Activity, "creating pool oxp_pool-dead for 0s (deadline 1m0s)") {
			t.Errorf("dead disk's activity: %q", st.Activity)
		}
		paths, err := h.r.ZoneStorage(storage.PoolName(good.PoolID), "oxz_ntp_"+good.PoolID, storage.DatasetName(good.PoolID, "internal_dns"))
		if err != nil || paths.Root != "/pool/ext/oxp_pool-good/crypt/zone/oxz_ntp_pool-good" || paths.Durable != "/pool/ext/oxp_pool-good/crypt/internal_dns" {
			t.Errorf("ZoneStorage of the good disk's zone: %+v, %v", paths, err)
		}
		_, err = h.r.ZoneStorage(storage.PoolName(dead.PoolID), "oxz_ntp_"+dead.PoolID, "")
		if !errors.Is(err, storage.ErrNotReady) || !strings.Contains(err.Error(), "pool oxp_pool-dead is not managed: disk disk-dead: not yet managed") {
			t.Errorf("ZoneStorage of the dead disk's zone: %v", err)
		}
		if readyChanges.Load() == 0 {
			t.Error("OnReadyChange never called")
		}

		// A config change for the good disk is acted on at once, though the
		// dead disk's call is still in flight.
		extra := dsCfg("debug-good", good.PoolID, "debug")
		h.update([]storage.DiskConfig{dead, good}, append(append(datasets(dead.PoolID), datasets(good.PoolID)...), extra))
		wantResult(t, "extra", h.dataset(extra.Name()).Result, "")
		if time.Since(t0) != 0 {
			t.Fatalf("%s passed", time.Since(t0))
		}

		// At its deadline the dead disk's call gives up, and is retried on
		// the backoff.
		time.Sleep(time.Minute + time.Millisecond)
		synctest.Wait()
		st = h.disk(dead.ID)
		wantResult(t, "dead", st.Result, "creating pool oxp_pool-dead: no answer within 1m0s")
		if st.Attempts != 1 || st.NextRetry == nil {
			t.Errorf("dead disk not scheduled for a retry: %+v", st)
		}
		wantResult(t, "dead's root", h.dataset(storage.DatasetName(dead.PoolID, "zone/oxz_ntp_"+dead.PoolID)).Result, "pool oxp_pool-dead is not managed")

		// It comes back: the next retry adopts it.
		b.setHang(dead.Identity.Serial, false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		wantResult(t, "dead, back", h.disk(dead.ID).Result, "")
		if _, err := h.r.ZoneStorage(storage.PoolName(dead.PoolID), "oxz_ntp_"+dead.PoolID, ""); err != nil {
			t.Errorf("ZoneStorage of the dead disk's zone, back: %v", err)
		}
	})
}

// A disk dropped from the config while its call hangs: the call is
// abandoned at once, not waited for.
func TestRemovingAHungDiskAbandonsItsCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		dead := diskCfg("dead")
		b.addDisk(dead.Identity.Serial)
		b.setHang(dead.Identity.Serial, true)
		h := start(t, b, storage.Options{})
		defer h.stop()
		h.update([]storage.DiskConfig{dead}, nil)
		t0 := time.Now()
		h.update(nil, nil)
		if time.Since(t0) != 0 || len(h.r.Status().Disks) != 0 {
			t.Errorf("after %s: %+v", time.Since(t0), h.r.Status().Disks)
		}
		if got := b.transcript(0); has(got, "close_pool oxp_pool-dead") {
			t.Errorf("a pool never made was closed: %q", got)
		}
		// Back, and answering: adopted at once, not after the abandoned
		// call's deadline.
		b.setHang(dead.Identity.Serial, false)
		h.update([]storage.DiskConfig{dead}, nil)
		wantResult(t, "dead, back", h.disk(dead.ID).Result, "")
		if time.Since(t0) != 0 {
			t.Errorf("re-adding waited %s", time.Since(t0))
		}
	})
}

// A pool that stops answering in the middle of a pass costs one deadline,
// not one per dataset: the rest of its datasets are not attempted.
func TestHungPoolCostsOneDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addPool(a.Identity.Serial, a.PoolID)
		h := start(t, b, storage.Options{})
		defer h.stop()
		var datasets []storage.DatasetConfig
		for _, kind := range []string{"zone", "cockroachdb", "crucible", "debug"} {
			datasets = append(datasets, dsCfg(kind, a.PoolID, kind))
		}
		h.update([]storage.DiskConfig{a}, datasets[:1])
		b.hangOp = "ensure_dataset"
		b.setHang(a.Identity.Serial, true)
		n := b.ncalls()
		h.update([]storage.DiskConfig{a}, datasets)
		time.Sleep(30*time.Second + time.Millisecond)
		synctest.Wait()
		// One ensure (in name order: crucible's) hangs for its deadline; the others are not attempted.
		want := []string{"open_pool oxp_pool-a", "datasets oxp_pool-a", "ensure_dataset " + datasets[2].Name()}
		got := slices.DeleteFunc(b.transcript(n), func(c string) bool { return c == "disks" })
		if !slices.Equal(got, want) {
			t.Errorf("calls %q, want %q", got, want)
		}
		wantResult(t, "crucible", h.dataset(datasets[2].Name()).Result, "ensuring dataset oxp_pool-a/crucible: no answer within 30s")
		for _, ds := range []storage.DatasetConfig{datasets[1], datasets[3]} {
			wantResult(t, ds.Kind, h.dataset(ds.Name()).Result, "not attempted: ensuring dataset oxp_pool-a/crucible: no answer within 30s")
		}
		wantResult(t, "zone", h.dataset(datasets[0].Name()).Result, "")
	})
}

// Failed passes are retried on a doubling backoff, capped.
func TestRetriesCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addDisk(a.Identity.Serial)
		b.setFail(a.Identity.Serial, errors.New("i/o error"))
		h := start(t, b, storage.Options{Backoff: storage.Backoff{Initial: time.Second, Max: 8 * time.Second}})
		defer h.stop()
		h.update([]storage.DiskConfig{a}, nil)
		time.Sleep(40 * time.Second)
		synctest.Wait()
		wantResult(t, "a", h.disk(a.ID).Result, "creating pool oxp_pool-a: i/o error")
		times := b.callTimes("create_pool", "oxp_pool-a")
		var gaps []time.Duration
		for i := 1; i < len(times); i++ {
			gaps = append(gaps, times[i].Sub(times[i-1]))
		}
		want := []time.Duration{1, 2, 4, 8, 8, 8}
		if len(gaps) < len(want) {
			t.Fatalf("gaps %v", gaps)
		}
		for i, w := range want {
			if gaps[i] != w*time.Second {
				t.Errorf("gap %d: %v, want %v (gaps %v)", i, gaps[i], w*time.Second, gaps)
			}
		}

		// A config change retries at once.
		b.setFail(a.Identity.Serial, nil)
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{dsCfg("debug", a.PoolID, "debug")})
		wantResult(t, "a", h.disk(a.ID).Result, "")
	})
}

// A new reconciler over the same machine adopts everything as it is: with
// nothing different, it writes nothing.
func TestRestartAdopts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a, c := diskCfg("a"), diskCfg("c")
		b.addDisk(a.Identity.Serial)
		b.addDisk(c.Identity.Serial)
		q := dsCfg("crdb", a.PoolID, "cockroachdb")
		q.Quota, q.Reservation, q.Compression = ptr(1<<30), ptr(1<<20), storage.Compression{Type: "gzip_n", Level: 3}
		disks := []storage.DiskConfig{a, c}
		datasets := []storage.DatasetConfig{q, dsCfg("zone", a.PoolID, "zone"), dsCfg("root", a.PoolID, "zone/oxz_x"), dsCfg("debug", c.PoolID, "debug")}
		h := start(t, b, storage.Options{})
		h.update(disks, datasets)
		for _, ds := range datasets {
			wantResult(t, ds.Name(), h.dataset(ds.Name()).Result, "")
		}
		h.stop()

		n := b.ncalls()
		h = start(t, b, storage.Options{})
		defer h.stop()
		h.update(disks, datasets)
		time.Sleep(time.Hour)
		synctest.Wait()
		for _, call := range b.transcript(n) {
			op, _, _ := strings.Cut(call, " ")
			switch op {
			case "disks", "open_pool", "datasets":
			default:
				t.Errorf("restart wrote: %q", call)
			}
		}
		for _, ds := range datasets {
			wantResult(t, ds.Name(), h.dataset(ds.Name()).Result, "")
		}
	})
}

// A pool whose disk the config does not name (dropped while the agent was
// down) is closed, once, and never destroyed.
func TestUnconfiguredPoolClosedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a, gone := diskCfg("a"), diskCfg("gone")
		b.addDisk(a.Identity.Serial)
		b.addPool(gone.Identity.Serial, gone.PoolID, storage.Dataset{Name: storage.DatasetName(gone.PoolID, "crucible"), ID: "x"})
		h := start(t, b, storage.Options{})
		defer h.stop()
		if got := b.transcript(0); len(got) != 1 || got[0] != "disks" {
			t.Errorf("before any config: %q", got)
		}
		h.update([]storage.DiskConfig{a}, nil)
		time.Sleep(time.Hour)
		synctest.Wait()
		closes := 0
		for _, c := range b.transcript(0) {
			switch {
			case c == "close_pool oxp_pool-gone":
				closes++
			case strings.Contains(c, "pool-gone"):
				t.Errorf("unconfigured pool touched: %q", c)
			}
		}
		if closes != 1 {
			t.Errorf("closed %d times", closes)
		}
	})
}

// A failed listing keeps the last good one: managed disks go on.
func TestListingFailureKeepsLastListing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addDisk(a.Identity.Serial)
		h := start(t, b, storage.Options{})
		defer h.stop()
		h.update([]storage.DiskConfig{a}, nil)
		b.mu.Lock()
		b.listFail = errors.New("sysfs unreadable")
		b.mu.Unlock()
		ds := dsCfg("debug", a.PoolID, "debug")
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{ds})
		wantResult(t, "debug", h.dataset(ds.Name()).Result, "")
		if st := h.r.Status(); !strings.Contains(st.ListError, "sysfs unreadable") || len(st.Observed.Disks) != 1 {
			t.Errorf("status: list error %q, observed %+v", st.ListError, st.Observed.Disks)
		}
	})
}

// Status reports what was observed: disks, managed pools, datasets with
// when they were read.
func TestStatusObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newFake()
		a := diskCfg("a")
		b.addDisk(a.Identity.Serial)
		h := start(t, b, storage.Options{})
		defer h.stop()
		ds := dsCfg("debug", a.PoolID, "debug")
		h.update([]storage.DiskConfig{a}, []storage.DatasetConfig{ds})
		st := h.r.Status()
		if !st.Configured || st.ListedAt == nil || len(st.Observed.Disks) != 1 || st.Observed.Disks[0].Content != storage.ContentBlank {
			t.Errorf("observed disks: %+v", st)
		}
		if len(st.Observed.Pools) != 1 || st.Observed.Pools[0].ID != a.PoolID {
			t.Errorf("observed pools: %+v", st.Observed.Pools)
		}
		if len(st.Observed.Datasets) != 1 || st.Observed.Datasets[0].Dataset.Name != ds.Name() || !st.Observed.Datasets[0].ReadAt.Equal(time.Now()) {
			t.Errorf("observed datasets: %+v", st.Observed.Datasets)
		}
	})
}
