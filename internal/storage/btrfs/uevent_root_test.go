package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The uevent listener sees the kernel's events of a loop device this test
// attaches to a file of its own, and detaches; and of one it makes, and
// removes.
func TestUeventsOfALoopDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches a loop device to see its uevents")
	}
	if !exists("/dev/loop-control") {
		t.Skip("needs loop devices: no /dev/loop-control")
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "uevent-test.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 16<<20); err != nil {
		t.Fatal(err)
	}
	c, err := openUevents()
	if err != nil {
		t.Fatalf("uevent socket: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	events := make(chan uevent, 256)
	done := make(chan error, 1)
	go func() {
		done <- c.run(ctx, func(ev uevent) {
			select {
			case events <- ev:
			default:
			}
		})
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(hintWait):
			t.Error("the listener did not return when its ctx ended")
		}
	}()

	dev, err := attachLoop(file)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	attached := true
	// Detached at cleanup even if the test fails: only if it is still
	// backed by this test's file.
	t.Cleanup(func() {
		if d, ok := findLoop(sysBlock, file); attached && ok && d == dev {
			if err := DetachLoop(dev); err != nil {
				t.Errorf("detach %s: %v", dev, err)
			}
		}
	})
	name := filepath.Base(dev)
	// Attaching a free loop device changes it (a device the kernel had to
	// make for it is added first).
	waitUevent(t, events, name, "attach", "add", "change")
	if err := DetachLoop(dev); err != nil {
		t.Fatalf("detach: %v", err)
	}
	attached = false
	waitUevent(t, events, name, "detach", "change", "remove")

	// A loop device this test makes is added, and removed.
	n, remove, err := addLoopDevice(t)
	if err != nil {
		t.Fatalf("making a loop device: %v", err)
	}
	name = fmt.Sprintf("loop%d", n)
	waitUevent(t, events, name, "made", "add")
	if err := remove(); err != nil {
		t.Fatalf("removing %s: %v", name, err)
	}
	waitUevent(t, events, name, "removed", "remove")
}

// addLoopDevice makes a loop device with an index no device has (above the
// highest there is). remove removes it, once; if the test has not, cleanup
// does (the kernel refuses if another process took it meanwhile: then it
// is left to that process).
func addLoopDevice(t *testing.T) (n int, remove func() error, err error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(ctl)
	ents, _ := os.ReadDir(sysBlock)
	for _, e := range ents {
		var i int
		if _, err := fmt.Sscanf(e.Name(), "loop%d", &i); err == nil && i >= n {
			n = i + 1
		}
	}
	for range 16 {
		if err = unix.IoctlSetInt(ctl, unix.LOOP_CTL_ADD, n); err == nil {
			var once sync.Once
			var rerr error
			remove = func() error {
				once.Do(func() { rerr = removeLoopDevice(n) })
				return rerr
			}
			t.Cleanup(func() { remove() })
			return n, remove, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return 0, nil, err
		}
		n++
	}
	return 0, nil, err
}

// removeLoopDevice removes loop device n; the kernel refuses one in use.
func removeLoopDevice(n int) error {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ctl)
	return unix.IoctlSetInt(ctl, unix.LOOP_CTL_REMOVE, n)
}

// waitUevent waits for a block uevent of the whole disk name with one of
// actions.
func waitUevent(t *testing.T, events <-chan uevent, name, what string, actions ...string) {
	t.Helper()
	deadline := time.After(hintWait)
	for {
		select {
		case ev := <-events:
			if ev.Subsystem != "block" || ev.DevName != name || ev.DevType != "disk" {
				continue
			}
			for _, a := range actions {
				if ev.Action == a {
					t.Logf("%s: %+v", what, ev)
					return
				}
			}
		case <-deadline:
			t.Fatalf("%s: no %v uevent of %s within %s", what, actions, name, hintWait)
		}
	}
}
