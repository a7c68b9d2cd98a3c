package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
)

const (
	zpool   = "cb832c2e-fa94-4911-89a9-895ac8b1e8f3"
	dataset = "2bbf0908-21da-4bc3-882b-1a1e715c54bd"
)

// The device path is upstream's (omicron common
// test_delegated_zvol_device_name).
func TestZvolDeviceIsUpstreams(t *testing.T) {
	z, err := ParseZvol("local_storage_unencrypted", zpool, dataset)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/dev/zvol/rdsk/oxp_" + zpool + "/local_storage_unencrypted/" + dataset + "/vol"; z.Device() != want {
		t.Errorf("Device %s, want %s", z.Device(), want)
	}
	for _, c := range []struct{ typ, pool, ds, says string }{
		{"local_storage_encrypted", zpool, dataset, "encryption at rest is not available on this sled"},
		{"crucible", zpool, dataset, `type "crucible"`},
		{"local_storage_unencrypted", "../../etc", dataset, `zpool_id "../../etc" is not a UUID`},
		{"local_storage_unencrypted", zpool, "x", `dataset_id "x" is not a UUID`},
	} {
		if _, err := ParseZvol(c.typ, c.pool, c.ds); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v; want an error saying %q", c, err, c.says)
		}
	}
}

// A file backend naming a delegated zvol opens the file that realises it,
// judged as every disk's file; a zvol not delegated, or delegated but not
// made, is refused naming it.
func TestDelegatedZvolOpensItsVolume(t *testing.T) {
	w := newWorld(t)
	local := w.sled.FileRoots[0]
	vol := filepath.Join(local, dataset, "vol")
	if err := os.MkdirAll(filepath.Dir(vol), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vol, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	z, _ := ParseZvol("local_storage_unencrypted", zpool, dataset)
	var asked []string
	sled := w.sled
	sled.Zvols = []Zvol{z}
	sled.LocalVolume = func(p, d string) (string, error) {
		asked = append(asked, p+"/"+d)
		if d != dataset {
			return "", errors.New("not yet ensured")
		}
		return vol, nil
	}
	f, err := OpenBackend(&FileBackend{Path: z.Device(), BlockSize: 512}, sled)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Path != vol || len(asked) != 1 || asked[0] != zpool+"/"+dataset {
		t.Errorf("opened %s (asked %v), want %s", f.Path, asked, vol)
	}

	other, _ := ParseZvol("local_storage_unencrypted", zpool, "3ccf0908-21da-4bc3-882b-1a1e715c54bd")
	if _, err := OpenBackend(&FileBackend{Path: other.Device(), BlockSize: 512}, sled); !errors.Is(err, ErrZvolNotDelegated) {
		t.Errorf("a zvol not delegated: %v", err)
	}
	sled.Zvols = append(sled.Zvols, other)
	_, err = OpenBackend(&FileBackend{Path: other.Device(), BlockSize: 512}, sled)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("delegated zvol (pool %s, dataset %s): not yet ensured", zpool, other.DatasetID)) {
		t.Errorf("a delegated zvol not made: %v", err)
	}
	// What realises a zvol is judged like any disk's file: a symbolic
	// link is refused.
	link := filepath.Join(local, "link")
	os.Symlink(vol, link)
	sled.LocalVolume = func(p, d string) (string, error) { return link, nil }
	if _, err := OpenBackend(&FileBackend{Path: z.Device(), BlockSize: 512}, sled); !errors.Is(err, diskfile.ErrSymlink) {
		t.Errorf("a volume reached through a link: %v", err)
	}
	// The spec's other zvol-looking paths are refused as before.
	sled.Zvols = nil
	if _, err := OpenBackend(&FileBackend{Path: "/dev/zvol/dsk/oxp_x/vol", BlockSize: 512}, sled); !errors.Is(err, ErrZvolNotDelegated) {
		t.Errorf("another zvol: %v", err)
	}
}
