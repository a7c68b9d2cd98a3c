package nat_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

var (
	underlay = netip.MustParseAddr("fd00:1122:3344:101::1")
	other    = netip.MustParseAddr("fd00:1122:3344:102::1") // another sled
)

// fakeSwitch is an in-memory dpd: entries keyed by external IP and low
// port; overlaps with another target are conflicts. It can hang or fail.
type fakeSwitch struct {
	mu      sync.Mutex
	entries map[string]dpd.NatEntry
	slot    uint16
	hang    bool
	fail    error
	calls   int
	deleted []string // every DeleteNAT asked, as key(ip, low)
}

func newSwitch(slot uint16) *fakeSwitch {
	return &fakeSwitch{entries: map[string]dpd.NatEntry{}, slot: slot}
}

func key(ip netip.Addr, low uint16) string { return fmt.Sprintf("%s/%d", ip, low) }

func (s *fakeSwitch) behave(ctx context.Context) error {
	s.mu.Lock()
	s.calls++
	hang, fail := s.hang, s.fail
	s.mu.Unlock()
	if hang {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", dpd.ErrUnreachable, ctx.Err())
	}
	return fail
}

func (s *fakeSwitch) AllNAT(ctx context.Context) ([]dpd.NatEntry, error) {
	if err := s.behave(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []dpd.NatEntry
	for _, e := range s.entries {
		out = append(out, e)
	}
	return out, nil
}

func (s *fakeSwitch) CreateNAT(ctx context.Context, e dpd.NatEntry) error {
	if err := s.behave(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.entries {
		if o.External == e.External && o.Low <= e.High && e.Low <= o.High {
			if o == e {
				return nil
			}
			return fmt.Errorf("409: %w", dpd.ErrConflict)
		}
	}
	s.entries[key(e.External, e.Low)] = e
	return nil
}

func (s *fakeSwitch) DeleteNAT(ctx context.Context, ip netip.Addr, low uint16) error {
	if err := s.behave(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleted = append(s.deleted, key(ip, low))
	delete(s.entries, key(ip, low))
	return nil
}

func (s *fakeSwitch) SwitchIdentifiers(ctx context.Context) (dpd.SwitchIdentifiers, error) {
	if err := s.behave(ctx); err != nil {
		return dpd.SwitchIdentifiers{}, err
	}
	return dpd.SwitchIdentifiers{Slot: s.slot}, nil
}

func (s *fakeSwitch) set(f func(*fakeSwitch)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

// ours returns this sled's entries on the switch, described and sorted.
func (s *fakeSwitch) ours() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.entries {
		if e.Target.InternalIP == underlay {
			out = append(out, fmt.Sprintf("%s %d-%d %s", e.External, e.Low, e.High, e.Target.InnerMAC))
		}
	}
	slices.Sort(out)
	return out
}

// fakeDNS names switches, or fails.
type fakeDNS struct {
	mu    sync.Mutex
	addrs []netip.AddrPort
	err   error
}

func (d *fakeDNS) LookupSwitches(ctx context.Context) ([]netip.AddrPort, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.addrs), d.err
}

func (d *fakeDNS) set(err error, addrs ...netip.AddrPort) {
	d.mu.Lock()
	d.addrs, d.err = addrs, err
	d.mu.Unlock()
}

type fakeZones struct {
	mu        sync.Mutex
	running   []zone.Spec
	restored  chan struct{}
	unmanaged []string
}

func (z *fakeZones) Unmanaged() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.unmanaged)
}

func (z *fakeZones) RunningSpecs() []zone.Spec {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.running)
}

func (z *fakeZones) Restored() <-chan struct{} { return z.restored }

func (z *fakeZones) set(zones ...sledconfig.Zone) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.running = nil
	for i := range zones {
		z.running = append(z.running, zone.SpecFor(&zones[i]))
	}
}

func restoredZones(zones ...sledconfig.Zone) *fakeZones {
	z := &fakeZones{restored: make(chan struct{})}
	z.set(zones...)
	close(z.restored)
	return z
}

// rack is the switches of a test, by address.
type rack map[netip.AddrPort]*fakeSwitch

func (k rack) newSwitch(addr netip.AddrPort) (nat.Switch, error) {
	s, ok := k[addr]
	if !ok {
		return nil, fmt.Errorf("no switch at %s", addr)
	}
	return s, nil
}

