package qemuvm

import (
	"context"
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
