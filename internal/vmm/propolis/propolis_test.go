package propolis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Transition times of the guests under test: distinct, so that a timer
// firing at the wrong moment shows.
var testOpts = Options{BootTime: 5 * time.Second, StopTime: 3 * time.Second, RebootTime: 7 * time.Second}

// step is one line of a transcript: a request (or none), then a sleep of
// the virtual clock, then the status the guest must report.
type step struct {
	req Request
	// refused is set when req must fail with ErrInvalidTransition.
	refused bool
	sleep   time.Duration
	gen     uint64
	state   State
	detail  string
}

func TestTransitions(t *testing.T) {
	const (
		boot, stop, reboot = 5 * time.Second, 3 * time.Second, 7 * time.Second
		ns                 = time.Nanosecond
	)
	tests := []struct {
		name  string
		steps []step
	}{
		{"a starting guest boots only when asked", []step{
			{sleep: time.Hour, gen: 1, state: StateStarting, detail: detailWaiting},
			{req: RequestRunning, gen: 2, state: StateStarting, detail: detailBooting},
			{sleep: boot - ns, gen: 2, state: StateStarting, detail: detailBooting},
			{sleep: ns, gen: 3, state: StateRunning},
			{sleep: time.Hour, gen: 3, state: StateRunning},
		}},
		{"repeated running requests are no-ops", []step{
			{req: RequestRunning, gen: 2, state: StateStarting, detail: detailBooting},
			{req: RequestRunning, sleep: boot - ns, gen: 2, state: StateStarting, detail: detailBooting},
			{req: RequestRunning, sleep: ns, gen: 3, state: StateRunning}, // the boot was not restarted
			{req: RequestRunning, gen: 3, state: StateRunning},
		}},
		{"reboot", []step{
			{req: RequestRunning, sleep: boot, gen: 3, state: StateRunning},
			{req: RequestReboot, gen: 4, state: StateRebooting},
			{req: RequestReboot, sleep: reboot - ns, gen: 4, state: StateRebooting},
			{req: RequestRunning, gen: 4, state: StateRebooting},
			{sleep: ns, gen: 5, state: StateRunning},
			{req: RequestReboot, sleep: reboot, gen: 7, state: StateRunning},
		}},
		{"stop a running guest", []step{
			{req: RequestRunning, sleep: boot, gen: 3, state: StateRunning},
			{req: RequestStopped, gen: 4, state: StateStopping, detail: "stop requested while running"},
			{req: RequestStopped, gen: 4, state: StateStopping, detail: "stop requested while running"},
			{req: RequestRunning, refused: true, gen: 4, state: StateStopping, detail: "stop requested while running"},
			{req: RequestReboot, refused: true, sleep: stop - ns, gen: 4, state: StateStopping, detail: "stop requested while running"},
			{sleep: ns, gen: 5, state: StateStopped},
		}},
		{"stopped is final", []step{
			{req: RequestStopped, sleep: stop, gen: 3, state: StateStopped},
			{req: RequestStopped, gen: 3, state: StateStopped},
			{req: RequestRunning, refused: true, gen: 3, state: StateStopped},
			{req: RequestReboot, refused: true, sleep: time.Hour, gen: 3, state: StateStopped},
		}},
		{"stop a guest that was never asked to run", []step{
			{req: RequestStopped, gen: 2, state: StateStopping, detail: "stop requested while starting"},
			{sleep: stop, gen: 3, state: StateStopped},
		}},
		{"a stop wins over a boot", []step{
			{req: RequestRunning, sleep: boot - time.Second, gen: 2, state: StateStarting, detail: detailBooting},
			{req: RequestStopped, gen: 3, state: StateStopping, detail: "stop requested while booting"},
			// The boot would have ended here: it must not.
			{sleep: time.Second, gen: 3, state: StateStopping, detail: "stop requested while booting"},
			{sleep: stop - time.Second, gen: 4, state: StateStopped},
			{sleep: time.Hour, gen: 4, state: StateStopped},
		}},
		{"a stop wins over a reboot", []step{
			{req: RequestRunning, sleep: boot, gen: 3, state: StateRunning},
			{req: RequestReboot, sleep: stop - ns, gen: 4, state: StateRebooting},
			{req: RequestStopped, gen: 5, state: StateStopping, detail: "stop requested while rebooting"},
			{req: RequestRunning, refused: true, sleep: stop, gen: 6, state: StateStopped},
			// The reboot would have ended here: it must not.
			{sleep: reboot, gen: 6, state: StateStopped},
		}},
		{"reboot needs a running guest", []step{
			{req: RequestReboot, refused: true, gen: 1, state: StateStarting, detail: detailWaiting},
			{req: RequestRunning, gen: 2, state: StateStarting, detail: detailBooting},
			{req: RequestReboot, refused: true, gen: 2, state: StateStarting, detail: detailBooting},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewGuest(testOpts)
				defer g.Close()
				prev := g.Status()
				for i, s := range tt.steps {
					if s.req != "" {
						before := g.Status()
						st, err := g.Request(s.req)
						switch {
						case s.refused && !errors.Is(err, ErrInvalidTransition):
							t.Fatalf("step %d: %s in %s: err %v, want ErrInvalidTransition", i, s.req, before.State, err)
						case s.refused && (!strings.Contains(err.Error(), string(before.State)) || !strings.Contains(err.Error(), string(s.req))):
							t.Errorf("step %d: refusal %q names neither the state %s nor the request %s", i, err, before.State, s.req)
						case s.refused && st != before:
							t.Errorf("step %d: refused %s returned %+v, want the unchanged %+v", i, s.req, st, before)
						case !s.refused && err != nil:
							t.Fatalf("step %d: %s in %s: %v", i, s.req, before.State, err)
						case !s.refused && st != g.Status():
							t.Errorf("step %d: %s returned %+v, guest reports %+v", i, s.req, st, g.Status())
						}
					}
					time.Sleep(s.sleep)
					synctest.Wait()
					got := g.Status()
					if got.Gen != s.gen || got.State != s.state || got.Detail != s.detail {
						t.Fatalf("step %d: status %+v, want gen %d, state %s, detail %q", i, got, s.gen, s.state, s.detail)
					}
					// A change stamps the time it happened; no change keeps
					// the stamp.
					if got.Gen == prev.Gen && got != prev {
						t.Errorf("step %d: status changed to %+v without a new generation (was %+v)", i, got, prev)
					}
					if got.TimeUpdated.Location() != time.UTC || got.TimeUpdated.After(time.Now()) {
						t.Errorf("step %d: time_updated %v", i, got.TimeUpdated)
					}
					prev = got
				}
			})
		})
	}
}

