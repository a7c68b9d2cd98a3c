package servers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sled-agent/sled-agent/internal/dns"
)

var (
	ntpA = netip.MustParseAddr("fd00:1122:3344:101::5")
	ntpB = netip.MustParseAddr("fd00:1122:3344:102::5")
	ntpC = netip.MustParseAddr("fd00:1122:3344:103::5")
)

// fakeResolver answers with what it is told and records when it was asked.
type fakeResolver struct {
	start time.Time

	mu      sync.Mutex
	addrs   []netip.Addr
	err     error
	hang    bool            // block until the lookup's context ends
	lookups []time.Duration // since start
	names   []string
}

func (r *fakeResolver) LookupAAAA(ctx context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.lookups = append(r.lookups, time.Since(r.start))
	r.names = append(r.names, name)
	addrs, err, hang := slices.Clone(r.addrs), r.err, r.hang
	r.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return addrs, err
}

func (r *fakeResolver) answer(err error, addrs ...netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs, r.err = addrs, err
}

func (r *fakeResolver) lookupTimes() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lookups)
}

// call is one SetServers: when (since the start), to which zone, what.
type call struct {
	At       time.Duration
	Zone     string
	Servers  string
	Deadline time.Duration // of its context, since the start
}

// fakeSetter records every SetServers and fails or hangs as told.
type fakeSetter struct {
	start time.Time

	mu    sync.Mutex
	calls []call
	fail  map[string]int  // zone ID → how many more calls fail
	hang  map[string]bool // zone ID → block until the context ends
}

func (s *fakeSetter) SetServers(ctx context.Context, z Zone, servers []netip.Addr) error {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	c := call{At: time.Since(s.start), Zone: z.ID, Servers: join(servers), Deadline: d.Sub(s.start)}
	s.calls = append(s.calls, c)
	hang := s.hang[z.ID]
	fail := s.fail[z.ID] > 0
	if fail {
		s.fail[z.ID]--
	}
	s.mu.Unlock()
	switch {
	case hang:
		<-ctx.Done()
		return ctx.Err()
	case fail:
		return errors.New("chronyc: chronyd is not running")
	}
	return nil
}

// take returns the calls recorded since the last take, in zone order per
// instant (the zones are set at once).
func (s *fakeSetter) take() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	slices.SortStableFunc(c, func(a, b call) int {
		if a.At != b.At {
			return int(a.At - b.At)
		}
		return strings.Compare(a.Zone, b.Zone)
	})
	return c
}

func join(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// fakeZones is the agent's view of the running internal NTP zones.
type fakeZones struct {
	mu    sync.Mutex
	zones []Zone
}

func (z *fakeZones) get() []Zone {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.zones)
}

func (z *fakeZones) set(zones ...Zone) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.zones = zones
}

func ntpZone(id, instance string) Zone {
	return Zone{ID: id, Name: "oxz_ntp_" + id, Instance: instance}
}

// harness runs a Follower with fakes inside a synctest bubble.
type harness struct {
	t      *testing.T
	start  time.Time
	res    *fakeResolver
	set    *fakeSetter
	zones  *fakeZones
	f      *Follower
	cancel context.CancelFunc
	done   chan error
}

func newHarness(t *testing.T, tweak func(*Options)) *harness {
	t.Helper()
	start := time.Now()
	h := &harness{
		t:     t,
		start: start,
		res:   &fakeResolver{start: start},
		set:   &fakeSetter{start: start, fail: map[string]int{}, hang: map[string]bool{}},
		zones: &fakeZones{},
		done:  make(chan error, 1),
	}
	opts := Options{Resolver: h.res, Zones: h.zones.get, Setter: h.set}
	if tweak != nil {
		tweak(&opts)
	}
	f, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.f = f
	return h
}

// run starts Run; the test's end stops it and checks that it returned.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(h.t.Context())
	h.cancel = cancel
	go func() { h.done <- h.f.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
	synctest.Wait()
}

// until sleeps until d after the start and lets the follower settle.
func (h *harness) until(d time.Duration) {
	time.Sleep(d - time.Since(h.start))
	synctest.Wait()
}

