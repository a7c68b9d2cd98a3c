package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// The storage half of the sled config. With the sim runtime the agent runs
// the storage reconciler over the simulated machine, whose disks are the
// ones the config names; with the Linux runtime over btrfs
// (internal/storage/btrfs) on the host's disks and the file-backed ones in
// --vdev-dir. A zone starts only once its storage is ready (zoneStorage).
// Both backends report disks that come and go (storage.DiskWatcher: the
// sim's "present" fault; on Linux the kernel's uevents and the vdev dir's
// files), which the reconciler follows at once; its period is the safety
// net.

// newStorage returns the storage reconciler over the runtime's machine.
func newStorage(cfg Config, rt *sim.Runtime, rec *reconciler.Reconciler, log *slog.Logger) (*storage.Reconciler, error) {
	var backend storage.Backend = rt
	if rt == nil {
		b, err := newBtrfs(cfg, log)
		if err != nil {
			return nil, err
		}
		backend = b
	}
	return storage.New(backend, storage.Options{
		Log:    log,
		Period: cfg.StoragePeriod,
		// Zones waiting for their storage are looked at again at once.
		OnReadyChange: rec.StorageChanged,
		// A durable dataset the config no longer names is destroyed only
		// once no zone that is still present uses it.
		InUse: func(name string) bool { return datasetInUse(rec.PresentSpecs(), name) },
	}), nil
}

// newBtrfs returns the Linux storage backend cfg describes.
func newBtrfs(cfg Config, log *slog.Logger) (*btrfs.Backend, error) {
	b, err := btrfs.New(btrfs.Options{
		VdevDir:  cfg.VdevDir,
		PoolRoot: poolRoot(cfg),
		// An agent with a tag of its own (tests, the crash test,
		// benchmarks) looks only at its own file-backed disks, never at
		// the host's.
		Tag: cfg.ZoneTag,
		// What it attaches is recorded in the data dir, so that a teardown
		// releases it without being told the vdev dir again.
		LoopRecord: filepath.Join(cfg.DataDir, LoopRecordFile),
		Log:        log,
	})
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return b, nil
}

// LoopRecordFile, in the data dir, records the vdev files the storage
// backend attached loop devices to (btrfs.Options.LoopRecord).
const LoopRecordFile = "vdev-loops.json"

// poolRoot is where the pools are mounted: --pool-root, by default
// <data-dir>/storage.
func poolRoot(cfg Config) string { return cmp.Or(cfg.PoolRoot, filepath.Join(cfg.DataDir, "storage")) }

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
	if a.sim != nil {
		if err := a.sim.AddDisks(ids...); err != nil {
			a.log.Error("adding the config's disks to the simulated machine", "err", err)
		}
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

// zoneStorage is the storage reconciler as the zone reconciler sees it
// (reconciler.Storage): where a zone's root and durable dataset are, or
// what is missing. s is set before the zone reconciler runs.
type zoneStorage struct{ s *storage.Reconciler }

func (zs *zoneStorage) ZoneStorage(z *sledconfig.Zone) (zone.Storage, error) {
	if z.FilesystemPool == nil {
		// Upstream's reconciler fails such a zone the same way.
		return zone.Storage{}, errors.New("zone config is missing a filesystem pool")
	}
	durable := ""
	if d, ok := z.DurableDataset(); ok {
		durable = d.String()
	}
	p, err := zs.s.ZoneStorage(*z.FilesystemPool, z.Name(), durable)
	if err != nil {
		return zone.Storage{}, err
	}
	return zone.Storage{Root: p.Root, Data: p.Durable}, nil
}
