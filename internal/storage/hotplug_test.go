package storage_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// watchedFake is the fake backend with hardware events: the test says when
// a disk came or went, as the kernel would.
type watchedFake struct {
	*fakeBackend
	mu      sync.Mutex
	subs    []chan struct{}
	watches int
}

var _ storage.DiskWatcher = (*watchedFake)(nil)

func (w *watchedFake) DiskEvents(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.subs = append(w.subs, ch)
	w.watches++
	w.mu.Unlock()
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, c := range w.subs {
			if c == ch {
				w.subs = append(w.subs[:i], w.subs[i+1:]...)
			}
		}
		close(ch)
	})
	return ch
}

// event says the disks changed.
func (w *watchedFake) event() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// putBack puts a disk pulled out back in.
func (b *fakeBackend) putBack(d *storage.Disk) {
	b.mu.Lock()
	b.disks[d.Identity.Serial] = d
	b.mu.Unlock()
}

func startWatched(t *testing.T, w *watchedFake, opts storage.Options) *harness {
	t.Helper()
	h := &harness{t: t, b: w.fakeBackend, r: storage.New(w, opts), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.r.Run(ctx) }()
	synctest.Wait()
	return h
}

func observed(st storage.Status, serial string) bool {
	for _, d := range st.Observed.Disks {
		if d.Identity.Serial == serial {
			return true
		}
	}
	return false
}

// A disk pulled out is reported not found as soon as the backend says
// something changed, not at the period; put back, it is managed again at
// once, though its backoff would have it wait. Without an event, nothing
// changes until the period.
func TestDiskEventStartsItsPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &watchedFake{fakeBackend: newFake()}
		a, c := diskCfg("a"), diskCfg("c")
		da := w.addDisk(a.Identity.Serial)
		w.addDisk(c.Identity.Serial)
		debug := dsCfg("debug-a", a.PoolID, "debug")
		// A long backoff: a disk that comes back would wait out a minute.
		h := startWatched(t, w, storage.Options{Period: 10 * time.Minute, Backoff: storage.Backoff{Initial: time.Minute, Max: time.Hour}})
		defer h.stop()
		h.update([]storage.DiskConfig{a, c}, []storage.DatasetConfig{debug})
		wantResult(t, "a", h.disk(a.ID).Result, "")
		wantResult(t, "debug", h.dataset(debug.Name()).Result, "")
		if w.watches != 1 {
			t.Errorf("DiskEvents called %d times, want 1", w.watches)
		}

		// Pulled out, with no event: nothing changes until the period.
		w.removeDisk(a.Identity.Serial)
		time.Sleep(10*time.Minute - time.Second)
		synctest.Wait()
		wantResult(t, "a, pulled, no event", h.disk(a.ID).Result, "")
		time.Sleep(time.Second)
		synctest.Wait()
		wantResult(t, "a, pulled, at the period", h.disk(a.ID).Result, "disk not found")

		// Back, with an event: managed again at once, though its backoff
		// (a minute) has not passed.
		w.putBack(da)
		t0 := time.Now()
		w.event()
		synctest.Wait()
		wantResult(t, "a, back", h.disk(a.ID).Result, "")
		wantResult(t, "debug, back", h.dataset(debug.Name()).Result, "")
		if st := h.disk(a.ID); st.Attempts != 0 || st.NextRetry != nil {
			t.Errorf("a, back: still waiting out its backoff: %+v", st)
		}

		// Pulled out with an event: not found at once, and only its
		// datasets say so; the other disk had no pass.
		n := w.ncalls()
		w.removeDisk(a.Identity.Serial)
		w.event()
		synctest.Wait()
		st := h.r.Status()
		wantResult(t, "a, pulled", h.disk(a.ID).Result, "disk v/m/serial-a: disk not found")
		wantResult(t, "debug, pulled", h.dataset(debug.Name()).Result, "pool oxp_pool-a is not managed")
		wantResult(t, "c", h.disk(c.ID).Result, "")
		if observed(st, a.Identity.Serial) || !observed(st, c.Identity.Serial) {
			t.Errorf("observed disks: %+v", st.Observed.Disks)
		}
		if got := w.transcript(n); strings.Contains(strings.Join(got, ","), "pool-c") {
			t.Errorf("the disk that stayed had a pass: %q", got)
		}
		if time.Since(t0) != 0 {
			t.Errorf("%s passed", time.Since(t0))
		}
	})
}

// A disk pulled out while its call hangs is reported not found at once:
// the call is abandoned, not waited for until its deadline; a disk put in
// meanwhile is managed at once too.
func TestDiskEventWhileACallHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &watchedFake{fakeBackend: newFake()}
		dead, other := diskCfg("dead"), diskCfg("other")
		w.addDisk(dead.Identity.Serial)
		w.setHang(dead.Identity.Serial, true)
		h := startWatched(t, w, storage.Options{Period: 10 * time.Minute})
		defer h.stop()
		h.update([]storage.DiskConfig{dead, other}, nil)
		wantResult(t, "other, not there", h.disk(other.ID).Result, "disk not found")
		if act := h.disk(dead.ID).Activity; !strings.HasPrefix(act, "creating pool oxp_pool-dead") {
			t.Fatalf("dead disk's activity: %q", act)
		}

		t0 := time.Now()
		w.addDisk(other.Identity.Serial)
		w.event()
		synctest.Wait()
		wantResult(t, "other, put in", h.disk(other.ID).Result, "")

		w.removeDisk(dead.Identity.Serial)
		w.event()
		synctest.Wait()
		st := h.disk(dead.ID)
		wantResult(t, "dead, pulled", st.Result, "disk v/m/serial-dead: disk not found")
		if st.Activity != "" {
			t.Errorf("dead, pulled: a call still in flight: %q", st.Activity)
		}
		if time.Since(t0) != 0 {
			t.Errorf("%s passed", time.Since(t0))
		}
	})
}

// The reconciler stops following events when its watcher closes the
// channel, and goes on at the period.
func TestDiskEventsChannelClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &watchedFake{fakeBackend: newFake()}
		a := diskCfg("a")
		w.addDisk(a.Identity.Serial)
		wctx, stopWatching := context.WithCancel(context.Background())
		h := &harness{t: t, b: w.fakeBackend, r: storage.New(&closingWatcher{w, wctx}, storage.Options{Period: time.Minute}), done: make(chan error, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		go func() { h.done <- h.r.Run(ctx) }()
		synctest.Wait()
		defer h.stop()
		h.update([]storage.DiskConfig{a}, nil)
		stopWatching()
		synctest.Wait()
		n := w.ncalls()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := w.transcript(n); len(got) != 0 {
			t.Errorf("calls after the watcher stopped, before the period: %q", got)
		}
		w.removeDisk(a.Identity.Serial)
		time.Sleep(time.Minute)
		synctest.Wait()
		wantResult(t, "a, pulled, at the period", h.disk(a.ID).Result, "disk not found")
	})
}

// closingWatcher's events end with its own ctx.
type closingWatcher struct {
	*watchedFake
	ctx context.Context
}

func (c *closingWatcher) DiskEvents(ctx context.Context) <-chan struct{} {
	return c.watchedFake.DiskEvents(c.ctx)
}
