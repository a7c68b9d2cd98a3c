package storage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// sled1000 is a fake machine with n disks, each carrying one of our pools
// with a crucible's three datasets (the transient zone root dataset, the
// crucible's root and its durable dataset), and the storage config for
// it: the shape of a sled running 1,000 crucibles.
func sled1000(n int) (*fakeBackend, []storage.DiskConfig, []storage.DatasetConfig) {
	b := newFake()
	ns := uuid.MustParse("6ba7b812-9dad-11d1-80b4-00c04fd430c8")
	id := func(s string) string { return uuid.NewSHA1(ns, []byte(s)).String() }
	var disks []storage.DiskConfig
	var datasets []storage.DatasetConfig
	for i := range n {
		pool := id(fmt.Sprint("pool ", i))
		d := storage.DiskConfig{ID: id(fmt.Sprint("disk ", i)), Identity: ident(pool), PoolID: pool}
		b.addPool(d.Identity.Serial, pool)
		disks = append(disks, d)
		zone := "oxz_crucible_" + id(fmt.Sprint("zone ", i))
		for _, kind := range []string{"zone", "zone/" + zone, "crucible"} {
			datasets = append(datasets, dsCfg(id(pool+kind), pool, kind))
		}
	}
	return b, disks, datasets
}

// running starts a reconciler over b (outside any bubble) and waits,
// bounded, until every disk and dataset of the config is ok.
func running(b testing.TB, fb *fakeBackend, disks []storage.DiskConfig, datasets []storage.DatasetConfig) (*storage.Reconciler, func()) {
	r := storage.New(fb, storage.Options{Period: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop := func() { cancel(); <-done }
	r.Update(disks, datasets)
	if err := roundDone(r, time.Time{}, len(disks)); err != nil {
		stop()
		b.Fatal(err)
	}
	return r, stop
}

// roundDone waits, bounded, until every one of n disks is ok with a pass
// that finished after since, and every dataset is ok.
func roundDone(r *storage.Reconciler, since time.Time, n int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		st := r.Status()
		done := len(st.Disks) == n
		for _, d := range st.Disks {
			done = done && d.Result.OK && d.CheckedAt != nil && d.CheckedAt.After(since)
		}
		for _, d := range st.Datasets {
			done = done && d.Result.OK
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the round of passes since %s did not end within a minute", since)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkRound1000 is one round of passes of 1,000 disks (3,000
// datasets) that finds everything as configured, as the period (or a Poke)
// asks for: from the Poke until every disk's pass is published.
// publishes/round is how many snapshots the round published.
func BenchmarkRound1000(b *testing.B) {
	fb, disks, datasets := sled1000(1000)
	r, stop := running(b, fb, disks, datasets)
	defer stop()
	v0 := r.Status().Version
	rounds := 0
	for b.Loop() {
		t0 := time.Now()
		r.Poke()
		if err := roundDone(r, t0, len(disks)); err != nil {
			b.Fatal(err)
		}
		rounds++
	}
	b.ReportMetric(float64(r.Status().Version-v0)/float64(rounds), "publishes/round")
}

// BenchmarkPublish1000 builds and publishes one snapshot of 1,000 disks
// and 3,000 datasets, all ok, after a pass of every disk.
func BenchmarkPublish1000(b *testing.B) {
	fb, disks, datasets := sled1000(1000)
	r, stop := running(b, fb, disks, datasets)
	stop()
	for b.Loop() {
		storage.Publish(r)
	}
}

// BenchmarkFirstRound1000 is a reconciler's first round over 1,000 disks
// whose pools are there, closed and empty: every pool opened, every one of
// the 3,000 datasets made, every disk becoming ready one after another.
func BenchmarkFirstRound1000(b *testing.B) {
	publishes := uint64(0)
	for b.Loop() {
		b.StopTimer()
		fb, disks, datasets := sled1000(1000)
		b.StartTimer()
		r, stop := running(b, fb, disks, datasets)
		publishes += r.Status().Version
		stop()
	}
	b.ReportMetric(float64(publishes)/float64(b.N), "publishes/round")
}
