package sim_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/storage"
)

func simDisk(serial string) storage.DiskIdentity {
	return storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: serial}
}

func TestParseDiskFaults(t *testing.T) {
	good := `{"zones":{},"disks":{"serial-1":{"ensure":"hang","present":false},"serial-2":{"ensure":"3s"}}}`
	if _, err := sim.ParseFaults([]byte(good)); err != nil {
		t.Fatalf("good map: %v", err)
	}
	for _, c := range []struct{ doc, want string }{
		{`{"zones":{},"disks":{"serial-1":{"ensure":"sometimes"}}}`, `disks["serial-1"].ensure`},
		{`{"zones":{},"disks":{"serial-1":{"ensure":"-1s"}}}`, `disks["serial-1"].ensure`},
		{`{"zones":{},"disks":{"":{}}}`, `disks[""]`},
		{`{"zones":{},"disks":{"serial-1":{"present":"no"}}}`, "present"},
		{`{"zones":{},"disks":{"serial-1":{"gone":true}}}`, "unknown field"},
	} {
		if _, err := sim.ParseFaults([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFaults(%s) = %v, want an error mentioning %q", c.doc, err, c.want)
		}
	}
	rt := sim.New(sim.Options{})
	if err := rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{"x": {Ensure: "never"}}}); err == nil {
		t.Error("SetFaults took an invalid map")
	}
}

// The sim's storage follows the Backend's contract: blank disks get pools,
// datasets are made and changed only where they differ, another id is
// refused, and everything outlives the runtime in its state file.
func TestStorageOutlivesTheRuntime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sim-state.json")
	rt, err := sim.Open(sim.Options{StateFile: file})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := simDisk("a"), simDisk("b")
	if err := rt.AddDisks(a, b, a); err != nil {
		t.Fatal(err)
	}
	disks, err := rt.Disks(ctx)
	if err != nil || len(disks) != 2 || disks[0].Identity != a || disks[0].Content != storage.ContentBlank || disks[1].Slot != 1 {
		t.Fatalf("disks: %+v, %v", disks, err)
	}
	if err := rt.CreatePool(ctx, a, "pa"); err != nil {
		t.Fatal(err)
	}
	if err := rt.CreatePool(ctx, a, "pb"); !errors.Is(err, storage.ErrNotBlank) {
		t.Errorf("second pool on a disk: %v", err)
	}
	if _, err := rt.Datasets(ctx, "pa"); err == nil {
		t.Error("datasets of a pool not open")
	}
	pool, err := rt.OpenPool(ctx, a, "pa")
	if err != nil || pool.ID != "pa" || pool.Health != "online" {
		t.Fatalf("open: %+v, %v", pool, err)
	}
	zone := storage.DatasetConfig{ID: "z", PoolID: "pa", Kind: "zone", Compression: storage.Compression{Type: "off"}}
	root := storage.DatasetConfig{ID: "r", PoolID: "pa", Kind: "zone/oxz_ntp_1", Compression: storage.Compression{Type: "off"}}
	if _, err := rt.EnsureDataset(ctx, root); err == nil {
		t.Error("a zone's root without the transient zone root")
	}
	quota := uint64(1 << 30)
	crdb := storage.DatasetConfig{ID: "c", PoolID: "pa", Kind: "cockroachdb", Quota: &quota, Compression: storage.Compression{Type: "gzip_n", Level: 3}}
	for _, ds := range []storage.DatasetConfig{zone, root, crdb} {
		if _, err := rt.EnsureDataset(ctx, ds); err != nil {
			t.Fatalf("ensure %s: %v", ds.Name(), err)
		}
	}
	other := crdb
	other.ID = "somebody-else"
	if _, err := rt.EnsureDataset(ctx, other); !errors.Is(err, storage.ErrOtherID) {
		t.Errorf("another id: %v", err)
	}

	again, err := sim.Open(sim.Options{StateFile: file, RecordCalls: true})
	if err != nil {
		t.Fatal(err)
	}
	disks, _ = again.Disks(ctx)
	if len(disks) != 2 || disks[0].Content != storage.ContentPool || disks[0].PoolID != "pa" || disks[1].Content != storage.ContentBlank {
		t.Fatalf("disks after restart: %+v", disks)
	}
	got, err := again.Datasets(ctx, "pa") // still open: mounts outlive the agent
	if err != nil || len(got) != 3 {
		t.Fatalf("datasets after restart: %+v, %v", got, err)
	}
	for _, d := range got {
		if d.Name == crdb.Name() && (d.ID != "c" || d.Quota == nil || *d.Quota != quota || d.Compression != crdb.Compression || d.Path != "/sim/pool/ext/pa/crypt/cockroachdb") {
			t.Errorf("crdb after restart: %+v", d)
		}
	}
	if err := again.ClosePool(ctx, "pa"); err != nil {
		t.Fatal(err)
	}
	if err := again.ClosePool(ctx, "pa"); err != nil {
		t.Errorf("closing a closed pool: %v", err)
	}
	if _, err := again.Datasets(ctx, "pa"); err == nil {
		t.Error("datasets of a closed pool")
	}
	again.OpenPool(ctx, a, "pa")
	if err := again.DestroyDataset(ctx, "pa", zone.Name()); err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Datasets(ctx, "pa"); len(got) != 1 || got[0].Name != crdb.Name() {
		t.Errorf("after destroying the zone root, with the roots inside it: %+v", got)
	}
	var ops []string
	for _, c := range again.Calls() {
		ops = append(ops, c.Op+" "+c.Target)
	}
	if want := "disks ;datasets oxp_pa;close_pool oxp_pa"; !strings.HasPrefix(strings.Join(ops, ";"), want) {
		t.Errorf("calls %q", ops)
	}
}

