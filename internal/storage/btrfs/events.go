package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/inotify"
	"github.com/sled-agent/sled-agent/internal/storage"
)

var _ storage.DiskWatcher = (*Backend)(nil)

// coalesceWindow is how long after an event others are taken as the same
// change: a disk arrives with its partitions, and a change or two.
const coalesceWindow = 100 * time.Millisecond

// vdevRewatch bounds the delay between attempts to watch a vdev dir that
// is missing or could not be watched.
const (
	vdevRewatchMin = time.Second
	vdevRewatchMax = 30 * time.Second
)

// DiskEvents reports, until ctx ends, that disks may have come or gone:
// the kernel's uevents of real disks (added, removed, changed; not
// partitions, nor loop, ram, dm… devices), when the backend lists real
// disks, and the synthetic disks of VdevDir appearing in it (a file
// closed after it was written, or moved in: a file just created is still
// empty) or leaving it (deleted, moved out). Events less than
// coalesceWindow apart are one. Where the kernel's events cannot be read,
// or the directory watched, it says so once and the storage period is
// what notices; a vdev dir that is missing is watched once it is there.
func (b *Backend) DiskEvents(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	raw := make(chan struct{}, 1)
	hint := func() {
		select {
		case raw <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	if b.opts.Tag == "" {
		wg.Go(func() { b.followUevents(ctx, hint) })
	}
	if b.opts.VdevDir != "" {
		wg.Go(func() { b.followVdevDir(ctx, hint) })
	}
	wg.Go(func() { coalesce(ctx, raw, out, coalesceWindow) })
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

// coalesce passes on, until ctx ends, one value for all those that reach
// in within window of the first.
func coalesce(ctx context.Context, in <-chan struct{}, out chan<- struct{}, window time.Duration) {
	t := time.NewTimer(window)
	t.Stop()
	defer t.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-in:
			if !pending {
				pending = true
				t.Reset(window)
			}
		case <-t.C:
			pending = false
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}
}

// followUevents hints at every kernel uevent of a real disk until ctx
// ends.
func (b *Backend) followUevents(ctx context.Context, hint func()) {
	c, err := openUevents()
	if err != nil {
		b.log.Warn("the kernel's disk events cannot be read: disks that come and go are noticed at the storage period", "err", err)
		return
	}
	err = c.run(ctx, func(ev uevent) {
		if ev == (uevent{}) || diskUevent(ev) {
			hint() // a zero event: some were lost
		}
	})
	if err != nil {
		b.log.Warn("reading the kernel's disk events failed: disks that come and go are noticed at the storage period", "err", err)
	}
}

// diskUevent reports whether ev may change the real disks listed: a whole
// disk (not a partition) added, removed or changed, of a kind sysfsDisks
// lists. Loop devices are not among them: a synthetic disk is there while
// its file is (followVdevDir).
func diskUevent(ev uevent) bool {
	if ev.Subsystem != "block" || ev.DevType != "disk" {
		return false
	}
	switch ev.Action {
	case "add", "remove", "change":
	default:
		return false
	}
	name := ev.DevName
	if name == "" {
		name = path.Base(ev.DevPath)
	}
	return name != "" && !hasAnyPrefix(name, skipped)
}

// followVdevDir hints at every synthetic disk of VdevDir that appears or
// leaves, until ctx ends. While the directory is missing (or cannot be
// watched) it tries again, up to every vdevRewatchMax, and hints once it
// watches it again.
func (b *Backend) followVdevDir(ctx context.Context, hint func()) {
	delay, failing := vdevRewatchMin, false
	for {
		w, err := watchDir(b.opts.VdevDir)
		if err == nil {
			if failing {
				b.log.Info("watching the vdev dir again", "dir", b.opts.VdevDir)
				hint() // what changed while it was not watched
			}
			failing, delay = false, vdevRewatchMin
			err = w.run(ctx, func(name string) {
				if n, _, ok := parseVdevName(name); name == "" || ok && strings.HasPrefix(n, b.opts.Tag) {
					hint()
				}
			})
			if ctx.Err() != nil {
				return
			}
			hint() // the directory went away, or the watch broke
		}
		if !failing {
			b.log.Warn("the vdev dir is not watched: its synthetic disks that come and go are noticed at the storage period until it is", "dir", b.opts.VdevDir, "err", err)
			failing = true
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, vdevRewatchMax)
	}
}

// dirWatch is an inotify watch of one directory's entries.
type dirWatch struct {
	f    *os.File
	path string
}

// watchDir watches path for entries closed after being written, moved in,
// deleted or moved out, and for its own removal or move.
func watchDir(path string) (*dirWatch, error) {
	f, err := inotify.Watch(path, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF)
	if err != nil {
		return nil, err
	}
	return &dirWatch{f: f, path: path}, nil
}

// errWatchGone: the watched directory was removed or moved.
var errWatchGone = errors.New("the directory was removed or moved; its watch is gone")

// run calls fn with the name of each entry changed ("" when the queue
// overflowed and events were lost) until ctx ends (nil) or the watch is
// gone (an error). It closes the watch when it returns.
func (w *dirWatch) run(ctx context.Context, fn func(name string)) error {
	stop := context.AfterFunc(ctx, func() { w.f.Close() })
	defer func() {
		if stop() {
			w.f.Close()
		}
	}()
	buf := make([]byte, inotify.BufferSize)
	for {
		n, err := w.f.Read(buf)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading inotify of %s: %w", w.path, err)
		}
		for ev := range inotify.Events(buf[:n]) {
			mask, name := ev.Mask, ev.Name
			switch {
			case mask&unix.IN_Q_OVERFLOW != 0:
				fn("")
			case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0:
				return fmt.Errorf("%s: %w", w.path, errWatchGone)
			case name != "":
				fn(name)
			}
		}
	}
}
