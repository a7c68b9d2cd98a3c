// Package localstorage realises upstream's local storage allocations
// (POST and DELETE /local-storage) in a directory: the pool's
// local_storage_unencrypted dataset. An allocation is a directory named by
// its dataset id holding one volume file, "vol", of the volume's size:
//
//	<dataset dir>/<dataset_id>/vol
//
// Upstream makes the allocation a child dataset of the pool's
// local_storage_unencrypted dataset ("oxp_<pool>/local_storage_unencrypted/
// <dataset_id>", its quota and reservation dataset_size) holding a raw zvol
// "vol" of volume_size, which the VMM's zone is given as
// /dev/zvol/rdsk/oxp_<pool>/local_storage_unencrypted/<dataset_id>/vol
// (omicron sled-agent/src/sled_agent.rs create_local_storage_dataset,
// common DelegatedZvol). Here:
//
//   - the allocation is a plain directory, not a dataset (a btrfs
//     subvolume is another device, and a guest's disk file must be on its
//     root's: internal/vmm/diskfile), so dataset_size is checked (at least
//     volume_size) but neither reserved nor enforced as a quota;
//   - the volume is a sparse regular file, its space taken as the guest
//     writes it, not a zvol whose space the reservation holds;
//   - a volume that exists with another size is a conflict (409) naming
//     both sizes, where upstream's zfs answers a value mismatch with a 500;
//     in both nothing is changed.
//
// What exists is the files themselves: an agent that restarts finds every
// allocation as it was, nothing of it is kept anywhere else.
package localstorage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/uuid"
)

// Volume is the volume file's name inside its allocation's directory, as
// upstream names the zvol.
const Volume = "vol"

// tmpVolume is the volume being made; renamed to Volume once its size is
// set and synced, so that a crash never leaves a volume of another size.
const tmpVolume = ".vol.tmp"

// Granularity is what a volume's size must be a multiple of: both block
// sizes a disk may have (512 and 4096) divide it.
const Granularity = 4096

// Errors for decisions; the errors returned wrap one and name the problem.
var (
	// ErrInvalid: the request itself is wrong (sizes, ids). Nothing changed.
	ErrInvalid = errors.New("invalid local storage request")
	// ErrConflict: the allocation exists otherwise than asked. Nothing
	// changed.
	ErrConflict = errors.New("local storage allocation exists otherwise")
)

// Request is an allocation to ensure.
type Request struct {
	DatasetID   string
	DatasetSize uint64
	VolumeSize  uint64
}

// Check judges a request without touching anything.
func (r Request) Check() error {
	if err := checkID(r.DatasetID); err != nil {
		return err
	}
	switch {
	case r.VolumeSize == 0:
		return fmt.Errorf("%w: volume_size 0: a volume needs at least %d bytes", ErrInvalid, Granularity)
	case r.VolumeSize%Granularity != 0:
		return fmt.Errorf("%w: volume_size %d is not a multiple of %d bytes", ErrInvalid, r.VolumeSize, Granularity)
	case r.DatasetSize < r.VolumeSize:
		return fmt.Errorf("%w: dataset_size %d is less than volume_size %d: the dataset holds the volume", ErrInvalid, r.DatasetSize, r.VolumeSize)
	}
	return nil
}

func checkID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 || u.String() != id {
		return fmt.Errorf("%w: dataset_id %q is not a UUID in lower case", ErrInvalid, id)
	}
	return nil
}

// Path is where the volume of allocation datasetID is in dir.
func Path(dir, datasetID string) string { return filepath.Join(dir, datasetID, Volume) }

// Ensure makes the allocation r in dir, the pool's local storage dataset,
// unless it exists with the same volume size: created says whether
// anything was made. A volume of another size is ErrConflict.
func Ensure(dir string, r Request) (created bool, err error) {
	if err := r.Check(); err != nil {
		return false, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false, fmt.Errorf("the local storage dataset %s: %w", dir, err)
	}
	defer root.Close()
	vol := filepath.Join(r.DatasetID, Volume)
	switch st, err := root.Lstat(r.DatasetID); {
	case errors.Is(err, fs.ErrNotExist):
		if err := root.Mkdir(r.DatasetID, 0o700); err != nil {
			return false, err
		}
		created = true
	case err != nil:
		return false, err
	case !st.IsDir():
		return false, fmt.Errorf("%w: %s is a %s, not an allocation's directory", ErrConflict, filepath.Join(dir, r.DatasetID), st.Mode().Type())
	}
	switch st, err := root.Lstat(vol); {
	case err == nil && !st.Mode().IsRegular():
		return false, fmt.Errorf("%w: %s is a %s, not a volume", ErrConflict, filepath.Join(dir, vol), st.Mode().Type())
	case err == nil && uint64(st.Size()) != r.VolumeSize:
		return false, fmt.Errorf("%w: the volume %s holds %d bytes, not volume_size %d (a volume is never resized)", ErrConflict, filepath.Join(dir, vol), st.Size(), r.VolumeSize)
	case err == nil:
		return created, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, err
	}
	tmp := filepath.Join(r.DatasetID, tmpVolume)
	f, err := root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	err = f.Truncate(int64(r.VolumeSize))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, vol)
	}
	if err != nil {
		root.Remove(tmp)
		return false, fmt.Errorf("making the volume %s: %w", filepath.Join(dir, vol), err)
	}
	if err := syncDir(root, r.DatasetID); err != nil {
		return true, err
	}
	return true, syncDir(root, ".")
}

// Remove removes allocation datasetID from dir, its volume and all: gone
// says whether there was one. An allocation that is not there is not an
// error.
func Remove(dir, datasetID string) (gone bool, err error) {
	if err := checkID(datasetID); err != nil {
		return false, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false, fmt.Errorf("the local storage dataset %s: %w", dir, err)
	}
	defer root.Close()
	switch st, err := root.Lstat(datasetID); {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case !st.IsDir():
		return false, fmt.Errorf("%w: %s is a %s, not an allocation's directory", ErrConflict, filepath.Join(dir, datasetID), st.Mode().Type())
	}
	if err := root.RemoveAll(datasetID); err != nil {
		return false, fmt.Errorf("removing %s: %w", filepath.Join(dir, datasetID), err)
	}
	return true, syncDir(root, ".")
}

func syncDir(root *os.Root, name string) error {
	d, err := root.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
