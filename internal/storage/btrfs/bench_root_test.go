package btrfs

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// sled is what a sled's config asks of 10 disks: 10 pools and 54
// datasets (on each pool zone, debug and crucible; 24 zone roots).
func sled(r *rig) ([]storage.DiskConfig, []storage.DatasetConfig) {
	var disks []storage.DiskConfig
	var ds []storage.DatasetConfig
	for i := range 10 {
		d := storage.DiskConfig{ID: uuid.NewString(), Identity: r.id(fmt.Sprint(i)), PoolID: uuid.NewString()}
		disks = append(disks, d)
		zone := dataset(d.PoolID, "zone")
		debug := dataset(d.PoolID, "debug")
		debug.Quota = ptr(uint64(100 << 20))
		debug.Compression = storage.Compression{Type: "gzip_n", Level: 9}
		crucible := dataset(d.PoolID, "crucible")
		crucible.Reservation = ptr(uint64(10 << 20))
		crucible.Compression = storage.Compression{Type: "lz4"}
		ds = append(ds, zone, debug, crucible)
	}
	for i := range 24 {
		z := dataset(disks[i%10].PoolID, "zone/oxz_crucible_"+uuid.NewString())
		z.Quota = ptr(uint64(50 << 20))
		ds = append(ds, z)
	}
	return disks, ds
}

func newSledRig(b *testing.B) (*rig, []storage.DiskConfig, []storage.DatasetConfig) {
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprint(i)
	}
	r := newRig(b, names...)
	disks, ds := sled(r)
	return r, disks, ds
}

// converge does what a first reconciliation does: list disks, make and
// open every pool, ensure every dataset.
func converge(b *testing.B, r *rig, disks []storage.DiskConfig, ds []storage.DatasetConfig) {
	ctx := context.Background()
	found, err := r.b.Disks(ctx)
	if err != nil || len(found) != len(disks) {
		b.Fatalf("Disks = %d, %v", len(found), err)
	}
	for _, d := range disks {
		if err := r.b.CreatePool(ctx, d.Identity, d.PoolID); err != nil {
			b.Fatal(err)
		}
		if _, err := r.b.OpenPool(ctx, d.Identity, d.PoolID); err != nil {
			b.Fatal(err)
		}
	}
	ensure(b, r, ds)
}

func ensure(b *testing.B, r *rig, ds []storage.DatasetConfig) {
	for _, d := range ds {
		if _, err := r.b.EnsureDataset(context.Background(), d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSled: 10 pools and 54 datasets from blank disks, and a pass of
// EnsureDataset over all 54 that changes nothing.
// sudo go test -run - -bench Sled -benchtime 3x ./internal/storage/btrfs/
func BenchmarkSled(b *testing.B) {
	b.Run("from-nothing", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			r, disks, ds := newSledRig(b)
			b.StartTimer()
			converge(b, r, disks, ds)
			b.StopTimer()
			r.cleanup()
			b.StartTimer()
		}
	})
	b.Run("no-change-pass", func(b *testing.B) {
		r, disks, ds := newSledRig(b)
		converge(b, r, disks, ds)
		r.rec.take()
		for b.Loop() {
			ensure(b, r, ds)
		}
		if c := changes(r.rec.take()); len(c) != 0 {
			b.Fatalf("a pass that changes nothing ran %q", c)
		}
	})
}
