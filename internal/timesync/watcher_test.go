package timesync

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var ntpAddr = netip.MustParseAddrPort("[fd00:1122:3344:101::5]:10123")

// rig is a watcher of an NTP zone on a fake network: ntp-admin's handler
// over a fake tracker at ntpAddr, unless the test serves something else.
type rig struct {
	t       *testing.T
	net     *fakeNet
	tracker *fakeTracker
	w       *Watcher

	mu      sync.Mutex
	where   error // what Locate says: nil means ntpAddr
	locates int
	changes []Status // OnChange calls
	// inside are Status and Check as OnChange saw them from inside the
	// call (they would deadlock if it were called under the lock).
	inside []Status

	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// newRig sets a watcher up; serve says whether ntp-admin answers at
// ntpAddr (else the test serves it). run starts it.
func newRig(t *testing.T, line string, serve bool, opts Options) *rig {
	r := &rig{t: t, net: newFakeNet(t), tracker: &fakeTracker{line: line}, done: make(chan error, 1)}
	if serve {
		r.net.serve(ntpAddr.String(), NewHandler(r.tracker, HandlerOptions{}))
	}
	opts.Client = r.net.Client()
	opts.Locate = func() (netip.AddrPort, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.locates++
		if r.where != nil {
			return netip.AddrPort{}, r.where
		}
		return ntpAddr, nil
	}
	opts.OnChange = func(st Status) {
		inside := r.w.Status()
		r.w.Check()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.changes = append(r.changes, st)
		r.inside = append(r.inside, inside)
	}
	r.w = NewWatcher(opts)
	return r
}

func (r *rig) run() *rig {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.w.Run(ctx) }()
	return r
}

func (r *rig) locate(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.where = err
}

func (r *rig) locateCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.locates
}

// flips returns the Synced value of every OnChange call.
func (r *rig) flips() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []bool
	for i, st := range r.changes {
		if st.Synced != r.inside[i].Synced {
			r.t.Errorf("OnChange got %+v, Status inside it said %+v", st, r.inside[i])
		}
		out = append(out, st.Synced)
	}
	return out
}

func (r *rig) asks() int {
	r.tracker.mu.Lock()
	defer r.tracker.mu.Unlock()
	return r.tracker.asks
}

// stop ends Run, which must return nil, and the fake network.
func (r *rig) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	if err := <-r.done; err != nil {
		r.t.Errorf("Run returned %v", err)
	}
	r.net.close()
}

func notSynced(t *testing.T, err error, want string, is error) {
	t.Helper()
	e, ok := errors.AsType[*NotSyncedError](err)
	if !ok {
		t.Fatalf("Check = %v, want a *NotSyncedError", err)
	}
	if err.Error() != want {
		t.Fatalf("Check says\n%q, want\n%q", err, want)
	}
	if !errors.Is(err, is) {
		t.Fatalf("Check = %v (reason %v), want one that is %v", err, e.Err, is)
	}
}

func TestWatcherReleasesOnSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRig(t, recUnsynced, true, Options{}).run()
		defer r.stop()
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: NTP zone reports no reference time yet (ref time 0); no reference peer; max error 1.500000 s > 0.175 s", ErrNotSynced)
		if st := r.w.Status(); st.Synced || st.Released || st.NTPAdmin != ntpAddr.String() || st.LastChecked != start || st.ReportAt != start || st.MaxError != 1.5 || st.Failures != 0 {
			t.Fatalf("status %+v", st)
		}

		r.tracker.set(recSyncedV6, nil)
		time.Sleep(time.Second) // the next check, at the unsynchronized period
		synctest.Wait()
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check = %v after the NTP zone said synchronized", err)
		}
		at := start.Add(time.Second)
		st := r.w.Status()
		if !st.Synced || !st.Released || st.Reason != "" || st.Source != "::1" || st.Stratum != 4 || st.Offset != -0.000002257 || st.Since != at || st.ReleasedAt != at || st.LastChecked != at {
			t.Fatalf("status %+v", st)
		}
		if got := r.flips(); !slices.Equal(got, []bool{false, true}) {
			t.Fatalf("OnChange calls %v, want the first reason (not synced yet), then synced", got)
		}
		// Synchronized, it keeps checking, at the synchronized period.
		asks := r.asks()
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if got := r.asks() - asks; got != 4 {
			t.Fatalf("%d checks in 20s while synchronized, want 4 (every 5s)", got)
		}
		if st := r.w.Status(); st.Since != at || st.LastChecked != start.Add(21*time.Second) {
			t.Fatalf("status %+v", st)
		}
	})
}

func TestWatcherWithoutARunningNTPZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRig(t, recSyncedV4, true, Options{})
		r.locate(ErrNoNTPZone)
		r.run()
		defer r.stop()
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: no NTP zone in the config", ErrNoNTPZone)

		r.locate(fmt.Errorf("%w: oxz_ntp_0c1b… is starting", ErrNTPZoneNotRunning))
		time.Sleep(time.Second)
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: NTP zone not running: oxz_ntp_0c1b… is starting", ErrNTPZoneNotRunning)
		if st := r.w.Status(); st.NTPAdmin != "" || st.Failures != 0 || !st.ReportAt.IsZero() {
			t.Fatalf("status %+v", st)
		}
		// Without an NTP zone to ask, it looks at the period, without
		// backing off, and asks nobody.
		calls := r.locateCalls()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := r.locateCalls() - calls; got != 10 {
			t.Fatalf("%d looks in 10s, want 10", got)
		}
		if r.asks() != 0 {
			t.Fatalf("ntp-admin was asked %d times with no NTP zone running", r.asks())
		}

		// The zone starts, and a Poke checks it at once.
		r.locate(nil)
		now := time.Now()
		r.w.Poke()
		synctest.Wait()
		if err := r.w.Check(); err != nil || time.Now() != now || r.asks() != 1 {
			t.Fatalf("Check = %v, %v after the poke, %d asks", err, time.Since(now), r.asks())
		}
		if st := r.w.Status(); st.Since != start.Add(11*time.Second) {
			t.Fatalf("status %+v", st)
		}
	})
}

func TestWatcherGivesUpOnAHangingTimesyncAndBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var (
			mu       sync.Mutex
			arrivals []time.Duration
		)
		r := newRig(t, "", false, Options{})
		r.net.serve(ntpAddr.String(), http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			mu.Lock()
			arrivals = append(arrivals, time.Since(start))
			mu.Unlock()
			<-req.Context().Done() // never answers; ends when the client gives up
		}))
		r.run()
		defer r.stop()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: /timesync unreachable: GET http://[fd00:1122:3344:101::5]:10123/timesync: no answer within 2s", ErrUnreachable)
		if st := r.w.Status(); st.Failures != 1 || st.LastChecked != start.Add(2*time.Second) {
			t.Fatalf("status %+v", st)
		}
		// Each request waits its 2s; the pauses double from 1s to 10s.
		time.Sleep(48 * time.Second)
		synctest.Wait()
		mu.Lock()
		got := slices.Clone(arrivals)
		mu.Unlock()
		var want []time.Duration
		for _, s := range []int{0, 3, 7, 13, 23, 35, 47} {
			want = append(want, time.Duration(s)*time.Second)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("requests at %v, want %v", got, want)
		}
		if st := r.w.Status(); st.Failures != 7 { // the seventh ended at 49s
			t.Fatalf("status %+v", st)
		}
		// Run ends while a request is out: what it was doing is not
		// published as a failure.
		r.stop()
		if st := r.w.Status(); st.Failures != 7 || strings.Contains(st.Reason, "cancel") {
			t.Fatalf("status after Run ended: %+v", st)
		}
	})
}

func TestWatcherReportsAFailingNTPAdmin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, "", true, Options{})
		r.tracker.set("", errors.New("506 Cannot talk to daemon"))
		r.run()
		defer r.stop()
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: /timesync unreachable: GET http://[fd00:1122:3344:101::5]:10123/timesync: 500 Internal Server Error: chronyc tracking failed: 506 Cannot talk to daemon", ErrUnreachable)
		r.net.stop(ntpAddr.String())
		time.Sleep(time.Minute)
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: /timesync unreachable: GET http://[fd00:1122:3344:101::5]:10123/timesync: dial tcp: connection refused", ErrUnreachable)
	})
}

