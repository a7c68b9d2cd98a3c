package nexus

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeVMMs is a Nexus taking VMM states. It records every state it took
// per VMM; while held, requests wait (as a hanging Nexus's do) until
// released or their ctx ends; answer, if set, decides each request's
// error.
type fakeVMMs struct {
	mu     sync.Mutex
	got    map[string][]uint64
	calls  int
	hold   chan struct{} // closed: not holding
	answer func(ctx context.Context, id string, gen uint64) error
}

func newFakeVMMs() *fakeVMMs {
	f := &fakeVMMs{got: map[string][]uint64{}, hold: make(chan struct{})}
	close(f.hold)
	return f
}

func (f *fakeVMMs) PutVMM(ctx context.Context, id string, st SledVmmState) error {
	f.mu.Lock()
	f.calls++
	hold, answer := f.hold, f.answer
	f.mu.Unlock()
	select {
	case <-hold:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnreachable, ctx.Err())
	}
	if answer != nil {
		if err := answer(ctx, id, st.VmmState.Gen); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got[id] = append(f.got[id], st.VmmState.Gen)
	return nil
}

func (f *fakeVMMs) holdAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = make(chan struct{})
}

func (f *fakeVMMs) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.hold)
}

func (f *fakeVMMs) taken(id string) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.got[id]...)
}

func state(gen uint64, s string) VmmRuntimeState {
	return VmmRuntimeState{Gen: gen, State: s, TimeUpdated: time.Now()}
}

const vmmA = "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01"

func newPublisher(t *testing.T, f VMMs) (*Publisher, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	p := NewPublisher(f, PublisherOptions{})
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p, cancel
}

// States produced while a request is in flight are coalesced into the
// newest, and go out in order.
func TestStatesWhileARequestIsOutAreCoalescedIntoTheNewest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		p, _ := newPublisher(t, f)
		f.holdAll()
		p.Publish(vmmA, state(1, "starting"))
		synctest.Wait()
		for gen, s := range []string{"running", "rebooting", "running", "stopping"} {
			p.Publish(vmmA, state(uint64(gen+2), s))
		}
		p.Publish(vmmA, state(3, "rebooting")) // older: ignored
		if st := p.Status(); len(st) != 1 || !st[0].Sending || st[0].Latest.Gen != 5 || st[0].Delivered != 0 {
			t.Fatalf("status while Nexus holds the request: %+v", st)
		}
		f.release()
		synctest.Wait()
		if diff := cmp.Diff([]uint64{1, 5}, f.taken(vmmA)); diff != "" {
			t.Fatalf("generations Nexus took (-want +got):\n%s", diff)
		}
		if st := p.Status(); st[0].Sending || st[0].Delivered != 5 {
			t.Fatalf("status after: %+v", st)
		}
	})
}

// Transient failures are retried with backoff until Nexus takes the state;
// once Nexus is back, the newest state arrives within one backoff.
func TestTransientFailuresAreRetriedUntilNexusTakesTheNewestState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		var mu sync.Mutex
		down, back := true, time.Time{}
		start := time.Now()
		f.answer = func(context.Context, string, uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if !down {
				return nil
			}
			if time.Since(start) >= 30*time.Second {
				// Nexus comes back just after this failed attempt: the
				// next comes a whole pause later, the longest by now.
				down, back = false, time.Now()
			}
			return &APIError{StatusCode: http.StatusServiceUnavailable, Message: "unavailable"}
		}
		p, _ := newPublisher(t, f)
		p.Publish(vmmA, state(1, "starting"))
		p.Publish(vmmA, state(2, "running"))
		time.Sleep(30 * time.Second)
		synctest.Wait()
		st := p.Status()[0]
		if st.Delivered != 0 || !st.Sending || st.Failures < 10 || st.LastError == "" {
			t.Fatalf("status with Nexus down: %+v", st)
		}
		time.Sleep(5 * time.Second) // past the first attempt after 30 s
		synctest.Wait()
		mu.Lock()
		cameBack := back
		mu.Unlock()
		if cameBack.IsZero() {
			t.Fatal("no attempt between 30 s and 35 s")
		}
		// The longest pause between retries is 4 s: by then the newest
		// state is there.
		time.Sleep(time.Until(cameBack.Add(4 * time.Second)))
		synctest.Wait()
		if st := p.Status()[0]; st.Delivered != 2 {
			t.Fatalf("4 s after Nexus came back: %+v", st)
		}
		if diff := cmp.Diff([]uint64{2}, f.taken(vmmA)); diff != "" {
			t.Fatalf("generations Nexus took (-want +got):\n%s", diff)
		}
	})
}

