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

const sledID = "3fd34366-7974-45bd-8aa8-503d2ca9e709"

// fakeSleds is a Nexus holding sled records as upstream's does: a POST
// replaces the record only with a newer generation, a decommissioned
// record is never replaced. It records every call, and fails the next
// calls with the errors queued in fail.
type fakeSleds struct {
	mu     sync.Mutex
	record *SledAgentInfo
	calls  []string
	fail   []error
}

func (f *fakeSleds) next(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	if len(f.fail) > 0 {
		err := f.fail[0]
		f.fail = f.fail[1:]
		return err
	}
	return nil
}

func (f *fakeSleds) GetSled(_ context.Context, id string) (SledAgentInfo, error) {
	if err := f.next("GET"); err != nil {
		return SledAgentInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.record == nil {
		return SledAgentInfo{}, &APIError{StatusCode: http.StatusNotFound, Message: "not found: sled with id " + id}
	}
	return *f.record, nil
}

func (f *fakeSleds) PutSled(_ context.Context, _ string, info SledAgentInfo) error {
	if err := f.next(fmt.Sprintf("POST gen %d", info.Generation)); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.record != nil && f.record.Decommissioned {
		return &APIError{StatusCode: http.StatusBadRequest, Message: "sled has already been decommissioned"}
	}
	if f.record == nil || info.Generation > f.record.Generation {
		f.record = &info
	}
	return nil
}

func (f *fakeSleds) set(rec *SledAgentInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record = rec
}

func (f *fakeSleds) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeSleds) held() SledAgentInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.record == nil {
		return SledAgentInfo{}
	}
	return *f.record
}

func (f *fakeSleds) failNext(errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = append(f.fail, errs...)
}

var unreachable = fmt.Errorf("%w: connection refused", ErrUnreachable)

// sledInfo is a sled's info that tests change.
type sledInfo struct {
	mu   sync.Mutex
	info SledAgentInfo
}

func (s *sledInfo) get() SledAgentInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *sledInfo) change(f func(*SledAgentInfo)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.info)
}

func newSledInfo() *sledInfo {
	return &sledInfo{info: SledAgentInfo{
		SAAddress: "[fd00:1122:3344:101::1]:12345", Role: "gimlet",
		Baseboard: Baseboard{Serial: "vm", Part: "i86pc"}, CPUFamily: "unknown",
		UsableHardwareThreads: 2, UsablePhysicalRAM: 24 << 30, ReservoirSize: 14 << 30,
		Generation: 99, Decommissioned: true, // ignored: the registrar sets both
	}}
}

// run starts a registrar; it stops with the test's bubble.
func run(t *testing.T, f *fakeSleds, info *sledInfo) (*Registrar, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	r := NewRegistrar(f, sledID, info.get, RegistrarOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	return r, cancel, done
}

func expectCalls(t *testing.T, f *fakeSleds, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, f.took()); diff != "" {
		t.Fatalf("requests to Nexus (-want +got):\n%s", diff)
	}
}

func TestRegistersAtOnceWithEveryField(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		r, cancel, done := run(t, f, info)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		want := info.get()
		want.Generation, want.Decommissioned = 1, false
		if diff := cmp.Diff(want, f.held()); diff != "" {
			t.Fatalf("record Nexus holds (-want +got):\n%s", diff)
		}
		st := r.Status()
		if st.State != "registered" || st.Known == nil || *st.Known != want || st.LastSuccess == nil || st.LastError != "" || st.Outstanding != "" {
			t.Fatalf("status %+v", st)
		}
		// Nothing changes: nothing more is sent until the next check.
		time.Sleep(59 * time.Second)
		synctest.Wait()
		expectCalls(t, f)
		cancel()
		<-done
	})
}

func TestNexusDownAtStartIsRetriedWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		f.failNext(unreachable, unreachable, unreachable)
		r, cancel, done := run(t, f, info)
		synctest.Wait()
		if st := r.Status(); st.State != "retrying" || st.LastError == "" || st.NextTry == nil || st.Known != nil {
			t.Fatalf("status with Nexus down: %+v", st)
		}
		// 2 s, 4 s, 8 s after the failures; the fourth try, 14 s after
		// the start, finds it.
		time.Sleep(14*time.Second - time.Millisecond)
		synctest.Wait()
		expectCalls(t, f, "GET", "GET", "GET")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		if st := r.Status(); st.State != "registered" || st.Gets != 4 || st.Posts != 1 {
			t.Fatalf("status %+v", st)
		}
		cancel()
		<-done
	})
}

func TestAChangedFieldIsSentWithAHigherGeneration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		r, cancel, done := run(t, f, info)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		info.change(func(i *SledAgentInfo) { i.SAAddress = "[fd00:1122:3344:101::1]:23456" })
		r.Poke()
		synctest.Wait()
		expectCalls(t, f, "POST gen 2")
		if got := f.held(); got.SAAddress != "[fd00:1122:3344:101::1]:23456" || got.Generation != 2 {
			t.Fatalf("Nexus holds %+v", got)
		}
		// A poke with nothing changed sends nothing.
		r.Poke()
		synctest.Wait()
		expectCalls(t, f)
		cancel()
		<-done
	})
}

// A POST Nexus refuses (here: another agent of the sled took a newer
// generation, so ours does not replace it) makes the registrar ask again,
// then send past Nexus's generation.
func TestARefusedPostIsFollowedByAGetAndAPostPastNexussGeneration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		r, cancel, done := run(t, f, info)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		other := f.held()
		other.Generation, other.ReservoirSize = 7, 1
		f.set(&other)
		f.failNext(&APIError{StatusCode: http.StatusConflict, Message: "generation is not newer"})
		info.change(func(i *SledAgentInfo) { i.UsableHardwareThreads = 4 })
		r.Poke()
		synctest.Wait()
		if st := r.Status(); st.State != "retrying" || st.Known != nil {
			t.Fatalf("after a refused POST: %+v", st)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		expectCalls(t, f, "POST gen 2", "GET", "POST gen 8")
		if got := f.held(); got.Generation != 8 || got.UsableHardwareThreads != 4 || got.ReservoirSize != info.get().ReservoirSize {
			t.Fatalf("Nexus holds %+v", got)
		}
		cancel()
		<-done
	})
}

func TestDecommissionedMeansSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		rec := info.get()
		rec.Generation, rec.Decommissioned = 3, true
		f.set(&rec)
		r, _, done := run(t, f, info)
		synctest.Wait()
		<-done // Run returns on its own
		expectCalls(t, f, "GET")
		if st := r.Status(); st.State != "decommissioned" || st.Known == nil || !st.Known.Decommissioned {
			t.Fatalf("status %+v", st)
		}
		r.Poke()
		time.Sleep(time.Hour)
		synctest.Wait()
		expectCalls(t, f)
	})
}

// A record Nexus lost is sent again at the next check.
func TestARecordNexusLostIsSentAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		_, cancel, done := run(t, f, info)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		f.set(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		cancel()
		<-done
	})
}

// An answer that is no record (here: generation 0) is not trusted: it is
// an error, and asked again.
func TestAnUntrustworthyAnswerIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, info := &fakeSleds{}, newSledInfo()
		bad := info.get()
		bad.Generation, bad.Decommissioned = 0, false
		f.set(&bad)
		r, cancel, done := run(t, f, info)
		synctest.Wait()
		expectCalls(t, f, "GET")
		if st := r.Status(); st.State != "retrying" || !strings.Contains(st.LastError, "generation 0") {
			t.Fatalf("status %+v", st)
		}
		f.set(nil)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		expectCalls(t, f, "GET", "POST gen 1")
		cancel()
		<-done
	})
}