func (h *harness) wantCalls(what string, want ...call) {
	h.t.Helper()
	got := h.set.take()
	for i := range got {
		got[i].Deadline = 0 // checked on its own where it matters
	}
	if diff := cmp.Diff(want, got); diff != "" {
		h.t.Errorf("%s: SetServers calls (-want +got):\n%s", what, diff)
	}
}

func secs(s ...float64) []time.Duration {
	d := make([]time.Duration, len(s))
	for i, x := range s {
		d[i] = time.Duration(x * float64(time.Second))
	}
	return d
}

func TestServersSentSortedOnceToEveryZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpB, ntpA, ntpB)
		h.zones.set(ntpZone("z1", "1"), ntpZone("z2", "1"))
		h.run()
		want := join([]netip.Addr{ntpA, ntpB})
		h.wantCalls("at the start", call{0, "z1", want, 0}, call{0, "z2", want, 0})

		// The same servers, in another order: nothing is sent again.
		h.res.answer(nil, ntpA, ntpB)
		h.until(55 * time.Second)
		h.wantCalls("with the same servers")
		if diff := cmp.Diff(secs(0, 10, 20, 30, 40, 50), h.res.lookupTimes()); diff != "" {
			t.Errorf("lookups every 10s once servers were found (-want +got):\n%s", diff)
		}
		if h.res.names[0] != dns.BoundaryNTPName {
			t.Errorf("looked up %q, want %q", h.res.names[0], dns.BoundaryNTPName)
		}

		// Another set of servers goes to every zone at the next lookup.
		h.res.answer(nil, ntpC)
		h.until(65 * time.Second)
		h.wantCalls("after a change", call{60 * time.Second, "z1", ntpC.String(), 0}, call{60 * time.Second, "z2", ntpC.String(), 0})

		st := h.f.Status()
		if !slices.Equal(st.Servers, []netip.Addr{ntpC}) || st.Err() != nil || st.LookupError != "" || !st.FoundAt.Equal(h.start.Add(60*time.Second)) {
			t.Errorf("status = %+v; want servers %v found at 60s, no error", st, ntpC)
		}
		if len(st.Zones) != 2 {
			t.Fatalf("status zones = %+v; want z1 and z2", st.Zones)
		}
		for _, z := range st.Zones {
			if !slices.Equal(z.Servers, []netip.Addr{ntpC}) || z.Error != "" || !z.SetAt.Equal(h.start.Add(60*time.Second)) {
				t.Errorf("zone status = %+v; want %v set at 60s", z, ntpC)
			}
		}
	})
}

func TestLookupPeriodsAndBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.zones.set(ntpZone("z1", "1"))
		h.run() // no records yet: every second, backing off to the period
		h.until(36 * time.Second)
		if diff := cmp.Diff(secs(0, 1, 3, 7, 15, 25, 35), h.res.lookupTimes()); diff != "" {
			t.Errorf("before servers were found (-want +got):\n%s", diff)
		}
		h.wantCalls("before servers were found")

		h.res.answer(nil, ntpA)
		h.until(56 * time.Second)
		h.wantCalls("once found", call{45 * time.Second, "z1", ntpA.String(), 0})

		// Unreachable DNS: the period doubles up to MaxBackoff.
		h.res.answer(fmt.Errorf("%w: no answer", dns.ErrUnreachable))
		h.until(200 * time.Second)
		if diff := cmp.Diff(secs(0, 1, 3, 7, 15, 25, 35, 45, 55, 65, 75, 95, 125, 155, 185), h.res.lookupTimes()); diff != "" {
			t.Errorf("lookups (-want +got):\n%s", diff)
		}
		h.wantCalls("while DNS is unreachable")
		st := h.f.Status()
		if !errors.Is(st.Err(), dns.ErrUnreachable) || st.Failures != 6 || !slices.Equal(st.Servers, []netip.Addr{ntpA}) {
			t.Errorf("status = %+v; want ErrUnreachable, 6 failures, %v kept", st, ntpA)
		}
	})
}