// TestEveryChangeIsOneGeneration follows a guest through a whole life with
// a waiter that sees every change, and checks the transcript: each
// generation once, in order, with times that never go back.
func TestEveryChangeIsOneGeneration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGuest(testOpts)
		defer g.Close()
		seen := []Status{g.Status()}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			st := seen[0]
			for {
				var err error
				st, err = g.Wait(ctx, st.Gen)
				if err != nil {
					return
				}
				seen = append(seen, st)
			}
		}()
		step := func(r Request, d time.Duration) {
			if _, err := g.Request(r); err != nil {
				t.Fatal(err)
			}
			time.Sleep(d)
			synctest.Wait()
		}
		step(RequestRunning, time.Minute)
		step(RequestReboot, time.Minute)
		step(RequestReboot, 2*time.Second)
		step(RequestStopped, time.Minute)
		cancel()
		<-done

		want := []State{StateStarting, StateStarting, StateRunning, StateRebooting, StateRunning, StateRebooting, StateStopping, StateStopped}
		if len(seen) != len(want) {
			t.Fatalf("saw %d statuses %+v, want %d", len(seen), seen, len(want))
		}
		for i, st := range seen {
			if st.Gen != uint64(i+1) || st.State != want[i] {
				t.Errorf("status %d: %+v, want gen %d state %s", i, st, i+1, want[i])
			}
			if i > 0 && st.TimeUpdated.Before(seen[i-1].TimeUpdated) {
				t.Errorf("status %d: time_updated %v before %v", i, st.TimeUpdated, seen[i-1].TimeUpdated)
			}
		}
	})
}

