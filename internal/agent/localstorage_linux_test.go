package agent_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// linuxLocalStorageAgent starts a Linux agent whose config gives one pool
// of its own (on a vdev) a local_storage_unencrypted dataset, waits for the
// dataset, and returns the agent with the pool's id and the dataset's
// directory.
func linuxLocalStorageAgent(t *testing.T, withGuests bool) (*agent.Agent, string, string) {
	t.Helper()
	tag, prefix, dir, runDir := linuxEnv(t)
	// A pool of the test's own: two btrfs of one id cannot be told apart.
	pool := uuid.NewString()
	if err := btrfs.MakeVdevs(vdevDir(dir), tag+"-"+sledconfigtest.VdevName(storage.PoolName(pool))); err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		UnderlayIP: "fd00:1122:3344:1d0::1"}
	if withGuests {
		cfg.VMMAccel, cfg.VMMQEMUIDs = "tcg", testQEMUIDs
	}
	a := newAgent(t, cfg)
	run(t, a)
	newWire(t, a).do(http.MethodPut, "/omicron-config", localStorageDoc(t, 2, tag+"-", []string{pool}, nil), http.StatusNoContent)
	waitLocalStorage(t, a, pool)
	ds, err := a.Storage().PoolDataset(pool, "local_storage_unencrypted")
	if err != nil {
		t.Fatal(err)
	}
	return a, pool, ds
}

// On Linux an allocation is a directory of the pool's btrfs
// local_storage_unencrypted dataset holding a sparse volume on the
// dataset's own device (so that a VMM's disk may be it), and a delete
// takes it away.
func TestLinuxLocalStorageOnBtrfs(t *testing.T) {
	a, pool, ds := linuxLocalStorageAgent(t, false)
	w := newWire(t, a)
	const size = 128 << 20 // more than the vdev's free space: it is sparse
	w.do(http.MethodPost, "/local-storage", ensureLocal(pool, allocA, 2*size, 2*size, false), http.StatusNoContent)
	vol := filepath.Join(ds, allocA, "vol")
	var st, dst syscall.Stat_t
	if err := syscall.Lstat(vol, &st); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(ds, &dst); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Size != 2*size || st.Nlink != 1 || st.Blocks != 0 || st.Dev != dst.Dev {
		t.Errorf("the volume %s: mode %o, %d bytes, %d links, %d blocks, device %d (the dataset's %d)", vol, st.Mode, st.Size, st.Nlink, st.Blocks, st.Dev, dst.Dev)
	}
	w.do(http.MethodPost, "/local-storage", ensureLocal(pool, allocA, 2*size, 2*size, false), http.StatusNoContent)
	w.do(http.MethodDelete, "/local-storage", deleteLocal(pool, allocA, false), http.StatusNoContent)
	if _, err := os.Lstat(filepath.Dir(vol)); !os.IsNotExist(err) {
		t.Errorf("after delete: %v", err)
	}
}

// The acceptance of local storage: an instance as upstream's Nexus builds
// it, whose boot disk is an NVMe disk on a delegated zvol, registers once
// POST /local-storage made the volume (here holding the test guest), boots
// under QEMU and reads its console; its volume cannot be deleted while the
// VMM has it.
func TestLinuxGuestBootsFromLocalStorage(t *testing.T) {
	image := testguest.Image(t) // skips without QEMU or OVMF
	a, pool, ds := linuxLocalStorageAgent(t, true)
	w := newWire(t, a)
	fi, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	size := uint64(fi.Size()+4095) &^ 4095
	w.do(http.MethodPost, "/local-storage", ensureLocal(pool, allocA, size, size, false), http.StatusNoContent)
	copyInto(t, filepath.Join(ds, allocA, "vol"), image)

	const addr = "[fd00:1122:3344:1d0::9]:12400"
	w.doNexus(http.MethodPut, "/vmms/"+testVMM, nexusBody(addr, pool, allocA), http.StatusOK, allocA, vmmtest.NICID)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusOK)
	waitVMMWithin(t, a, "running", guestWait)
	serialHas(t, addr, 0, testguest.ReadyPrefix+vmmtest.MAC)

	x := w.do(http.MethodDelete, "/local-storage", deleteLocal(pool, allocA, false), http.StatusConflict)
	if want := "is a disk of VMM " + testVMM; !strings.Contains(string(x.Body), want) {
		t.Errorf("deleting the running guest's volume: %s, want it saying %q", x.Body, want)
	}
	w.do(http.MethodPut, "/vmms/"+testVMM+"/state", []byte(`{"state":{"type":"stopped"}}`), http.StatusOK)
	waitVMMWithin(t, a, "destroyed", guestWait)
	w.do(http.MethodDelete, "/vmms/"+testVMM, nil, http.StatusOK)
	w.do(http.MethodDelete, "/local-storage", deleteLocal(pool, allocA, false), http.StatusNoContent)
}

// copyInto writes src's bytes over the start of dst, in place: dst stays
// the file it is.
func copyInto(t *testing.T, dst, src string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
