package nat_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// Entries Nexus writes for this sled's instances: their external IPs (one
// whole, one an SNAT port range) target this sled's underlay address too,
// in the instance's VPC.
var (
	instanceMAC = dpd.MacAddr{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
	instance    = []dpd.NatEntry{
		{External: netip.MustParseAddr("203.0.113.5"), Low: 0, High: 65535, Target: dpd.NatTarget{InternalIP: underlay, InnerMAC: instanceMAC, VNI: 7777}},
		{External: netip.MustParseAddr("203.0.113.6"), Low: 16384, High: 32767, Target: dpd.NatTarget{InternalIP: underlay, InnerMAC: instanceMAC, VNI: 7777}},
	}
	// staleService is a service entry of this sled no zone wants: it goes.
	staleService = dpd.NatEntry{External: netip.MustParseAddr("192.0.2.99"), Low: 0, High: 65535, Target: dpd.NatTarget{InternalIP: underlay, InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x99}, VNI: nat.ServicesVNI}}
)

// all describes every entry of a table, sorted.
func all(entries []dpd.NatEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s %d-%d %s vni %d", e.External, e.Low, e.High, e.Target.InnerMAC, e.Target.VNI))
	}
	slices.Sort(out)
	return out
}

// held is every entry of the fake switch.
func (s *fakeSwitch) held() []dpd.NatEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []dpd.NatEntry
	for _, e := range s.entries {
		out = append(out, e)
	}
	return out
}

func withInstances(es ...dpd.NatEntry) []string {
	return all(append(slices.Clone(instance), es...))
}

var nexusTableEntry = "192.0.2.10 0-65535 a8:40:25:ff:80:05 vni 100"

// Entries outside the services VPC are not this reconciler's though they
// target this sled: no path that deletes touches them (a pass, a zone
// removed, a lost ledger and the pass once its zones are judged), and none
// is shown kept.
func TestInstanceEntriesAreNeverDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSwitch(0)
		for _, e := range append(slices.Clone(instance), staleService) {
			s.entries[key(e.External, e.Low)] = e
		}
		dns := &fakeDNS{}
		dns.set(nil, sw0)
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, rack{sw0: s}, nat.Options{Resolver: dns})
		synctest.Wait()
		check := func(when string, want []string) {
			t.Helper()
			if got := all(s.held()); !slices.Equal(got, want) {
				t.Fatalf("%s the switch holds\n%v\nwant\n%v", when, got, want)
			}
			s.mu.Lock()
			deleted := slices.Clone(s.deleted)
			s.mu.Unlock()
			for _, e := range instance {
				if slices.Contains(deleted, key(e.External, e.Low)) {
					t.Fatalf("%s an instance's entry was deleted: %v", when, deleted)
				}
			}
		}
		check("after the first pass", withInstances(dpd.NatEntry{External: netip.MustParseAddr("192.0.2.10"), Low: 0, High: 65535,
			Target: dpd.NatTarget{InternalIP: underlay, InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x05}, VNI: 100}}))
		if st := r.Status().Switches[0]; st.Present != 1 || st.Desired != 1 {
			t.Fatalf("switch status %+v: want only the service entry counted", st)
		}
		time.Sleep(10 * time.Second) // a periodic pass
		synctest.Wait()
		check("after a periodic pass", withInstances(dpd.NatEntry{External: netip.MustParseAddr("192.0.2.10"), Low: 0, High: 65535,
			Target: dpd.NatTarget{InternalIP: underlay, InnerMAC: dpd.MacAddr{0xa8, 0x40, 0x25, 0xff, 0x80, 0x05}, VNI: 100}}))

		// The zone is removed: its entry goes, the instances' stay.
		z.set()
		r.Poke()
		synctest.Wait()
		check("after the zone was removed", withInstances())

		// The ledger is lost with a zone running: the service entry it
		// may want is kept, and only it is shown kept.
		s.set(func(s *fakeSwitch) { s.entries[key(staleService.External, 0)] = staleService })
		z.mu.Lock()
		z.unmanaged = []string{"oxz_nexus_x"}
		z.mu.Unlock()
		r.Poke()
		synctest.Wait()
		check("with the zones unjudged", withInstances(staleService))
		if st := r.Status().Switches[0]; !slices.Equal(st.Kept, []string{"192.0.2.99 0-65535 → fd00:1122:3344:101::1 a8:40:25:ff:80:99 vni 100"}) {
			t.Fatalf("kept %v: want the service entry only", st.Kept)
		}
		// Judged again: the service entry goes, the instances' stay.
		z.mu.Lock()
		z.unmanaged = nil
		z.mu.Unlock()
		r.Poke()
		synctest.Wait()
		check("once the zones were judged", withInstances())
	})
}

