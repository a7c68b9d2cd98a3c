package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/localstorage"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
)

// The pools' local storage allocations (POST and DELETE /local-storage):
// each is a directory in its pool's local_storage_unencrypted dataset
// holding the volume a VMM's delegated zvol names (internal/localstorage).
// With the Linux runtime the dataset is a real directory of the pool's
// btrfs; the sim runtime's datasets have no files, so each of its
// local_storage_unencrypted datasets stands as a directory in the data dir
// (simDatasetsDir), made when an allocation first needs it, whose volumes
// VMMs open as on Linux. Either way the allocations are files on disk,
// found again by a restarted agent.

// simDatasetsDir, in the data dir, holds the sim runtime's datasets whose
// files the agent needs: <dir>/oxp_<pool>/local_storage_unencrypted.
const simDatasetsDir = "sim-datasets"

// localStorageKind is the dataset kind that holds the allocations.
// Upstream's encrypted kind (local_storage) is refused by the API: this
// sled has no encryption at rest.
const localStorageKind = "local_storage_unencrypted"

// ErrNoVolume: a delegated zvol names an allocation POST /local-storage has
// not made.
var ErrNoVolume = errors.New("not yet ensured (POST /local-storage makes it)")

// localStorageDir is where pool poolID's local storage allocations are: its
// ensured local_storage_unencrypted dataset (storage.PoolDataset's errors
// otherwise).
func (a *Agent) localStorageDir(poolID string) (string, error) {
	if a.storage == nil {
		return "", fmt.Errorf("pool %s: %w", storage.PoolName(poolID), storage.ErrUnknownPool)
	}
	path, err := a.storage.PoolDataset(poolID, localStorageKind)
	if err != nil {
		return "", err
	}
	if a.sim != nil {
		return a.simDatasetDir(poolID, localStorageKind), nil
	}
	return path, nil
}

// simDatasetDir is where the sim runtime's dataset of kind on poolID has
// its files.
func (a *Agent) simDatasetDir(poolID, kind string) string {
	return filepath.Join(a.cfg.DataDir, simDatasetsDir, storage.DatasetName(poolID, kind))
}

// localStorageRoots are the directories of the ensured local storage
// datasets, where a guest's disk files may lie.
func (a *Agent) localStorageRoots() []string {
	if a.storage == nil {
		return nil
	}
	if a.sim == nil {
		return a.storage.ReadyPaths("local_storage", localStorageKind)
	}
	var roots []string
	for _, d := range a.storage.ReadyDatasets(localStorageKind) {
		roots = append(roots, a.simDatasetDir(d.PoolID, d.Kind))
	}
	return roots
}

// localVolume is the file that realises pool poolID's allocation
// datasetID, for a VMM's delegated zvol: ErrNoVolume if POST
// /local-storage has not made it.
func (a *Agent) localVolume(poolID, datasetID string) (string, error) {
	dir, err := a.localStorageDir(poolID)
	if err != nil {
		return "", err
	}
	p := localstorage.Path(dir, datasetID)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", p, ErrNoVolume)
	}
	return p, nil
}

// EnsureLocalStorage makes pool poolID's allocation r unless it is there
// as asked (internal/localstorage.Ensure).
func (a *Agent) EnsureLocalStorage(ctx context.Context, poolID string, r localstorage.Request) error {
	if err := r.Check(); err != nil {
		return err
	}
	dir, err := a.localStorageDir(poolID)
	if err != nil {
		return err
	}
	if err := a.lockLocalStorage(ctx); err != nil {
		return err
	}
	defer func() { <-a.localOp }()
	if a.sim != nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	created, err := localstorage.Ensure(dir, r)
	if err == nil && created {
		a.log.Info("local storage allocation made", "pool", poolID, "dataset", r.DatasetID, "volume_bytes", r.VolumeSize, "path", localstorage.Path(dir, r.DatasetID))
	}
	return err
}

// DeleteLocalStorage removes pool poolID's allocation datasetID, unless a
// registered VMM has its volume as a disk (vmm.ErrFileHeld naming the
// VMM). One that is not there is not an error.
func (a *Agent) DeleteLocalStorage(ctx context.Context, poolID, datasetID string) error {
	dir, err := a.localStorageDir(poolID)
	if err != nil {
		return err
	}
	if err := a.lockLocalStorage(ctx); err != nil {
		return err
	}
	defer func() { <-a.localOp }()
	remove := func() error {
		gone, err := localstorage.Remove(dir, datasetID)
		if err == nil && gone {
			a.log.Info("local storage allocation removed", "pool", poolID, "dataset", datasetID)
		}
		return err
	}
	id, err := fileID(localstorage.Path(dir, datasetID))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// No volume (an allocation half made, or none): nothing a VMM
		// can hold.
		return remove()
	case err != nil:
		return err
	}
	return a.vmms.WhileFree(id, remove)
}

// lockLocalStorage waits its turn to change the allocations, until ctx
// ends.
func (a *Agent) lockLocalStorage(ctx context.Context) error {
	select {
	case a.localOp <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for an earlier change of the local storage allocations: %w", ctx.Err())
	}
}

// fileID is the device and inode of the file at path, a symbolic link's
// own.
func fileID(path string) (diskfile.ID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return diskfile.ID{}, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	return diskfile.ID{Dev: st.Dev, Ino: st.Ino}, nil
}