// A 4xx is permanent for that state: not sent again; a later state is.
func TestARefusedStateIsNotSentAgainButALaterOneIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		f.answer = func(_ context.Context, _ string, gen uint64) error {
			if gen == 1 {
				return &APIError{StatusCode: http.StatusNotFound, Message: "no such VMM"}
			}
			return nil
		}
		p, _ := newPublisher(t, f)
		p.Publish(vmmA, state(1, "starting"))
		time.Sleep(time.Minute)
		synctest.Wait()
		st := p.Status()[0]
		if f.calls != 1 || st.Refused != 1 || st.Sending || st.Pending || st.Delivered != 0 || st.LastError == "" {
			t.Fatalf("after a 404: %d calls, %+v", f.calls, st)
		}
		p.Publish(vmmA, state(2, "running"))
		synctest.Wait()
		if diff := cmp.Diff([]uint64{2}, f.taken(vmmA)); diff != "" {
			t.Fatalf("generations Nexus took (-want +got):\n%s", diff)
		}
	})
}

// Many VMMs changing at once are all delivered, and one VMM whose Nexus
// request hangs holds no other back.
func TestFiftyVMMsAtOnceAreAllDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		stuck := fmt.Sprintf("00000000-0000-4000-8000-%012d", 999)
		f.answer = func(ctx context.Context, id string, _ uint64) error {
			if id == stuck {
				<-ctx.Done() // never answers
				return ctx.Err()
			}
			return nil
		}
		p, cancel := newPublisher(t, f)
		p.Publish(stuck, state(1, "starting"))
		for i := range 50 {
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			for gen, s := range []string{"starting", "running"} {
				p.Publish(id, state(uint64(gen+1), s))
			}
		}
		synctest.Wait()
		for i := range 50 {
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			if got := f.taken(id); len(got) == 0 || got[len(got)-1] != 2 {
				t.Errorf("VMM %s: Nexus took %v", id, got)
			}
		}
		cancel()
	})
}

// A VMM forgotten is dropped once its last state is delivered.
func TestAForgottenVMMGoesOnceDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		p, _ := newPublisher(t, f)
		f.holdAll()
		p.Publish(vmmA, state(7, "destroyed"))
		p.Forget(vmmA)
		synctest.Wait()
		if len(p.Status()) != 1 {
			t.Fatal("forgotten before its last state was delivered")
		}
		f.release()
		synctest.Wait()
		if len(p.Status()) != 0 || len(f.taken(vmmA)) != 1 {
			t.Fatalf("after delivery: %+v, took %v", p.Status(), f.taken(vmmA))
		}
	})
}

// States handed over before the publisher runs (an agent adopting its VMMs
// at start) are sent once it runs.
func TestStatesBeforeRunAreSentOnceItRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeVMMs()
		p := NewPublisher(f, PublisherOptions{})
		p.Publish(vmmA, state(4, "running"))
		p.Forget(vmmA)
		time.Sleep(time.Second)
		synctest.Wait()
		if f.calls != 0 || len(p.Status()) != 1 {
			t.Fatalf("before Run: %d calls, %+v", f.calls, p.Status())
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); p.Run(ctx) }()
		synctest.Wait()
		if diff := cmp.Diff([]uint64{4}, f.taken(vmmA)); diff != "" {
			t.Fatalf("generations Nexus took (-want +got):\n%s", diff)
		}
		if len(p.Status()) != 0 {
			t.Fatalf("a forgotten VMM kept after delivery: %+v", p.Status())
		}
		cancel()
		<-done
	})
}

// A state handed over before the publisher runs (a VMM adopted at start)
// is pending, not refused.
func TestAStateBeforeRunIsPending(t *testing.T) {
	p := NewPublisher(newFakeVMMs(), PublisherOptions{})
	p.Publish(vmmA, state(1, "running"))
	st := p.Status()
	if len(st) != 1 || !st[0].Pending || st[0].Sending {
		t.Fatalf("status before Run: %+v", st)
	}
	if got, want := (Status{VMMStates: st}).Summary(), "VMM states: 0 delivered, 1 pending"; !strings.HasSuffix(got, want) {
		t.Errorf("summary %q, want it to end %q", got, want)
	}
}
