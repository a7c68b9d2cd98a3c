package btrfs

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// hintWait bounds how long a test waits for an event that is due at once:
// generous, for a loaded machine; a missing event fails the test.
const hintWait = 10 * time.Second

func wantHint(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the events channel closed", what)
		}
	case <-time.After(hintWait):
		t.Fatalf("%s: no event within %s", what, hintWait)
	}
}

// drain takes a value waiting in ch, if any.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// A synthetic disk's file appearing in the vdev dir (written, then closed)
// or leaving it is an event; files of other tags or that are not vdevs are
// not; when ctx ends, the channel is closed.
func TestDiskEventsVdevDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vdev")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tag := "t" + strings.ToLower(rand.Text()[:8])
	b, err := New(Options{VdevDir: dir, PoolRoot: filepath.Join(t.TempDir(), "pools"), Tag: tag})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch := b.DiskEvents(ctx)
	// The watch is set up on its own goroutine: write the file until it
	// is seen (each close after a write is an event).
	file := filepath.Join(dir, "u2_"+tag+"-a.vdev")
	deadline := time.Now().Add(hintWait)
	for seen := false; !seen; {
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			seen = true
		case <-time.After(200 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatalf("no event for %s within %s", file, hintWait)
			}
		}
	}
	// Files that are not this backend's synthetic disks are no events.
	for _, n := range []string{"notes.txt", "u2_other-a.vdev", "x2_" + tag + "-a.vdev"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ch:
		t.Error("an event for files that are not this backend's synthetic disks")
	case <-time.After(5 * coalesceWindow):
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	wantHint(t, ch, "a vdev file removed")

	// Moved in and out (a rename within the dir's filesystem).
	tmp := filepath.Join(filepath.Dir(dir), "u2_"+tag+"-b.vdev")
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	drain(ch)
	if err := os.Rename(tmp, filepath.Join(dir, "u2_"+tag+"-b.vdev")); err != nil {
		t.Fatal(err)
	}
	wantHint(t, ch, "a vdev file moved in")
	drain(ch)
	if err := os.Rename(filepath.Join(dir, "u2_"+tag+"-b.vdev"), tmp); err != nil {
		t.Fatal(err)
	}
	wantHint(t, ch, "a vdev file moved out")

	cancel()
	closed := time.After(hintWait)
	for {
		select {
		case _, ok := <-ch:
			if ok {
				continue
			}
			return
		case <-closed:
			t.Fatal("the events channel was not closed when ctx ended")
		}
	}
}

// The dir watch reports each entry written and closed, and says when the
// directory is gone.
func TestDirWatch(t *testing.T) {
	dir := t.TempDir()
	w, err := watchDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	names := make(chan string, 16)
	done := make(chan error, 1)
	go func() { done <- w.run(ctx, func(n string) { names <- n }) }()
	for _, n := range []string{"notes.txt", "u2_x.vdev"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"notes.txt", "u2_x.vdev"} {
		select {
		case got := <-names:
			if got != want {
				t.Errorf("event for %q, want %q", got, want)
			}
		case <-time.After(hintWait):
			t.Fatalf("no event for %s", want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(hintWait):
		t.Fatal("run did not return when ctx ended")
	}

	// The directory removed: the watch says it is gone.
	dir2 := filepath.Join(t.TempDir(), "d")
	os.Mkdir(dir2, 0o755)
	w, err = watchDir(dir2)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- w.run(t.Context(), func(string) {}) }()
	os.Remove(dir2)
	select {
	case err := <-done:
		if !errors.Is(err, errWatchGone) {
			t.Errorf("run after the dir was removed: %v", err)
		}
	case <-time.After(hintWait):
		t.Fatal("run did not return when its dir was removed")
	}
}

// A vdev dir that is missing is watched once it is made, and that is an
// event (its files may be there already).
func TestDiskEventsVdevDirMadeLater(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vdev")
	logs := &logLines{lines: make(chan string, 16)}
	b, err := New(Options{VdevDir: dir, PoolRoot: "/nonexistent", Tag: "tnone", Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch := b.DiskEvents(ctx)
	select {
	case l := <-logs.lines:
		if !strings.Contains(l, "the vdev dir is not watched") {
			t.Fatalf("log: %s", l)
		}
	case <-time.After(hintWait):
		t.Fatal("not said that the missing vdev dir is not watched")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	wantHint(t, ch, "the vdev dir made")
}

// logLines passes on each line logged.
type logLines struct{ lines chan string }

func (l *logLines) Write(p []byte) (int, error) {
	l.lines <- string(p)
	return len(p), nil
}

func TestParseUevent(t *testing.T) {
	msg := []byte("add@/devices/virtual/block/loop7\x00ACTION=add\x00DEVPATH=/devices/virtual/block/loop7\x00SUBSYSTEM=block\x00MAJOR=7\x00MINOR=7\x00DEVNAME=loop7\x00DEVTYPE=disk\x00DISKSEQ=9\x00SEQNUM=3021\x00")
	ev, ok := parseUevent(msg)
	want := uevent{Action: "add", Subsystem: "block", DevType: "disk", DevName: "loop7", DevPath: "/devices/virtual/block/loop7"}
	if !ok || ev != want {
		t.Errorf("parseUevent: %+v %v, want %+v", ev, ok, want)
	}
	if _, ok := parseUevent([]byte("libudev\x00\xfe\xed\xca\xfeACTION=add\x00")); ok {
		t.Error("udev's own message taken for a kernel uevent")
	}
	if _, ok := parseUevent([]byte("add@/x\x00SUBSYSTEM=block\x00")); ok {
		t.Error("a uevent with no ACTION or DEVPATH accepted")
	}
}

func TestDiskUevent(t *testing.T) {
	for _, c := range []struct {
		ev   uevent
		want bool
	}{
		{uevent{Action: "add", Subsystem: "block", DevType: "disk", DevName: "nvme0n1"}, true},
		{uevent{Action: "remove", Subsystem: "block", DevType: "disk", DevName: "sdb"}, true},
		{uevent{Action: "change", Subsystem: "block", DevType: "disk", DevPath: "/devices/pci0000:00/x/block/vdb"}, true},
		{uevent{Action: "add", Subsystem: "block", DevType: "partition", DevName: "nvme0n1p1"}, false},
		{uevent{Action: "bind", Subsystem: "block", DevType: "disk", DevName: "sdb"}, false},
		{uevent{Action: "add", Subsystem: "net", DevName: "eth0"}, false},
		{uevent{Action: "change", Subsystem: "block", DevType: "disk", DevName: "loop3"}, false},
		{uevent{Action: "add", Subsystem: "block", DevType: "disk", DevName: "dm-0"}, false},
	} {
		if got := diskUevent(c.ev); got != c.want {
			t.Errorf("diskUevent(%+v) = %v, want %v", c.ev, got, c.want)
		}
	}
}

// Events within the window are one; the channel never blocks a sender.
func TestCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		in, out := make(chan struct{}, 1), make(chan struct{}, 1)
		go coalesce(ctx, in, out, coalesceWindow)
		// A reader that takes every value as it comes, so a second value
		// for the burst would be counted, not dropped by the full channel.
		var n atomic.Int32
		go func() {
			for {
				select {
				case <-out:
					n.Add(1)
				case <-ctx.Done():
					return
				}
			}
		}()
		for range 10 {
			in <- struct{}{}
			time.Sleep(coalesceWindow / 20)
		}
		time.Sleep(coalesceWindow)
		synctest.Wait()
		if got := n.Load(); got != 1 {
			t.Errorf("%d values for one burst, want 1", got)
		}
	})
}