func TestEmptyAnswerKeepsTheLastServers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA, ntpB)
		h.zones.set(ntpZone("z1", "1"))
		h.run()
		both := join([]netip.Addr{ntpA, ntpB})
		h.wantCalls("at the start", call{0, "z1", both, 0})

		// The name vanishes from DNS: nothing is wiped.
		h.res.answer(nil)
		h.until(15 * time.Second)
		h.wantCalls("after an empty answer")
		st := h.f.Status()
		if !errors.Is(st.Err(), ErrNoServers) || !strings.Contains(st.LookupError, dns.BoundaryNTPName) {
			t.Errorf("status error %q (%v); want ErrNoServers naming %s", st.LookupError, st.Err(), dns.BoundaryNTPName)
		}
		if !slices.Equal(st.Servers, []netip.Addr{ntpA, ntpB}) || !st.FoundAt.Equal(h.start) || !st.LastLookup.Equal(h.start.Add(10*time.Second)) {
			t.Errorf("status = %+v; want %s kept, found at 0s, looked up at 10s", st, both)
		}
		if z := st.Zones[0]; join(z.Servers) != both {
			t.Errorf("zone status = %+v; want %s kept", z, both)
		}

		// A zone that starts meanwhile gets the last servers found.
		h.zones.set(ntpZone("z1", "1"), ntpZone("z2", "1"))
		h.f.Poke()
		synctest.Wait()
		h.wantCalls("a new zone while DNS has none", call{15 * time.Second, "z2", both, 0})
	})
}

func TestNewZonesAndNewInstances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA)
		h.zones.set(ntpZone("z1", "1"))
		h.run()
		h.wantCalls("at the start", call{0, "z1", ntpA.String(), 0})

		// Started again: the same servers go to the new instance, at once
		// when poked.
		h.until(3 * time.Second)
		h.zones.set(ntpZone("z1", "2"))
		h.f.Poke()
		synctest.Wait()
		h.wantCalls("a new instance", call{3 * time.Second, "z1", ntpA.String(), 0})

		// Gone, then back: new to the follower.
		h.zones.set()
		h.until(15 * time.Second)
		if st := h.f.Status(); len(st.Zones) != 0 {
			t.Errorf("status zones = %+v; want none once the zone is gone", st.Zones)
		}
		h.zones.set(ntpZone("z1", "2"))
		h.until(25 * time.Second)
		h.wantCalls("back", call{23 * time.Second, "z1", ntpA.String(), 0})
	})
}

func TestFailedSetIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA)
		h.zones.set(ntpZone("z1", "1"), ntpZone("z2", "1"))
		h.set.fail["z1"] = 2
		h.run()
		st := h.f.Status()
		if z := st.Zones[0]; z.ID != "z1" || !strings.Contains(z.Error, "not running") || z.Failures != 1 || len(z.Servers) != 0 || !z.LastAttempt.Equal(h.start) {
			t.Errorf("z1 status = %+v; want its error, no servers", z)
		}
		if z := st.Zones[1]; z.ID != "z2" || z.Error != "" || join(z.Servers) != ntpA.String() {
			t.Errorf("z2 status = %+v; want %v set", z, ntpA)
		}

		// Retried after 1s, then 2s; the zone that has them is left alone.
		h.until(30 * time.Second)
		a := ntpA.String()
		h.wantCalls("retries", call{0, "z1", a, 0}, call{0, "z2", a, 0}, call{1 * time.Second, "z1", a, 0}, call{3 * time.Second, "z1", a, 0})
		if z := h.f.Status().Zones[0]; z.Error != "" || z.Failures != 0 || join(z.Servers) != a || !z.SetAt.Equal(h.start.Add(3*time.Second)) {
			t.Errorf("z1 status = %+v; want %v set at 3s", z, ntpA)
		}
		if diff := cmp.Diff(secs(0, 1, 3, 13, 23), h.res.lookupTimes()); diff != "" {
			t.Errorf("lookups (-want +got):\n%s", diff)
		}
	})
}

func TestSetUnderDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA)
		h.zones.set(ntpZone("z1", "1"), ntpZone("z2", "1"))
		h.set.hang["z1"] = true
		h.run()

		// z1's set hangs: the status is still readable, with the lookup.
		h.until(5 * time.Second)
		if st := h.f.Status(); !st.LastLookup.Equal(h.start) || join(st.Servers) != ntpA.String() || len(st.Zones) != 2 || st.Zones[0].Servers != nil {
			t.Errorf("status = %+v during the sets; want the lookup's servers, no zone set yet", st)
		}
		calls := h.set.take()
		if len(calls) != 2 || calls[0].Deadline != 10*time.Second || calls[1].Deadline != 10*time.Second {
			t.Errorf("calls = %+v; want both zones, each with a 10s deadline", calls)
		}

		h.until(10 * time.Second)
		st := h.f.Status()
		if z := st.Zones[0]; !strings.Contains(z.Error, "no answer within 10s") || z.Failures != 1 {
			t.Errorf("z1 status = %+v; want the deadline", z)
		}
		if z := st.Zones[1]; z.Error != "" || join(z.Servers) != ntpA.String() {
			t.Errorf("z2 status = %+v; want set despite z1", z)
		}
		// Retried a second after the deadline.
		h.set.mu.Lock()
		h.set.hang["z1"] = false
		h.set.mu.Unlock()
		h.until(12 * time.Second)
		h.wantCalls("the retry", call{11 * time.Second, "z1", ntpA.String(), 0})
	})
}

func TestLookupUnderDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.hang = true
		h.run()
		h.until(3 * time.Second)
		if st := h.f.Status(); !st.LastLookup.IsZero() {
			t.Errorf("status = %+v during a hanging lookup; want none published yet", st)
		}
		h.until(5 * time.Second)
		st := h.f.Status()
		if !errors.Is(st.Err(), context.DeadlineExceeded) || !st.LastLookup.Equal(h.start.Add(5*time.Second)) || st.Failures != 1 {
			t.Errorf("status = %+v (%v); want the lookup's deadline at 5s", st, st.Err())
		}
		h.until(7 * time.Second)
		if diff := cmp.Diff(secs(0, 6), h.res.lookupTimes()); diff != "" {
			t.Errorf("lookups (-want +got):\n%s", diff)
		}
	})
}

func TestRunEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA)
		h.zones.set(ntpZone("z1", "1"))
		h.set.hang["z1"] = true
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- h.f.Run(ctx) }()
		h.until(2 * time.Second)
		if err := h.f.Run(ctx); err == nil {
			t.Error("a second Run: no error")
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		if d := time.Since(h.start); d != 2*time.Second {
			t.Errorf("Run returned %s after the start; want at once when cancelled at 2s", d)
		}
		if st := h.f.Status(); len(st.Zones) != 1 || st.Zones[0].Error != "" || st.Zones[0].Failures != 0 || !st.Zones[0].LastAttempt.IsZero() {
			t.Errorf("status = %+v; the cancelled set is not a failure", st)
		}
	})
}

func TestNewChecksOptions(t *testing.T) {
	r, s, z := &fakeResolver{}, &fakeSetter{}, (&fakeZones{}).get
	for _, tt := range []struct {
		name string
		opts Options
	}{
		{"no resolver", Options{Zones: z, Setter: s}},
		{"no zones", Options{Resolver: r, Setter: s}},
		{"no setter", Options{Resolver: r, Zones: z}},
		{"negative period", Options{Resolver: r, Zones: z, Setter: s, Period: -time.Second}},
	} {
		if _, err := New(tt.opts); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

func TestFailedSetIsRetriedEvenWithTheServersSetBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, nil)
		h.res.answer(nil, ntpA)
		h.zones.set(ntpZone("z1", "1"))
		h.run()

		// Sending B fails (perhaps after its sources file was written),
		// then DNS says A again: A is sent, though the zone had it before.
		h.res.answer(nil, ntpB)
		h.set.mu.Lock()
		h.set.fail["z1"] = 1
		h.set.mu.Unlock()
		h.until(10 * time.Second)
		h.res.answer(nil, ntpA)
		h.until(12 * time.Second)
		a, b := ntpA.String(), ntpB.String()
		h.wantCalls("after the failure", call{0, "z1", a, 0}, call{10 * time.Second, "z1", b, 0}, call{11 * time.Second, "z1", a, 0})
	})
}