var (
	sw0 = netip.MustParseAddrPort("[fd00:1122:3344:101::2]:12224")
	sw1 = netip.MustParseAddrPort("[fd00:1122:3344:102::2]:12224")
	sw2 = netip.MustParseAddrPort("[fd00:1122:3344:103::2]:12224")
)

func start(t *testing.T, z *fakeZones, k rack, opts nat.Options) *nat.Reconciler {
	t.Helper()
	opts.Underlay = underlay
	opts.NewSwitch = k.newSwitch
	opts.Period = 10 * time.Second
	r := nat.New(z, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

const nexusEntry = "192.0.2.10 0-65535 a8:40:25:ff:80:05"

func TestDesired(t *testing.T) {
	nexus := sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221")
	ntp := sledconfigtest.Nexus(1, "[fd00:1122:3344:101::8]:12221")
	ntp.ZoneType = sledconfig.ZoneType{Type: "boundary_ntp", Address: "[fd00:1122:3344:101::8]:123", NIC: ntp.ZoneType.NIC,
		SNAT: &sledconfig.SNAT{IP: "198.51.100.7", FirstPort: 16384, LastPort: 32767}}
	dns := sledconfigtest.Nexus(2, "[fd00:1122:3344:101::9]:12221")
	dns.ZoneType = sledconfig.ZoneType{Type: "external_dns", DNSAddress: "198.51.100.53:53", HTTPAddress: "[fd00:1122:3344:101::9]:5353", NIC: dns.ZoneType.NIC}
	var specs []zone.Spec
	for _, z := range []sledconfig.Zone{nexus, ntp, dns, sledconfigtest.Crucible(0)} {
		specs = append(specs, zone.SpecFor(&z))
	}
	var got []string
	for _, e := range nat.Desired(specs, underlay) {
		got = append(got, fmt.Sprintf("%s %d-%d %s %s %d", e.External, e.Low, e.High, e.Target.InternalIP, e.Target.InnerMAC, e.Target.VNI))
	}
	want := []string{
		"192.0.2.10 0-65535 fd00:1122:3344:101::1 a8:40:25:ff:80:05 100",
		"198.51.100.7 16384-32767 fd00:1122:3344:101::1 a8:40:25:ff:80:06 100",
		"198.51.100.53 0-65535 fd00:1122:3344:101::1 a8:40:25:ff:80:07 100",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Desired:\n%v\nwant\n%v", got, want)
	}
}

func TestEverySwitchIsProgrammedAndAHangingOneDelaysNoOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := rack{sw0: newSwitch(0), sw1: newSwitch(1)}
		k[sw1].set(func(s *fakeSwitch) { s.hang = true })
		dns := &fakeDNS{}
		dns.set(nil, sw0, sw1)
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Resolver: dns, CallTimeout: 5 * time.Second})
		synctest.Wait()
		// Programmed at once, while the other switch's calls hang.
		if got := k[sw0].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("switch 0 holds %v", got)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		st := r.Status()
		if len(st.Switches) != 2 || st.Switches[0].LastSuccess == nil || *st.Switches[0].Slot != 0 || st.Switches[1].LastError == "" || st.Discovery.Source != "dns" {
			t.Fatalf("status %+v", st)
		}
		// The hanging switch recovers: programmed at the next period.
		k[sw1].set(func(s *fakeSwitch) { s.hang = false })
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := k[sw1].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("switch 1 holds %v after it came back", got)
		}
	})
}

func TestSwitchesFoundLaterOrReplacedAreProgrammedWithinAPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := rack{sw0: newSwitch(0), sw1: newSwitch(1), sw2: newSwitch(1)}
		dns := &fakeDNS{}
		dns.set(nil, sw0)
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Resolver: dns})
		synctest.Wait()
		dns.set(nil, sw0, sw1) // the second switch appears
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := k[sw1].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("the switch that appeared holds %v", got)
		}
		dns.set(nil, sw0, sw2) // switch 1 replaced at a new address, empty
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := k[sw2].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("the replacement switch holds %v", got)
		}
		if st := r.Status(); len(st.Switches) != 2 || st.Switches[1].Address != sw2.String() {
			t.Fatalf("switches %+v", st.Switches)
		}
	})
}

