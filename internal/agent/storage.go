package agent

import (
	"context"
	"log/slog"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// The storage half of the sled config. With the sim runtime the agent runs
// the storage reconciler over the simulated machine, whose disks are the
// ones the config names; the Linux runtime's (internal/storage/btrfs, on
// real or file-backed disks) is wired when zone roots live on their
// datasets. Zone starts do not wait on storage yet: see the README.

// newStorage returns the storage reconciler for the sim runtime, nil for
// the others.
func newStorage(rt *sim.Runtime, rec *reconciler.Reconciler, log *slog.Logger) *storage.Reconciler {
	if rt == nil {
		return nil
	}
	return storage.New(rt, storage.Options{
		Log: log,
		// A durable dataset the config no longer names is destroyed only
		// once no zone that is still present uses it.
		InUse: func(name string) bool { return datasetInUse(rec.PresentSpecs(), name) },
	})
}

// datasetInUse reports whether a present zone has the named dataset as its
// root or its durable dataset.
func datasetInUse(present []zone.Spec, name string) bool {
	for _, spec := range present {
		z := spec.Config
		if d, ok := z.RootDataset(); ok && d.String() == name {
			return true
		}
		if d, ok := z.DurableDataset(); ok && d.String() == name {
			return true
		}
	}
	return false
}

// storageConfig hands the storage half of cfg to the storage reconciler,
// and its disks to the simulated machine.
func (a *Agent) storageConfig(cfg *sledconfig.Config) {
	if a.storage == nil || cfg == nil {
		return
	}
	disks := cfg.StorageDisks()
	ids := make([]storage.DiskIdentity, len(disks))
	for i, d := range disks {
		ids[i] = d.Identity
	}
	if err := a.sim.AddDisks(ids...); err != nil {
		a.log.Error("adding the config's disks to the simulated machine", "err", err)
	}
	a.storage.Update(disks, cfg.StorageDatasets())
}

// runStorage runs the storage reconciler once the zones are restored, so
// that no durable dataset of a zone still running is taken for an orphan.
func (a *Agent) runStorage(ctx context.Context) {
	select {
	case <-a.rec.Restored():
	case <-ctx.Done():
		return
	}
	a.storage.Run(ctx)
}
