package storage_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// quietSled is n disks, each with our pool and two datasets, all made.
func quietSled(t *testing.T, n int) (*fakeBackend, []storage.DiskConfig, []storage.DatasetConfig) {
	t.Helper()
	b := newFake()
	var disks []storage.DiskConfig
	var datasets []storage.DatasetConfig
	for i := range n {
		d := diskCfg(fmt.Sprintf("%03d", i))
		b.addPool(d.Identity.Serial, d.PoolID)
		disks = append(disks, d)
		datasets = append(datasets, dsCfg("zone-"+d.PoolID, d.PoolID, "zone"), dsCfg("debug-"+d.PoolID, d.PoolID, "debug"))
	}
	return b, disks, datasets
}

// A round of passes that finds every disk as it was publishes at most two
// snapshots (the first news of it, the last has been a while, and its end),
// not one per pass or per few passes; the last says when each disk was
// checked.
func TestQuietRoundPublishesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, disks, datasets := quietSled(t, 200)
		var readyChanges int
		h := start(t, b, storage.Options{OnReadyChange: func() { readyChanges++ }})
		defer h.stop()
		h.update(disks, datasets)
		for _, d := range disks {
			wantResult(t, d.ID, h.disk(d.ID).Result, "")
		}

		time.Sleep(time.Second)
		v0, changes0, t1 := h.r.Status().Version, readyChanges, time.Now()
		h.r.Poke() // a pass of every disk, as the period asks for
		synctest.Wait()
		st := h.r.Status()
		if st.Version > v0+2 {
			t.Errorf("the round published %d snapshots, want at most 2", st.Version-v0)
		}
		for _, d := range st.Disks {
			if !d.Result.OK || d.CheckedAt == nil || !d.CheckedAt.Equal(t1) {
				t.Fatalf("disk %s after the round: %+v, checked at %v; want ok, checked at %v", d.ID, d.Result, d.CheckedAt, t1)
			}
		}
		if st.ListedAt == nil || !st.ListedAt.Equal(t1) {
			t.Errorf("listed at %v, want %v", st.ListedAt, t1)
		}
		if readyChanges != changes0 {
			t.Errorf("OnReadyChange called %d times by a round that changed nothing", readyChanges-changes0)
		}
	})
}

// While another disk's pass is in flight, a pass that finds its disk as it
// was is published within 100ms (only when it was checked changed), and one
// that changes what a reader sees is published at once.
func TestPassPublishedWhileAnotherRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, disks, datasets := quietSled(t, 2)
		slow, quiet := disks[0], disks[1]
		h := start(t, b, storage.Options{})
		defer h.stop()
		h.update(disks, datasets)

		b.setDelay("open_pool", storage.PoolName(slow.PoolID), time.Hour)
		time.Sleep(time.Second)
		t1 := time.Now()
		h.r.Poke()
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if at := h.disk(quiet.ID).CheckedAt; at == nil || !at.Equal(t1) {
			t.Errorf("the quiet disk, 100ms after its pass: checked at %v, want %v", at, t1)
		}

		// Its disk starts failing: the status says so at once.
		b.setFail(quiet.Identity.Serial, fmt.Errorf("injected"))
		t2 := time.Now()
		h.r.Poke()
		synctest.Wait()
		if time.Since(t2) != 0 {
			t.Fatalf("%s passed", time.Since(t2))
		}
		st := h.disk(quiet.ID)
		wantResult(t, "quiet disk, failing", st.Result, "injected")
		if st.CheckedAt == nil || !st.CheckedAt.Equal(t2) || st.Attempts != 1 {
			t.Errorf("quiet disk, failing: %+v", st)
		}
		if _, err := h.r.ZoneStorage(storage.PoolName(quiet.PoolID), "oxz_ntp", ""); err == nil {
			t.Error("ZoneStorage of a failing disk's pool: ready")
		}
	})
}

// A config put again with its storage as it was asks every disk for a
// pass, but not a disk whose pass began less than a second ago: configs
// put back to back do not each cost a pass of every disk.
func TestSameStoragePutAgainRechecksAtMostOnceASecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, disks, datasets := quietSled(t, 3)
		h := start(t, b, storage.Options{})
		defer h.stop()
		h.update(disks, datasets)
		opens := func() int { return len(b.callTimes("open_pool", storage.PoolName(disks[0].PoolID))) }

		time.Sleep(time.Second)
		n0, t1 := opens(), time.Now()
		h.update(disks, datasets)
		if got := opens(); got != n0+1 {
			t.Fatalf("put again a second later: %d passes, want 1", got-n0)
		}
		if at := h.disk(disks[0].ID).CheckedAt; at == nil || !at.Equal(t1) {
			t.Errorf("checked at %v, want %v", at, t1)
		}
		time.Sleep(500 * time.Millisecond)
		h.update(disks, datasets)
		if got := opens(); got != n0+1 {
			t.Errorf("put again half a second after a pass: %d more passes, want none", got-n0-1)
		}
		time.Sleep(500 * time.Millisecond)
		h.update(disks, datasets)
		if got := opens(); got != n0+2 {
			t.Errorf("put again a second after a pass: %d passes in all, want 2", got-n0)
		}

		// A changed config is acted on at once, however recent the passes.
		extra := dsCfg("extra", disks[0].PoolID, "local_storage")
		h.update(disks, append(datasets, extra))
		wantResult(t, "the new dataset", h.dataset(extra.Name()).Result, "")
		if got := opens(); got != n0+3 {
			t.Errorf("a changed config: %d passes in all, want 3", got-n0)
		}
	})
}

// Disks becoming ready one after another (a first round) publish once per
// batch of finished passes, not once per disk. Each publish that changes
// readiness takes a millisecond of the loop's (virtual) time, as a publish
// of a large sled takes real time: the passes that end meanwhile wait, and
// are taken in the next batch, whatever the order the goroutines happen to
// be scheduled in.
func TestFirstRoundPublishesPerBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, disks, datasets := quietSled(t, 200)
		h := start(t, b, storage.Options{OnReadyChange: func() { time.Sleep(time.Millisecond) }})
		defer h.stop()
		v0 := h.r.Status().Version
		h.update(disks, datasets)
		time.Sleep(time.Second)
		synctest.Wait()
		st := h.r.Status()
		for _, d := range st.Disks {
			wantResult(t, d.ID, d.Result, "")
		}
		if n := st.Version - v0; n > 20 {
			t.Errorf("the first round of 200 disks published %d snapshots, want a few", n)
		}
	})
}