// A disk's faults apply to its calls only: ensure hangs (until the call's
// deadline), fails or delays; present false takes it out of the machine.
func TestDiskFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := sim.New(sim.Options{})
		ctx := context.Background()
		a, b, c, d := simDisk("a"), simDisk("b"), simDisk("c"), simDisk("d")
		rt.AddDisks(a, b, c, d)
		absent := false
		if err := rt.SetFaults(sim.Faults{Disks: map[string]sim.DiskFaults{
			"a": {Ensure: "hang"}, "b": {Ensure: "fail"}, "c": {Ensure: "3s"}, "d": {Present: &absent},
		}}); err != nil {
			t.Fatal(err)
		}
		disks, _ := rt.Disks(ctx)
		if len(disks) != 3 {
			t.Errorf("disks: %+v", disks)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		t0 := time.Now()
		if err := rt.CreatePool(cctx, a, "pa"); !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) != time.Minute {
			t.Errorf("hang: %v after %s", err, time.Since(t0))
		}
		if err := rt.CreatePool(ctx, b, "pb"); !errors.Is(err, sim.ErrInjected) {
			t.Errorf("fail: %v", err)
		}
		t0 = time.Now()
		if err := rt.CreatePool(ctx, c, "pc"); err != nil || time.Since(t0) != 3*time.Second {
			t.Errorf("delay: %v after %s", err, time.Since(t0))
		}
		if err := rt.CreatePool(ctx, d, "pd"); !errors.Is(err, storage.ErrNoDisk) {
			t.Errorf("absent: %v", err)
		}
		// The delay applies to the pool's dataset calls too.
		rt.OpenPool(ctx, c, "pc")
		t0 = time.Now()
		if _, err := rt.Datasets(ctx, "pc"); err != nil || time.Since(t0) != 3*time.Second {
			t.Errorf("datasets of a slow disk: %v after %s", err, time.Since(t0))
		}
		// Cleared: all normal, and the absent disk is back.
		rt.SetFaults(sim.Faults{})
		if err := rt.CreatePool(ctx, a, "pa"); err != nil {
			t.Errorf("after clearing: %v", err)
		}
		if disks, _ := rt.Disks(ctx); len(disks) != 4 {
			t.Errorf("disks after clearing: %+v", disks)
		}
	})
}

// The storage reconciler over the sim: a hung disk delays nothing else, and
// a restart over the same state file adopts everything without a write.
func TestReconcilerOverSim(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sim-state.json")
	a, b := simDisk("a"), simDisk("b")
	disks := []storage.DiskConfig{{ID: "da", Identity: a, PoolID: "pa"}, {ID: "db", Identity: b, PoolID: "pb"}}
	var datasets []storage.DatasetConfig
	for _, p := range []string{"pa", "pb"} {
		for _, kind := range []string{"zone", "zone/oxz_ntp_" + p, "debug", "crucible"} {
			datasets = append(datasets, storage.DatasetConfig{ID: p + kind, PoolID: p, Kind: kind, Compression: storage.Compression{Type: "off"}})
		}
	}
	run := func(t *testing.T, faults sim.Faults, check func(*sim.Runtime, *storage.Reconciler)) {
		synctest.Test(t, func(t *testing.T) {
			rt, err := sim.Open(sim.Options{StateFile: file, RecordCalls: true})
			if err != nil {
				t.Fatal(err)
			}
			rt.SetFaults(faults)
			rt.AddDisks(a, b)
			r := storage.New(rt, storage.Options{})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- r.Run(ctx) }()
			r.Update(disks, datasets)
			synctest.Wait()
			check(rt, r)
			cancel()
			<-done
		})
	}
	run(t, sim.Faults{Disks: map[string]sim.DiskFaults{"a": {Ensure: "hang"}}}, func(rt *sim.Runtime, r *storage.Reconciler) {
		if _, err := r.ZoneStorage("oxp_pb", "oxz_ntp_pb", storage.DatasetName("pb", "crucible")); err != nil {
			t.Errorf("disk b's zone: %v", err)
		}
		if _, err := r.ZoneStorage("oxp_pa", "oxz_ntp_pa", ""); !errors.Is(err, storage.ErrNotReady) {
			t.Errorf("disk a's zone: %v", err)
		}
	})
	run(t, sim.Faults{}, func(rt *sim.Runtime, r *storage.Reconciler) {
		for _, ds := range r.Status().Datasets {
			if !ds.Result.OK {
				t.Errorf("%s: %s", ds.Name, ds.Result.Message)
			}
		}
	})
	run(t, sim.Faults{}, func(rt *sim.Runtime, r *storage.Reconciler) {
		for _, c := range rt.Calls() {
			switch c.Op {
			case "disks", "open_pool", "datasets":
			default:
				t.Errorf("restart wrote: %+v", c)
			}
		}
	})
}

// BenchmarkDisks1000 lists a simulated machine of 1,000 disks, each with
// its pool, as the storage reconciler does at every config update.
func BenchmarkDisks1000(b *testing.B) {
	rt := sim.New(sim.Options{})
	ctx := context.Background()
	for i := range 1000 {
		id := storage.DiskIdentity{Vendor: "v", Model: "m", Serial: fmt.Sprintf("serial-%04d", i)}
		if err := rt.AddDisks(id); err != nil {
			b.Fatal(err)
		}
		if err := rt.CreatePool(ctx, id, fmt.Sprintf("pool-%04d", i)); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		disks, err := rt.Disks(ctx)
		if err != nil || len(disks) != 1000 {
			b.Fatal(len(disks), err)
		}
	}
}