// A loss of sync after time was synchronized is reported and holds back
// new starts (as upstream's reconciler, which checks on every pass); the
// first sync stays recorded.
func TestWatcherReportsALossOfSyncAndHoldsNewStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRig(t, recSyncedV4, true, Options{}).run()
		defer r.stop()
		synctest.Wait()
		if err := r.w.Check(); err != nil {
			t.Fatal(err)
		}
		r.tracker.set(recLocal8, nil) // chronyd lost its peer
		time.Sleep(5 * time.Second)
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: NTP zone reports the reference is the local clock, not a peer", ErrNotSynced)
		st := r.w.Status()
		if st.Synced || !st.Released || st.Reason != "NTP zone reports the reference is the local clock, not a peer" || !st.Since.IsZero() || st.ReleasedAt != start || st.Source != "7F7F0101" || st.Stratum != 8 {
			t.Fatalf("status %+v", st)
		}
		// The NTP zone goes away altogether: reported, the gate shut.
		r.locate(ErrNoNTPZone)
		time.Sleep(time.Second)
		synctest.Wait()
		notSynced(t, r.w.Check(), "time not yet synchronized: no NTP zone in the config", ErrNoNTPZone)
		if st := r.w.Status(); st.Reason != "no NTP zone in the config" || st.Source != "7F7F0101" || st.ReportAt != start.Add(5*time.Second) {
			t.Fatalf("status %+v", st)
		}
		// It comes back synchronized.
		r.locate(nil)
		r.tracker.set(recSyncedV6, nil)
		time.Sleep(time.Second)
		synctest.Wait()
		if st := r.w.Status(); !st.Synced || st.Since != start.Add(7*time.Second) || st.ReleasedAt != start {
			t.Fatalf("status %+v", st)
		}
		if err := r.w.Check(); err != nil {
			t.Fatal(err)
		}
		if got := r.flips(); !slices.Equal(got, []bool{true, false, false, true}) {
			t.Fatalf("OnChange calls %v, want synced, lost, NTP zone gone, synced", got)
		}
	})
}

func TestWatcherSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, recUnsynced, true, Options{Skip: true}).run()
		defer r.stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check = %v with Skip", err)
		}
		if st := r.w.Status(); !st.Skipped || !st.Released || st.Synced || st.Reason == "" {
			t.Fatalf("status %+v", st)
		}
		if r.locateCalls() != 0 || r.asks() != 0 || len(r.flips()) != 0 {
			t.Fatalf("skipped, yet %d looks, %d asks, %d changes", r.locateCalls(), r.asks(), len(r.flips()))
		}
	})
}

func TestWatcherWithoutLocateFails(t *testing.T) {
	if err := NewWatcher(Options{}).Run(context.Background()); err == nil {
		t.Fatal("Run without Locate returned nil")
	}
}

// TestWatcherOverTCP runs the watcher's default client against ntp-admin
// on a real loopback socket.
func TestWatcherOverTCP(t *testing.T) {
	srv := httptest.NewServer(NewHandler(&fakeTracker{line: recSyncedV4}, HandlerOptions{}))
	defer srv.Close()
	addr := netip.MustParseAddrPort(srv.Listener.Addr().String())
	w := NewWatcher(Options{Locate: func() (netip.AddrPort, error) { return addr, nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second) // detects a hang only
	for w.Check() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not released: %v (%+v)", w.Check(), w.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := w.Status(); !st.Synced || st.NTPAdmin != addr.String() || st.Source != "127.0.0.1" || st.Stratum != 9 {
		t.Fatalf("status %+v", st)
	}
}

// A synchronized answer is the NTP zone's that gave it: the moment Locate
// no longer names that zone (the config dropped it, it stopped running),
// Check holds new starts, before the next check has run, and asks for one.
func TestWatcherCheckFollowsLocateBetweenChecks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, recSyncedV6, true, Options{SyncedPeriod: time.Hour}).run()
		defer r.stop()
		synctest.Wait()
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check = %v, want synchronized", err)
		}
		asks := r.asks()

		r.locate(ErrNoNTPZone)
		notSynced(t, r.w.Check(), "time not yet synchronized: "+ErrNoNTPZone.Error(), ErrNoNTPZone)
		synctest.Wait() // the check Check asked for, well before the hour
		if got := r.asks(); got != asks {
			t.Fatalf("ntp-admin asked %d times with no NTP zone located, want %d", got, asks)
		}
		if st := r.w.Status(); st.Synced {
			t.Fatalf("status after the asked-for check: %+v", st)
		}

		r.locate(nil)
		r.w.Poke()
		synctest.Wait()
		if err := r.w.Check(); err != nil {
			t.Fatalf("Check = %v with the NTP zone back", err)
		}
	})
}