func TestEmptiedSwitchIsReprogrammedAndARemovedZonesEntryGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := rack{sw0: newSwitch(0), sw1: newSwitch(1)}
		dns := &fakeDNS{}
		dns.set(nil, sw0, sw1)
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Resolver: dns})
		synctest.Wait()
		k[sw0].set(func(s *fakeSwitch) { s.entries = map[string]dpd.NatEntry{} }) // dpd restarted empty
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := k[sw0].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("the restarted switch holds %v", got)
		}
		// The zone stops running: its entries go from every switch at once.
		z.set()
		r.Poke()
		synctest.Wait()
		if a, b := k[sw0].ours(), k[sw1].ours(); len(a)+len(b) != 0 {
			t.Fatalf("entries left after the zone stopped: %v, %v", a, b)
		}
	})
}

func TestFallbackSwitchesWhenDNSFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := rack{sw0: newSwitch(0)}
		dns := &fakeDNS{}
		dns.set(errors.New("no DNS server answered"))
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Resolver: dns, Fallback: []netip.AddrPort{sw0}})
		synctest.Wait()
		if got := k[sw0].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("the fallback switch holds %v", got)
		}
		st := r.Status()
		if st.Discovery.Source != "fallback" || st.Discovery.DNSError == "" || st.Switches[0].FoundBy != "fallback" {
			t.Fatalf("status %+v", st)
		}
	})
}

func TestOtherSledsEntriesAreReportedNotOverwritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSwitch(0)
		theirs := dpd.NatEntry{External: netip.MustParseAddr("192.0.2.10"), Low: 0, High: 65535, Target: dpd.NatTarget{InternalIP: other, VNI: 100}}
		stale := dpd.NatEntry{External: netip.MustParseAddr("192.0.2.99"), Low: 0, High: 65535, Target: dpd.NatTarget{InternalIP: underlay, VNI: 100}}
		s.entries[key(theirs.External, 0)] = theirs
		s.entries[key(stale.External, 0)] = stale
		k := rack{sw0: s}
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Fallback: []netip.AddrPort{sw0}})
		synctest.Wait()
		if got := s.entries[key(theirs.External, 0)]; got != theirs {
			t.Fatalf("another sled's entry was changed: %+v", got)
		}
		if _, ok := s.entries[key(stale.External, 0)]; ok {
			t.Fatalf("this sled's stale entry was not deleted")
		}
		st := r.Status().Switches[0]
		if len(st.Conflicts) != 1 || st.Present != 0 || st.Desired != 1 {
			t.Fatalf("switch status %+v", st)
		}
	})
}

func TestNothingBeforeTheZonesAreRestored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSwitch(0)
		mine := dpd.NatEntry{External: netip.MustParseAddr("192.0.2.10"), Low: 0, High: 65535, Target: dpd.NatTarget{InternalIP: underlay, VNI: 100}}
		s.entries[key(mine.External, 0)] = mine
		z := &fakeZones{restored: make(chan struct{})}
		start(t, z, rack{sw0: s}, nat.Options{Fallback: []netip.AddrPort{sw0}})
		time.Sleep(time.Minute)
		synctest.Wait()
		if s.calls != 0 {
			t.Fatalf("%d calls to the switch before the zones were restored", s.calls)
		}
	})
}

// While zones run that no config judges (the ledger lost), an entry of this
// sled no zone wants may be theirs: none is deleted, and what is kept is
// reported; once they are judged, it goes.
func TestNothingDeletedWhileZonesAreUnjudged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := rack{sw0: newSwitch(0)}
		dns := &fakeDNS{}
		dns.set(nil, sw0)
		z := restoredZones(sledconfigtest.Nexus(0, "[fd00:1122:3344:101::7]:12221"))
		r := start(t, z, k, nat.Options{Resolver: dns})
		synctest.Wait()
		if got := k[sw0].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("the switch holds %v", got)
		}
		// The agent restarts with no readable config: the zone runs,
		// unmanaged, and no zone is known to want the entry.
		z.mu.Lock()
		z.running, z.unmanaged = nil, []string{"oxz_nexus_x"}
		z.mu.Unlock()
		r.Poke()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got := k[sw0].ours(); !slices.Equal(got, []string{nexusEntry}) {
			t.Fatalf("with zones unjudged the switch holds %v, want the entry kept", got)
		}
		if st := r.Status(); len(st.Switches) != 1 || len(st.Switches[0].Kept) != 1 {
			t.Fatalf("status %+v: want the entry reported kept", st)
		}
		z.mu.Lock()
		z.unmanaged = nil
		z.mu.Unlock()
		r.Poke()
		synctest.Wait()
		if got := k[sw0].ours(); len(got) != 0 {
			t.Fatalf("once judged, the switch holds %v", got)
		}
	})
}
