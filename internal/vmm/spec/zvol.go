package spec

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
)

// A delegated zvol is how upstream's Nexus names a disk on a pool's local
// storage: a file backend whose path is the zvol's raw device,
// /dev/zvol/rdsk/oxp_<zpool_id>/local_storage_unencrypted/<dataset_id>/vol,
// listed in the registration's local_config.delegated_zvols (upstream's
// sled agent puts that device into the VMM's zone; omicron common
// DelegatedZvol::zvol_device). This sled has no zvols: the allocation is a
// file the agent made at POST /local-storage (internal/localstorage), and
// a delegated zvol's path is mapped to it, for the VMM whose registration
// lists it and no other, and opened as judged like every disk's file.

// ZvolDir is where upstream's raw zvol devices are.
const ZvolDir = "/dev/zvol/rdsk/"

// ZvolUnencrypted and ZvolEncrypted are upstream's DelegatedZvol types.
const (
	ZvolUnencrypted = "local_storage_unencrypted"
	ZvolEncrypted   = "local_storage_encrypted"
)

// Zvol is one of local_config.delegated_zvols: a pool's local storage
// allocation (POST /local-storage) given to the VMM.
type Zvol struct {
	ZpoolID   string `json:"zpool_id"`
	DatasetID string `json:"dataset_id"`
}

// Device is the path upstream names the zvol by (an unencrypted one's: an
// encrypted one is refused when the registration is read).
func (z Zvol) Device() string {
	return ZvolDir + "oxp_" + z.ZpoolID + "/" + ZvolUnencrypted + "/" + z.DatasetID + "/vol"
}

// ParseZvol reads one of upstream's DelegatedZvol values: {"type",
// "zpool_id", "dataset_id"}. The encrypted kind is refused: this sled has
// no encryption at rest.
func ParseZvol(typ, zpoolID, datasetID string) (Zvol, error) {
	switch typ {
	case ZvolUnencrypted:
	case ZvolEncrypted:
		return Zvol{}, errors.New("type local_storage_encrypted: encrypted local storage is not supported: encryption at rest is not available on this sled")
	default:
		return Zvol{}, fmt.Errorf("type %q: want %s", typ, ZvolUnencrypted)
	}
	for _, f := range []struct{ name, v string }{{"zpool_id", zpoolID}, {"dataset_id", datasetID}} {
		if u, err := uuid.Parse(f.v); err != nil || u.String() != strings.ToLower(f.v) || len(f.v) != 36 {
			return Zvol{}, fmt.Errorf("%s %q is not a UUID", f.name, f.v)
		}
	}
	return Zvol{ZpoolID: strings.ToLower(zpoolID), DatasetID: strings.ToLower(datasetID)}, nil
}

// ErrZvolNotDelegated: a file backend names a zvol the registration's
// local_config.delegated_zvols does not list.
var ErrZvolNotDelegated = errors.New("is a zvol not delegated to this VMM (local_config.delegated_zvols does not list it)")

// OpenBackend opens a file backend's file as judged (diskfile.Open): a
// regular file with one link beneath one of sled's FileRoots, no symbolic
// link on the way, read-write unless the backend is read-only. A path
// naming one of sled's Zvols opens the file that realises it here
// (sled.LocalVolume); one naming another zvol is ErrZvolNotDelegated.
func OpenBackend(f *FileBackend, sled Sled) (*diskfile.File, error) {
	if f.BlockSize != 512 && f.BlockSize != 4096 {
		return nil, fmt.Errorf("block_size %d: want 512 or 4096", f.BlockSize)
	}
	path := f.Path
	if IsZvolPath(f.Path) {
		z, ok := delegated(filepath.Clean(f.Path), sled.Zvols)
		if !ok {
			return nil, fmt.Errorf("path %q %w", f.Path, ErrZvolNotDelegated)
		}
		if sled.LocalVolume == nil {
			return nil, fmt.Errorf("path %q: delegated zvol (pool %s, dataset %s): this sled has no local storage", f.Path, z.ZpoolID, z.DatasetID)
		}
		real, err := sled.LocalVolume(z.ZpoolID, z.DatasetID)
		if err != nil {
			return nil, fmt.Errorf("path %q: delegated zvol (pool %s, dataset %s): %w", f.Path, z.ZpoolID, z.DatasetID, err)
		}
		path = real
	}
	return diskfile.Open(path, sled.FileRoots, !f.ReadOnly)
}

// IsZvolPath reports whether path names a zvol device (a delegated zvol's,
// or one not delegated).
func IsZvolPath(path string) bool {
	return strings.HasPrefix(filepath.Clean(path)+"/", "/dev/zvol/")
}

func delegated(path string, zvols []Zvol) (Zvol, bool) {
	for _, z := range zvols {
		if z.Device() == path {
			return z, true
		}
	}
	return Zvol{}, false
}
