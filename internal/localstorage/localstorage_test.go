package localstorage_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/localstorage"
)

const id = "2bbf0908-21da-4bc3-882b-1a1e715c54bd"

func TestEnsureMakesASparseVolumeOnceAndRemoveTakesItAway(t *testing.T) {
	dir := t.TempDir()
	req := localstorage.Request{DatasetID: id, DatasetSize: 2 << 30, VolumeSize: 1 << 30}
	created, err := localstorage.Ensure(dir, req)
	if err != nil || !created {
		t.Fatalf("Ensure: %v, created %v", err, created)
	}
	vol := filepath.Join(dir, id, "vol")
	if localstorage.Path(dir, id) != vol {
		t.Errorf("Path %s, want %s", localstorage.Path(dir, id), vol)
	}
	st, err := os.Stat(vol)
	if err != nil || !st.Mode().IsRegular() || st.Size() != 1<<30 {
		t.Fatalf("the volume: %v %v", st, err)
	}
	f, err := os.OpenFile(vol, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("guest data"), 4096)
	f.Close()

	// The same request again changes nothing: the guest's data stays.
	created, err = localstorage.Ensure(dir, req)
	if err != nil || created {
		t.Fatalf("Ensure again: %v, created %v", err, created)
	}
	b := make([]byte, 10)
	f, _ = os.Open(vol)
	f.ReadAt(b, 4096)
	f.Close()
	if string(b) != "guest data" {
		t.Errorf("after the same Ensure the volume holds %q", b)
	}
	// Another size is a conflict naming both, and changes nothing.
	other := req
	other.VolumeSize = 2 << 30
	if _, err := localstorage.Ensure(dir, other); !errors.Is(err, localstorage.ErrConflict) || !strings.Contains(err.Error(), "holds 1073741824 bytes, not volume_size 2147483648") {
		t.Errorf("another size: %v", err)
	}
	if st, _ := os.Stat(vol); st.Size() != 1<<30 {
		t.Errorf("after a refused Ensure the volume is %d bytes", st.Size())
	}

	gone, err := localstorage.Remove(dir, id)
	if err != nil || !gone {
		t.Fatalf("Remove: %v, gone %v", err, gone)
	}
	if _, err := os.Lstat(filepath.Join(dir, id)); !os.IsNotExist(err) {
		t.Errorf("after Remove: %v", err)
	}
	gone, err = localstorage.Remove(dir, id)
	if err != nil || gone {
		t.Errorf("Remove again: %v, gone %v", err, gone)
	}
}

func TestEnsureRefusesBadRequestsAndChangesNothing(t *testing.T) {
	for _, c := range []struct {
		req  localstorage.Request
		says string
	}{
		{localstorage.Request{DatasetID: id, DatasetSize: 1 << 20, VolumeSize: 0}, "volume_size 0"},
		{localstorage.Request{DatasetID: id, DatasetSize: 1 << 20, VolumeSize: 1000}, "volume_size 1000 is not a multiple of 4096"},
		{localstorage.Request{DatasetID: id, DatasetSize: 4096, VolumeSize: 8192}, "dataset_size 4096 is less than volume_size 8192"},
		{localstorage.Request{DatasetID: "../x", DatasetSize: 8192, VolumeSize: 8192}, `dataset_id "../x" is not a UUID`},
		{localstorage.Request{DatasetID: strings.ToUpper(id), DatasetSize: 8192, VolumeSize: 8192}, "is not a UUID in lower case"},
	} {
		dir := t.TempDir()
		_, err := localstorage.Ensure(dir, c.req)
		if !errors.Is(err, localstorage.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v; want ErrInvalid saying %q", c.req, err, c.says)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%+v: left %v", c.req, ents)
		}
	}
}

// A crash between the directory and the volume leaves the directory: the
// next Ensure makes the volume; a crash before the rename leaves the
// temporary file, which is not the volume.
func TestEnsureFinishesAHalfMadeAllocation(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, id, ".vol.tmp"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	created, err := localstorage.Ensure(dir, localstorage.Request{DatasetID: id, DatasetSize: 8192, VolumeSize: 8192})
	if err != nil || !created {
		t.Fatalf("Ensure: %v, created %v", err, created)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, id))
	if len(ents) != 1 || ents[0].Name() != "vol" {
		t.Errorf("the allocation holds %v", ents)
	}
}

// Something else where an allocation's directory or volume would be is a
// conflict, left as it is.
func TestSomethingElseInTheWayIsAConflict(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, id), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	req := localstorage.Request{DatasetID: id, DatasetSize: 8192, VolumeSize: 8192}
	if _, err := localstorage.Ensure(dir, req); !errors.Is(err, localstorage.ErrConflict) {
		t.Errorf("a file in the way: %v", err)
	}
	if _, err := localstorage.Remove(dir, id); !errors.Is(err, localstorage.ErrConflict) {
		t.Errorf("Remove of a file in the way: %v", err)
	}
	os.Remove(filepath.Join(dir, id))
	os.MkdirAll(filepath.Join(dir, id), 0o700)
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, id, "vol")); err != nil {
		t.Fatal(err)
	}
	if _, err := localstorage.Ensure(dir, req); !errors.Is(err, localstorage.ErrConflict) || !strings.Contains(err.Error(), "not a volume") {
		t.Errorf("a symbolic link as the volume: %v", err)
	}
}