// A zone whose NIC is outside the services VPC gets no entry: this
// reconciler could never delete it again. It is reported instead.
func TestZoneOutsideTheServicesVPCGetsNoEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSwitch(0)
		odd := sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221")
		odd.ZoneType.NIC.VNI = 7777
		z := restoredZones(odd, sledconfigtest.Crucible(1))
		r := start(t, z, rack{sw0: s}, nat.Options{Fallback: []netip.AddrPort{sw0}})
		synctest.Wait()
		if got := all(s.held()); len(got) != 0 {
			t.Fatalf("the switch holds %v, want nothing", got)
		}
		st := r.Status()
		if want := []string{"oxz_nexus_" + odd.ID + ": vni 7777"}; len(st.Desired) != 0 || !slices.Equal(st.Ignored, want) {
			t.Fatalf("status desired %v ignored %v, want none desired and %v ignored", st.Desired, st.Ignored, want)
		}
	})
}

// The same on dpd's simulator, through the dpd client: after every path
// that deletes, its table still holds the instances' entries.
func TestInstanceEntriesSurviveOnTheSimulator(t *testing.T) {
	d := dpdsim.New(nil, 0)
	if err := d.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	for _, e := range append(slices.Clone(instance), staleService) {
		d.Inject(e)
	}
	addr := netip.MustParseAddrPort(d.Addr())
	z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
	r := nat.New(z, nat.Options{Underlay: underlay, Fallback: []netip.AddrPort{addr}, Period: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// pass waits for a pass to start and end after it is called, and
	// checks the table then.
	pass := func(when string, want []string) {
		t.Helper()
		before := passes(r)
		// Two passes: the one in flight, if any, may have begun before.
		r.Poke()
		waitPasses(t, r, before+1)
		r.Poke()
		waitPasses(t, r, before+2)
		if st := r.Status().Switches[0]; st.LastError != "" {
			t.Fatalf("%s: the pass failed: %s", when, st.LastError)
		}
		if got := all(d.Entries()); !slices.Equal(got, want) {
			t.Fatalf("%s the simulator holds\n%v\nwant\n%v", when, got, want)
		}
	}
	waitPasses(t, r, 1)
	pass("after a pass", slices.Sorted(slices.Values(append(withInstances(), nexusTableEntry))))
	z.set()
	pass("after the zone was removed", withInstances())
	d.Inject(staleService)
	z.mu.Lock()
	z.unmanaged = []string{"oxz_nexus_x"}
	z.mu.Unlock()
	pass("with the zones unjudged", withInstances(staleService))
	z.mu.Lock()
	z.unmanaged = nil
	z.mu.Unlock()
	pass("once the zones were judged", withInstances())
}

func passes(r *nat.Reconciler) uint64 {
	st := r.Status()
	if len(st.Switches) == 0 {
		return 0
	}
	return st.Switches[0].Passes
}

// waitPasses waits until the first switch has seen n passes; a hang fails
// the test after a minute rather than timing anything.
func waitPasses(t *testing.T, r *nat.Reconciler, n uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for passes(r) < n {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for pass %d after a minute; status %+v", n, r.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
