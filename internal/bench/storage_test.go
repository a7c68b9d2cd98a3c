package bench

import (
	"bytes"
	"context"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// A small run of the storage benchmark on the simulated machine works: the
// example's 10 disks and 54 datasets ensured from nothing, no-op passes
// timed, a restart adopting them. The figures are for `sled-agent bench
// storage`, not for a test.
func TestStorageSimRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Storage(ctx, StorageOptions{Runtime: "sim", Rounds: 1, Passes: 3, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Disks != 10 || res.Datasets != 54 || res.Zones != 0 || len(res.Rounds) != 1 {
		t.Fatalf("%d disks, %d datasets, %d zones, %d rounds", res.Disks, res.Datasets, res.Zones, len(res.Rounds))
	}
	r := res.Rounds[0]
	if r.FromNothingMs <= 0 || r.RestartAdoptMs <= 0 || r.NoopPass.N != 3 || r.NoopPass.MaxMs <= 0 || res.NoopPass.N != 3 {
		t.Errorf("round %+v, result %+v", r, res)
	}
	// The sim's machine logs nothing: no change count is made up for it.
	if res.FromNothingChanges != nil || res.NoopPassChanges != nil || res.RestartAdoptChanges != nil {
		t.Errorf("change counts %v %v %v with the sim runtime", res.FromNothingChanges, res.NoopPassChanges, res.RestartAdoptChanges)
	}
}

// The change counter counts what the btrfs backend logs at info and above,
// through the loggers the agent derives (a sled id, then the storage
// component, then the backend's own), and nothing any other component logs.
func TestBackendChangesCountsOnlyTheBackend(t *testing.T) {
	var n atomic.Int64
	var out bytes.Buffer
	log := slog.New(&backendChanges{next: slog.NewTextHandler(&out, nil), n: &n}).With("sled_id", "s")
	storageLog := log.With("component", "storage")
	backend := storageLog.With("component", "storage-btrfs")
	backend.Info("created pool")
	backend.Warn("synthetic disk not attached")
	backend.Debug("not a change")
	backend.WithGroup("g").Info("set quota")
	storageLog.Info("pool managed")
	log.With("component", "reconciler").Info("zone started")
	backend.With("component", "other").Info("not the backend")
	if got := n.Load(); got != 3 {
		t.Errorf("counted %d records, want 3", got)
	}
	// Every record still reaches the next handler (at its level).
	if lines := strings.Count(out.String(), "\n"); lines != 6 {
		t.Errorf("%d records passed on, want 6:\n%s", lines, out.String())
	}
}

// The benchmark's config is the example's storage on the run's own disks:
// the example's 10 disks and 54 datasets with their ids, synthetic
// identities named by the prefix, new pool ids, and no zone; the agent's
// parser and validation accept it.
func TestExampleStorageIsTheExampleOnOwnDisks(t *testing.T) {
	ex, err := sledconfig.Parse(sledconfig.Example())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := exampleStorage("bstest-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := sledconfig.Parse(sc.doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := sledconfig.Validate(c); err != nil {
		t.Fatal(err)
	}
	if len(c.Zones) != 0 || sc.disks != 10 || sc.datasets != 54 || len(c.StorageDisks()) != 10 || len(c.StorageDatasets()) != 54 || len(sc.vdevs) != 10 {
		t.Fatalf("%d zones, %d/%d disks, %d/%d datasets, %d vdevs", len(c.Zones), sc.disks, len(c.StorageDisks()), sc.datasets, len(c.StorageDatasets()), len(sc.vdevs))
	}
	exPools := map[string]bool{}
	for _, d := range ex.StorageDisks() {
		exPools[d.PoolID] = true
	}
	pools := map[string]bool{}
	for _, d := range c.StorageDisks() {
		name, ok := strings.CutPrefix(d.Identity.Serial, "synthetic-serial-")
		if !ok || !slices.Contains(sc.vdevs, name) || !strings.HasPrefix(name, "bstest-") || d.Identity.Vendor != "synthetic-vendor" || d.Identity.Model != "synthetic-model-U2" {
			t.Errorf("disk %s: identity %+v, vdevs %v", d.ID, d.Identity, sc.vdevs)
		}
		if exPools[d.PoolID] {
			t.Errorf("disk %s keeps the example's pool id %s", d.ID, d.PoolID)
		}
		pools[d.PoolID] = true
	}
	exDatasets := map[string]storage.DatasetConfig{}
	for _, d := range ex.StorageDatasets() {
		exDatasets[d.ID] = d
	}
	for _, d := range c.StorageDatasets() {
		e, ok := exDatasets[d.ID]
		if !ok || !pools[d.PoolID] || e.Kind != d.Kind || !reflect.DeepEqual(e.Quota, d.Quota) || e.Compression != d.Compression {
			t.Errorf("dataset %s: %+v, the example's %+v", d.ID, d, e)
		}
	}
}
