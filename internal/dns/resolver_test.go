package dns

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// hangDetector is the context of every lookup: no test should come near it,
// and one that does has hung.
func hangDetector(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newResolver(t *testing.T, timeout time.Duration, servers ...netip.AddrPort) *Resolver {
	t.Helper()
	r, err := NewResolver(servers, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// closedPort is an address where nothing listens, UDP or TCP.
func closedPort(t *testing.T) netip.AddrPort {
	s := NewServer(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

var switchAddrs = []netip.AddrPort{ap("[fd00:1122:3344:101::2]:12224"), ap("[fd00:1122:3344:102::2]:12224")}

func TestLookupSwitches(t *testing.T) {
	s := startServer(t, twoSwitches())
	r := newResolver(t, time.Second, s.Addr())
	got, err := r.LookupSwitches(hangDetector(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(switchAddrs, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("switches (-want +got):\n%s", diff)
	}
}

func TestLookupServiceSortsAndDeduplicates(t *testing.T) {
	host := "ddm-a.host." + Zone
	s := startServer(t, Records{
		SRV: map[string][]SRV{"_ddm._tcp." + Zone: {
			{Target: host, Port: 8001}, {Target: host, Port: 8000}, {Target: host, Port: 8000, Priority: 1},
			{Target: "DDM-A.host." + Zone + ".", Port: 8000},
		}},
		AAAA: map[string][]netip.Addr{host: {netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1")}},
	})
	r := newResolver(t, time.Second, s.Addr())
	got, err := r.LookupService(hangDetector(t), "ddm")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{ap("[fd00::1]:8000"), ap("[fd00::1]:8001"), ap("[fd00::2]:8000"), ap("[fd00::2]:8001")}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("ddm (-want +got):\n%s", diff)
	}
}

func TestLookupNoRecords(t *testing.T) {
	missing := "dendrite-missing.host." + Zone
	noAAAA := "dendrite-no-aaaa.host." + Zone
	s := startServer(t, Records{
		SRV: map[string][]SRV{
			"_nexus._tcp." + Zone: nil, // the name exists, without records
			"_mgs._tcp." + Zone:   {{Target: missing, Port: 12225}, {Target: noAAAA, Port: 12225}},
			"_mgd._tcp." + Zone:   {{Target: missing, Port: 4676}, {Target: switch0, Port: 4676}},
			"_none._tcp." + Zone:  {{Target: ".", Port: 1}},
		},
		AAAA: map[string][]netip.Addr{
			noAAAA:  nil,
			switch0: {netip.MustParseAddr("fd00:1122:3344:101::2")},
		},
	})
	r := newResolver(t, time.Second, s.Addr())
	for _, tt := range []struct {
		service string
		want    []netip.AddrPort
	}{
		{"dendrite", nil}, // no such name
		{"nexus", nil},    // no SRV records
		{"mgs", nil},      // targets with no name and no AAAA records
		{"none", nil},     // target "."
		{"mgd", []netip.AddrPort{ap("[fd00:1122:3344:101::2]:4676")}}, // one target of two resolves
	} {
		got, err := r.LookupService(hangDetector(t), tt.service)
		if err != nil {
			t.Errorf("%s: %v", tt.service, err)
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.service, diff)
		}
	}
}

func TestLookupUnreachable(t *testing.T) {
	dropping := startServer(t, twoSwitches())
	dropping.SetFault(FaultDrop)
	for _, tt := range []struct {
		name    string
		servers []netip.AddrPort
	}{
		{"dropping", []netip.AddrPort{dropping.Addr()}},
		{"refused", []netip.AddrPort{closedPort(t)}},
		{"both", []netip.AddrPort{closedPort(t), dropping.Addr()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := hangDetector(t)
			r := newResolver(t, 100*time.Millisecond, tt.servers...)
			got, err := r.LookupSwitches(ctx)
			if !errors.Is(err, ErrUnreachable) || got != nil {
				t.Errorf("LookupSwitches = %v, %v; want ErrUnreachable", got, err)
			}
			if errors.Is(err, ErrServerFailure) {
				t.Errorf("LookupSwitches: %v, also ErrServerFailure", err)
			}
			if ctx.Err() != nil {
				t.Error("the lookup ran until the hang detector: the per-query timeout was not kept")
			}
			t.Log(err)
		})
	}
}

func TestLookupServerFailure(t *testing.T) {
	s := startServer(t, twoSwitches())
	s.SetFault(FaultServfail)
	r := newResolver(t, time.Second, closedPort(t), s.Addr())
	got, err := r.LookupSwitches(hangDetector(t))
	if !errors.Is(err, ErrServerFailure) || errors.Is(err, ErrUnreachable) || got != nil {
		t.Errorf("LookupSwitches = %v, %v; want ErrServerFailure only", got, err)
	}
	t.Log(err)
}

func TestLookupSecondServer(t *testing.T) {
	good := startServer(t, twoSwitches())
	dropping := startServer(t, Records{})
	dropping.SetFault(FaultDrop)
	failing := startServer(t, Records{})
	failing.SetFault(FaultServfail)
	for _, tt := range []struct {
		name  string
		first netip.AddrPort
	}{
		{"refused", closedPort(t)},
		{"dropping", dropping.Addr()},
		{"servfail", failing.Addr()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := hangDetector(t)
			r := newResolver(t, 100*time.Millisecond, tt.first, good.Addr())
			got, err := r.LookupSwitches(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(switchAddrs, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("switches (-want +got):\n%s", diff)
			}
		})
	}

	// A name the first server says does not exist is not asked of the
	// second.
	empty := startServer(t, Records{})
	r := newResolver(t, time.Second, empty.Addr(), good.Addr())
	if got, err := r.LookupSwitches(hangDetector(t)); got != nil || err != nil {
		t.Errorf("LookupSwitches = %v, %v; want the first server's empty answer", got, err)
	}
}

func TestLookupSeesChangesAtOnce(t *testing.T) {
	s := startServer(t, twoSwitches())
	r := newResolver(t, time.Second, s.Addr())
	ctx := hangDetector(t)
	if got, err := r.LookupSwitches(ctx); err != nil || len(got) != 2 {
		t.Fatalf("LookupSwitches = %v, %v", got, err)
	}

	// Switch 1 replaced, at a new address.
	recs := twoSwitches()
	recs.AAAA[switch1] = []netip.Addr{netip.MustParseAddr("fd00:1122:3344:103::2")}
	if err := s.SetRecords(recs); err != nil {
		t.Fatal(err)
	}
	got, err := r.LookupSwitches(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{ap("[fd00:1122:3344:101::2]:12224"), ap("[fd00:1122:3344:103::2]:12224")}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("after the change (-want +got):\n%s", diff)
	}

	// Both switches gone.
	if err := s.SetRecords(Records{}); err != nil {
		t.Fatal(err)
	}
	if got, err := r.LookupSwitches(ctx); got != nil || err != nil {
		t.Errorf("with no records: LookupSwitches = %v, %v", got, err)
	}
}

func TestLookupFallsBackToTCP(t *testing.T) {
	recs := manySwitches(64)
	s := startServer(t, recs)
	r := newResolver(t, time.Second, s.Addr())
	got, err := r.LookupSwitches(hangDetector(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 64 {
		t.Errorf("got %d switches, want 64", len(got))
	}
	s.mu.Lock()
	tcp := s.queries["tcp"]
	s.mu.Unlock()
	if tcp == 0 {
		t.Error("no query came over TCP")
	}
}

func TestLookupCancelled(t *testing.T) {
	s := startServer(t, twoSwitches())
	s.SetFault(FaultDrop)
	r := newResolver(t, time.Minute, s.Addr())

	ctx, cancel := context.WithCancel(hangDetector(t))
	cancel()
	if _, err := r.LookupSwitches(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Errorf("cancelled before: %v, want context.Canceled only", err)
	}

	// Cancelled while waiting for an answer that never comes: the lookup
	// ends at once, not after the minute of its timeout.
	hang := hangDetector(t)
	ctx, cancel = context.WithCancel(hang)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := r.LookupSwitches(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Errorf("cancelled while waiting: %v, want context.Canceled only", err)
	}
	if hang.Err() != nil {
		t.Error("the lookup ran until the hang detector")
	}

	// The caller's deadline is the server's silence: unreachable.
	ctx, cancel = context.WithTimeout(hangDetector(t), 20*time.Millisecond)
	defer cancel()
	if _, err := r.LookupSwitches(ctx); !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past the caller's deadline: %v, want ErrUnreachable and DeadlineExceeded", err)
	}
}

func TestNewResolver(t *testing.T) {
	good := []netip.AddrPort{ap("[::1]:53")}
	for _, tt := range []struct {
		name    string
		servers []netip.AddrPort
		timeout time.Duration
	}{
		{"no servers", nil, 0},
		{"no port", []netip.AddrPort{ap("[::1]:0")}, 0},
		{"invalid server", []netip.AddrPort{{}}, 0},
		{"negative timeout", good, -time.Second},
	} {
		if _, err := NewResolver(tt.servers, tt.timeout); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
	r, err := NewResolver(good, 0)
	if err != nil || r.timeout != DefaultTimeout {
		t.Errorf("NewResolver(%v, 0) = %+v, %v; want the default timeout", good, r, err)
	}

	for _, bad := range []string{"", "a.b", "_dendrite", "dendrite\x00", "a b"} {
		if _, err := r.LookupService(t.Context(), bad); err == nil {
			t.Errorf("LookupService(%q): no error", bad)
		}
	}
}

func TestBoundaryNTPName(t *testing.T) {
	// Upstream's name (internal-dns BOUNDARY_NTP_DNS_NAME in the
	// control-plane zone): internal NTP zones of a real rack find their
	// boundary NTP zones under it.
	if BoundaryNTPName != "boundary-ntp.control-plane.oxide.internal" {
		t.Errorf("BoundaryNTPName = %q", BoundaryNTPName)
	}
}

func TestLookupAAAA(t *testing.T) {
	noAAAA := "nothing.host." + Zone
	s := startServer(t, Records{AAAA: map[string][]netip.Addr{
		BoundaryNTPName: {
			netip.MustParseAddr("fd00:1122:3344:102::5"),
			netip.MustParseAddr("fd00:1122:3344:101::5"),
			netip.MustParseAddr("fd00:1122:3344:102::5"),
		},
		noAAAA: nil, // the name exists, without records
	}})
	r := newResolver(t, time.Second, s.Addr())
	want := []netip.Addr{netip.MustParseAddr("fd00:1122:3344:101::5"), netip.MustParseAddr("fd00:1122:3344:102::5")}
	for _, name := range []string{BoundaryNTPName, BoundaryNTPName + ".", "Boundary-NTP.Control-Plane.oxide.internal"} {
		got, err := r.LookupAAAA(hangDetector(t), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Errorf("%s: sorted, without duplicates (-want +got):\n%s", name, diff)
		}
	}
	got, err := r.LookupBoundaryNTP(hangDetector(t))
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("LookupBoundaryNTP = %v, %v; want %v", got, err, want)
	}

	for _, name := range []string{noAAAA, "missing.host." + Zone} {
		if got, err := r.LookupAAAA(hangDetector(t), name); got != nil || err != nil {
			t.Errorf("%s: LookupAAAA = %v, %v; want nothing, no error", name, got, err)
		}
	}
}

func TestLookupAAAAFailures(t *testing.T) {
	failing := startServer(t, Records{})
	failing.SetFault(FaultServfail)
	r := newResolver(t, time.Second, failing.Addr())
	if got, err := r.LookupAAAA(hangDetector(t), BoundaryNTPName); !errors.Is(err, ErrServerFailure) || got != nil {
		t.Errorf("SERVFAIL: LookupAAAA = %v, %v; want ErrServerFailure", got, err)
	}

	dropping := startServer(t, Records{})
	dropping.SetFault(FaultDrop)
	ctx := hangDetector(t)
	r = newResolver(t, 100*time.Millisecond, closedPort(t), dropping.Addr())
	if got, err := r.LookupAAAA(ctx, BoundaryNTPName); !errors.Is(err, ErrUnreachable) || got != nil {
		t.Errorf("no answer: LookupAAAA = %v, %v; want ErrUnreachable", got, err)
	}
	if ctx.Err() != nil {
		t.Error("the lookup ran until the hang detector: the per-query timeout was not kept")
	}

	long := strings.Repeat("a", 64)
	for _, bad := range []string{"", ".", "a..b", "a b", "a\\.b", "a\x00b", long + ".oxide.internal", strings.Repeat("a.", 127) + "ab"} {
		if _, err := r.LookupAAAA(t.Context(), bad); err == nil {
			t.Errorf("LookupAAAA(%q): no error", bad)
		}
	}
}
