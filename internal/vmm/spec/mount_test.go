package spec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A file on another file system mounted below a root (here a tmpfs) is
// refused: the root's device is the storage the sled gives guests.
func TestFileOnAnotherMountRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	w := newWorld(t)
	mnt := filepath.Join(w.sled.FileRoots[1], "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	disk := filepath.Join(mnt, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := decodeCheck(t, testSpec(disk), w.sled)
	if err == nil || !strings.Contains(err.Error(), `component "boot-disk-backend" (file_storage_backend): path "`+disk+`": crosses a mount point`) {
		t.Fatalf("a disk on a mount below the root: %v", err)
	}
}