func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGuest(testOpts)
		defer g.Close()

		// Already past: at once.
		if st, err := g.Wait(t.Context(), 0); err != nil || st.Gen != 1 {
			t.Fatalf("Wait(0) = %+v, %v", st, err)
		}

		// Nothing changes: the context ends the wait with the current status.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		st, err := g.Wait(ctx, 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || st.Gen != 1 || st.State != StateStarting {
			t.Fatalf("Wait with nothing changing = %+v, %v; want gen 1 and DeadlineExceeded", st, err)
		}

		// Many waiters, one change: all wake with it.
		type result struct {
			st  Status
			err error
		}
		results := make(chan result, 3)
		for range 3 {
			go func() {
				st, err := g.Wait(t.Context(), 1)
				results <- result{st, err}
			}()
		}
		synctest.Wait()
		if len(results) != 0 {
			t.Fatal("a waiter returned before any change")
		}
		g.Request(RequestRunning)
		for range 3 {
			r := <-results
			if r.err != nil || r.st.Gen != 2 || r.st.Detail != detailBooting {
				t.Errorf("waiter woke with %+v, %v; want gen 2, booting", r.st, r.err)
			}
		}

		// A waiter for the timer-driven change wakes when it fires.
		st, err = g.Wait(t.Context(), 2)
		if err != nil || st.Gen != 3 || st.State != StateRunning {
			t.Errorf("Wait(2) = %+v, %v; want gen 3, running", st, err)
		}
	})
}

func TestCloseStopsTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGuest(testOpts)
		g.Request(RequestRunning)
		g.Close()
		time.Sleep(time.Hour)
		synctest.Wait()
		if st := g.Status(); st.Gen != 2 || st.State != StateStarting {
			t.Errorf("after Close the guest went on to %+v", st)
		}
		// Requests are still taken, but start nothing.
		if _, err := g.Request(RequestStopped); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if st := g.Status(); st.Gen != 3 || st.State != StateStopping {
			t.Errorf("after Close and a stop: %+v, want gen 3 stopping", st)
		}
	})
}

func TestUnknownRequest(t *testing.T) {
	g := NewGuest(testOpts)
	defer g.Close()
	for _, r := range []Request{"", "start", "Running", "migrating"} {
		_, err := g.Request(r)
		if err == nil || errors.Is(err, ErrInvalidTransition) || !strings.Contains(err.Error(), "unknown request") {
			t.Errorf("Request(%q) = %v, want an unknown-request error", r, err)
		}
	}
	if st := g.Status(); st.Gen != 1 {
		t.Errorf("unknown requests changed the guest: %+v", st)
	}
}

func TestDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGuest(Options{StopTime: -time.Second})
		defer g.Close()
		g.Request(RequestRunning)
		time.Sleep(DefaultBootTime - time.Nanosecond)
		synctest.Wait()
		if st := g.Status(); st.State != StateStarting {
			t.Fatalf("booted before the default boot time: %+v", st)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		g.Request(RequestReboot)
		time.Sleep(DefaultRebootTime)
		synctest.Wait()
		if st := g.Status(); st.Gen != 5 || st.State != StateRunning {
			t.Fatalf("after the default boot and reboot times: %+v, want gen 5 running", st)
		}
		g.Request(RequestStopped) // a negative stop time means the default too
		time.Sleep(DefaultStopTime - time.Nanosecond)
		synctest.Wait()
		if st := g.Status(); st.State != StateStopping {
			t.Fatalf("stopped before the default stop time: %+v", st)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if st := g.Status(); st.State != StateStopped {
			t.Fatalf("not stopped after the default stop time: %+v", st)
		}
	})
}

// TestConcurrentRequests races requests and waiters (for the race
// detector) and checks that generations stay gapless and ordered.
func TestConcurrentRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGuest(Options{BootTime: time.Millisecond, StopTime: time.Millisecond, RebootTime: time.Millisecond})
		defer g.Close()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for j := range 50 {
					g.Request([]Request{RequestRunning, RequestReboot, RequestRunning}[(i+j)%3])
					time.Sleep(time.Duration(i+1) * 100 * time.Microsecond)
				}
			})
		}
		wg.Go(func() {
			st := g.Status()
			for st.State != StateStopped {
				next, err := g.Wait(t.Context(), st.Gen)
				if err != nil || next.Gen <= st.Gen {
					t.Errorf("Wait(%d) = %+v, %v", st.Gen, next, err)
					return
				}
				st = next
			}
		})
		time.Sleep(time.Second)
		g.Request(RequestStopped)
		wg.Wait()
		if st := g.Status(); st.State != StateStopped {
			t.Errorf("final status %+v, want stopped", st)
		}
	})
}
