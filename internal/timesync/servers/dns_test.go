package servers

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/dns"
)

// TestThroughTheSimulatedDNSServer follows the boundary NTP name through
// the real resolver and the development DNS server on loopback, as the
// records change.
func TestThroughTheSimulatedDNSServer(t *testing.T) {
	srv := dns.NewServer(nil)
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	res, err := dns.NewResolver([]netip.AddrPort{srv.Addr()}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	setter := &fakeSetter{start: time.Now(), fail: map[string]int{}, hang: map[string]bool{}}
	zones := &fakeZones{}
	zones.set(ntpZone("z1", "1"))
	f, err := New(Options{Resolver: res, Zones: zones.get, Setter: setter, Period: 20 * time.Millisecond, StartPeriod: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	// No deadline on speed: only one that says the follower hung.
	hang := time.Now().Add(20 * time.Second)
	waitFor := func(what string, ok func(Status, []call) bool) []call {
		t.Helper()
		var calls []call
		for {
			calls = append(calls, setter.take()...)
			st := f.Status()
			if ok(st, calls) {
				return calls
			}
			if time.Now().After(hang) {
				t.Fatalf("%s: never happened; status %+v, calls %+v", what, st, calls)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	records := func(addrs ...netip.Addr) {
		t.Helper()
		r := dns.Records{AAAA: map[string][]netip.Addr{}}
		if addrs != nil {
			r.AAAA[dns.BoundaryNTPName] = addrs
		}
		if err := srv.SetRecords(r); err != nil {
			t.Fatal(err)
		}
	}

	waitFor("no such name reported", func(st Status, calls []call) bool {
		return errors.Is(st.Err(), ErrNoServers) && len(calls) == 0
	})

	records(ntpB, ntpA)
	ab := join([]netip.Addr{ntpA, ntpB})
	calls := waitFor("the zone given A and B", func(_ Status, calls []call) bool { return len(calls) > 0 })
	if len(calls) != 1 || calls[0].Zone != "z1" || calls[0].Servers != ab {
		t.Errorf("calls = %+v; want one, z1 given %s", calls, ab)
	}

	records(ntpC)
	calls = waitFor("the zone given C", func(_ Status, calls []call) bool { return len(calls) > 0 })
	if len(calls) != 1 || calls[0].Servers != ntpC.String() {
		t.Errorf("calls = %+v; want one, z1 given %s", calls, ntpC)
	}

	// The name left with no records, then a failing server: the zone
	// keeps C and nothing is sent.
	records()
	calls = waitFor("no records reported", func(st Status, _ []call) bool { return errors.Is(st.Err(), ErrNoServers) })
	srv.SetFault(dns.FaultServfail)
	calls = append(calls, waitFor("SERVFAIL reported", func(st Status, _ []call) bool { return errors.Is(st.Err(), dns.ErrServerFailure) })...)
	if len(calls) != 0 {
		t.Errorf("calls = %+v; want none without servers in DNS", calls)
	}
	st := f.Status()
	if !slices.Equal(st.Servers, []netip.Addr{ntpC}) || len(st.Zones) != 1 || !slices.Equal(st.Zones[0].Servers, []netip.Addr{ntpC}) {
		t.Errorf("status = %+v; want %s kept", st, ntpC)
	}
}
