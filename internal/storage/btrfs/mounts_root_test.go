package btrfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The mount table read once is read again after every mount and unmount:
// what mountAt says is never older than the call.
func TestMountTableFollowsChanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, ok, err := mountAt(dir); err != nil || ok {
			t.Fatalf("round %d, before the mount: mounted %v, %v", i, ok, err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		m, ok, err := mountAt(dir)
		if err != nil || !ok || m.fstype != "tmpfs" {
			unix.Unmount(dir, unix.MNT_DETACH)
			t.Fatalf("round %d, mounted: %+v %v, %v", i, m, ok, err)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := mountAt(dir); err != nil || ok {
		t.Fatalf("after the last unmount: mounted %v, %v", ok, err)
	}
}
