package qemuvm

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

var errNotStarted = errors.New("not started: the test looked at the command")

// The disk QEMU is given is the file judged: its name made another file's
// (a symbolic link to a file outside the sled's storage) after the spec was
// checked and before QEMU starts changes nothing of what QEMU gets.
func TestQEMUGetsTheJudgedDisk(t *testing.T) {
	storage, outside := t.TempDir(), t.TempDir()
	disk := filepath.Join(storage, "boot.raw")
	secret := filepath.Join(outside, "secret")
	fw := filepath.Join(t.TempDir(), "fw.fd")
	for _, f := range []string{disk, secret, fw} {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var judged unix.Stat_t
	if err := unix.Stat(disk, &judged); err != nil {
		t.Fatal(err)
	}
	var given *unix.Stat_t
	var mode int
	vm := New(Options{
		Name:         "qemuvm-disk",
		Dir:          t.TempDir(),
		Binary:       os.Args[0],
		FirmwareCode: fw,
		FirmwareVars: fw,
		Accel:        qemu.TCG,
		IDs:          DefaultIDs,
		Sled:         spec.Sled{Threads: 2, FileRoots: []string{storage}},
		// Called once the machine is built from the judged spec, before
		// QEMU starts.
		Confine: func(Guest) Confinement {
			swap := filepath.Join(storage, "swap")
			if err := os.Symlink(secret, swap); err != nil {
				t.Error(err)
			}
			if err := os.Rename(swap, disk); err != nil {
				t.Error(err)
			}
			return &fakeConfinement{}
		},
		Start: func(cmd *exec.Cmd) error {
			fd := addFD(cmd.Args, disk)
			if fd < 3 || fd-3 >= len(cmd.ExtraFiles) {
				t.Errorf("no fd set for the disk in %q", cmd.Args)
				return errNotStarted
			}
			f := cmd.ExtraFiles[fd-3]
			given = &unix.Stat_t{}
			if err := unix.Fstat(int(f.Fd()), given); err != nil {
				t.Error(err)
			}
			mode, _ = unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
			return errNotStarted
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Cleanup(func() { vm.Close(ctx) })
	if err := vm.Ensure(ctx, props, specJSON(disk, false)); !errors.Is(err, errNotStarted) {
		t.Fatalf("Ensure: %v", err)
	}
	if given == nil {
		t.Fatal("QEMU was given no disk")
	}
	if given.Dev != judged.Dev || given.Ino != judged.Ino {
		t.Fatalf("QEMU was given %d:%d; want the judged disk %d:%d", given.Dev, given.Ino, judged.Dev, judged.Ino)
	}
	if mode&unix.O_ACCMODE != unix.O_RDWR {
		t.Errorf("the writable disk's descriptor has flags %#x", mode)
	}
}

// addFD is the fd of the -add-fd whose opaque is path, or -1.
func addFD(args []string, path string) int {
	for i, a := range args {
		if a != "-add-fd" || i+1 == len(args) || !strings.HasSuffix(args[i+1], ",opaque="+path) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(args[i+1], "fd="), ",")
		n, err := strconv.Atoi(v)
		if err == nil {
			return n
		}
	}
	return -1
}

// An NVMe disk's has_write_cache reaches QEMU as the device's write-cache
// setting.
func TestNVMeWriteCacheReachesQEMU(t *testing.T) {
	storage := t.TempDir()
	fw := filepath.Join(t.TempDir(), "fw.fd")
	disks := []string{filepath.Join(storage, "boot.raw"), filepath.Join(storage, "data.raw")}
	for _, f := range append([]string{fw}, disks...) {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	vm := New(Options{
		Name: "qemuvm-nvme", Dir: t.TempDir(), Binary: os.Args[0],
		FirmwareCode: fw, FirmwareVars: fw, Accel: qemu.TCG, IDs: DefaultIDs,
		Sled:    spec.Sled{Threads: 2, FileRoots: []string{storage}},
		Confine: func(Guest) Confinement { return &fakeConfinement{} },
		Start: func(cmd *exec.Cmd) error {
			args = cmd.Args
			return errNotStarted
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Cleanup(func() { vm.Close(ctx) })
	var doc map[string]any
	if err := json.Unmarshal(specJSON(disks[0], false), &doc); err != nil {
		t.Fatal(err)
	}
	comps := doc["components"].(map[string]any)
	nvme := func(backend string, dev int, wc bool) map[string]any {
		serial := make([]int, 20)
		for i, c := range backend {
			serial[i] = int(c)
		}
		return map[string]any{"type": "nvme_disk", "component": map[string]any{
			"backend_id": backend, "pci_path": map[string]any{"bus": 0, "device": dev, "function": 0},
			"serial_number": serial, "has_write_cache": wc}}
	}
	comps["boot-disk"] = nvme("boot-disk-backend", 0x10, false)
	comps["data-disk"] = nvme("data-disk-backend", 0x11, true)
	comps["data-disk-backend"] = map[string]any{"type": "file_storage_backend", "component": map[string]any{"path": disks[1], "readonly": false, "block_size": 512}}
	raw, _ := json.Marshal(doc)
	if err := vm.Ensure(ctx, props, raw); !errors.Is(err, errNotStarted) {
		t.Fatalf("Ensure: %v", err)
	}
	want := map[string]string{"serial=boot-disk-backend": "write-cache=off", "serial=data-disk-backend": "write-cache=on"}
	for serial, wc := range want {
		found := false
		for _, a := range args {
			if strings.HasPrefix(a, "nvme,") && strings.Contains(a, ","+serial+",") {
				found = true
				if !strings.Contains(a, ","+wc) {
					t.Errorf("NVMe device %q: want %s", a, wc)
				}
			}
		}
		if !found {
			t.Errorf("no NVMe device with %s in %q", serial, args)
		}
	}
}
