package prefix_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/prefix"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// fakeDDM is an in-memory DDM that records calls and can be made to fail.
type fakeDDM struct {
	mu    sync.Mutex
	set   map[netip.Prefix]bool
	calls []string
	fail  error
}

func newFakeDDM(ps ...string) *fakeDDM {
	d := &fakeDDM{set: map[netip.Prefix]bool{}}
	for _, p := range ps {
		d.set[netip.MustParsePrefix(p)] = true
	}
	return d
}

func (d *fakeDDM) Originated(ctx context.Context) ([]netip.Prefix, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "originated")
	if d.fail != nil {
		return nil, d.fail
	}
	var out []netip.Prefix
	for p := range d.set {
		out = append(out, p)
	}
	return out, nil
}

func (d *fakeDDM) change(op string, ps []netip.Prefix, in bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range ps {
		op += " " + p.String()
	}
	d.calls = append(d.calls, op)
	if d.fail != nil {
		return d.fail
	}
	for _, p := range ps {
		if in {
			d.set[p] = true
		} else {
			delete(d.set, p)
		}
	}
	return nil
}

func (d *fakeDDM) Advertise(ctx context.Context, ps []netip.Prefix) error {
	return d.change("advertise", ps, true)
}

func (d *fakeDDM) Withdraw(ctx context.Context, ps []netip.Prefix) error {
	return d.change("withdraw", ps, false)
}

func (d *fakeDDM) originated() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for p := range d.set {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// changes returns the advertise and withdraw calls, in order.
func (d *fakeDDM) changes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, c := range d.calls {
		if c != "originated" {
			out = append(out, c)
		}
	}
	return out
}

func (d *fakeDDM) setFail(err error) {
	d.mu.Lock()
	d.fail = err
	d.mu.Unlock()
}

// fakeZones is the zone reconciler as the prefix reconciler sees it.
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

func (z *fakeZones) PresentSpecs() []zone.Spec {
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

func dnsZone(i int) sledconfig.Zone { return sledconfigtest.InternalDNS(i) }

const (
	bootstrap = "fdb0:a840:2504:101::/64"
	underlay  = "fd00:1122:3344:101::/64"
)

func start(t *testing.T, d *fakeDDM, z *fakeZones, opts prefix.Options) *prefix.Reconciler {
	t.Helper()
	opts.Bootstrap = netip.MustParsePrefix(bootstrap)
	opts.Underlay = netip.MustParseAddr("fd00:1122:3344:101::1")
	r := prefix.New(d, z, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func TestDesired(t *testing.T) {
	specs := []zone.Spec{}
	for _, z := range []sledconfig.Zone{dnsZone(0), sledconfigtest.Crucible(0), dnsZone(1)} {
		specs = append(specs, zone.SpecFor(&z))
	}
	got := prefix.Desired(netip.MustParsePrefix("fdb0:a840:2504:101::5/64"), netip.MustParseAddr("fd00:1122:3344:101::1"), specs)
	want := []netip.Prefix{
		netip.MustParsePrefix("fd00:1122:3344:1::/64"),
		netip.MustParsePrefix("fd00:1122:3344:2::/64"),
		netip.MustParsePrefix(underlay),
		netip.MustParsePrefix(bootstrap),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Desired = %v, want %v (normalised, sorted; crucibles add nothing)", got, want)
	}
}

func TestWaitsForTheZonesToBeRestored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM("fd00:1122:3344:1::/64") // a live DNS zone's, from before the restart
		z := &fakeZones{restored: make(chan struct{})}
		start(t, d, z, prefix.Options{})
		time.Sleep(time.Hour)
		synctest.Wait()
		if c := d.changes(); len(c) != 0 {
			t.Fatalf("calls before the zones were restored: %v", c)
		}
		z.set(dnsZone(0))
		close(z.restored)
		synctest.Wait()
		want := []string{"fd00:1122:3344:1::/64", underlay, bootstrap}
		slices.Sort(want)
		if got := d.originated(); !slices.Equal(got, want) {
			t.Fatalf("originated %v, want %v", got, want)
		}
		if c := d.changes(); len(c) != 1 || c[0] != "advertise "+underlay+" "+bootstrap {
			t.Fatalf("calls %v: the live zone's prefix must never be withdrawn", c)
		}
	})
}

func TestRemovedZoneIsWithdrawnOnPokeAdvertisingFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM()
		z := &fakeZones{restored: make(chan struct{})}
		z.set(dnsZone(0))
		close(z.restored)
		r := start(t, d, z, prefix.Options{Period: time.Hour})
		synctest.Wait()
		// The DNS zone moves: zone 0 goes, zone 1 comes. With an hour's
		// period, only the poke can bring the change.
		z.set(dnsZone(1))
		r.Poke()
		synctest.Wait()
		c := d.changes()
		if len(c) != 3 || c[1] != "advertise fd00:1122:3344:2::/64" || c[2] != "withdraw fd00:1122:3344:1::/64" {
			t.Fatalf("calls %v: want the new prefix advertised, then the old withdrawn", c)
		}
		st := r.Status()
		last := st.History[len(st.History)-1]
		if last.Action != "withdrew" || last.Prefix != "fd00:1122:3344:1::/64" || last.Why != "no longer wanted" || !st.InSync {
			t.Fatalf("status %+v", st)
		}
	})
}

func TestForeignPrefixIsWithdrawnAndReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM()
		z := &fakeZones{restored: make(chan struct{})}
		close(z.restored)
		r := start(t, d, z, prefix.Options{Period: 30 * time.Second})
		synctest.Wait()
		// Somebody else's, and one of ours with host bits set: DDM keys
		// them apart, and neither is wanted.
		d.change("inject", []netip.Prefix{netip.MustParsePrefix("fd00:dead::/64"), netip.MustParsePrefix("fd00:1122:3344:101::1/64")}, true)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		want := []string{underlay, bootstrap}
		slices.Sort(want)
		if got := d.originated(); !slices.Equal(got, want) {
			t.Fatalf("originated %v, want %v", got, want)
		}
		st := r.Status()
		var foreign []string
		for _, c := range st.History {
			if c.Why == "not this sled's" {
				foreign = append(foreign, c.Prefix)
			}
		}
		if !slices.Equal(foreign, []string{"fd00:1122:3344:101::1/64", "fd00:dead::/64"}) {
			t.Fatalf("reported foreign %v (history %+v)", foreign, st.History)
		}
	})
}

func TestFailuresBackOffAndRecover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM()
		d.setFail(errors.New("connection refused"))
		z := &fakeZones{restored: make(chan struct{})}
		close(z.restored)
		r := start(t, d, z, prefix.Options{Period: 30 * time.Second})
		// Passes at 0, 1, 3, 7 s, then every 5 s (RetryMax caps the
		// backoff): 14 failures in the first minute.
		time.Sleep(time.Minute)
		synctest.Wait()
		st := r.Status()
		if st.LastError == "" || st.Failures != 14 || st.LastSuccess != nil || st.InSync {
			t.Fatalf("status while DDM fails: %+v", st)
		}
		d.setFail(nil)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		st = r.Status()
		if st.LastError != "" || st.LastSuccess == nil || !st.InSync || len(d.originated()) != 2 {
			t.Fatalf("status after DDM came back: %+v, originated %v", st, d.originated())
		}
	})
}

func TestEmptiedDDMIsFilledAgainWithinAPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM()
		z := &fakeZones{restored: make(chan struct{})}
		z.set(dnsZone(0))
		close(z.restored)
		start(t, d, z, prefix.Options{Period: 10 * time.Second})
		synctest.Wait()
		d.change("restart", []netip.Prefix{netip.MustParsePrefix(bootstrap), netip.MustParsePrefix(underlay), netip.MustParsePrefix("fd00:1122:3344:1::/64")}, false)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := d.originated(); len(got) != 3 {
			t.Fatalf("originated after DDM lost everything and a period passed: %v", got)
		}
	})
}

// What this agent advertised is still its own after a restart: a prefix
// the last agent advertised and nobody wants now is withdrawn as "no longer
// wanted", not reported as somebody else's.
func TestOwnPrefixesAreKnownAfterARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "prefixes.json")
		d := newFakeDDM()
		z := &fakeZones{restored: make(chan struct{})}
		z.set(dnsZone(0))
		close(z.restored)
		ctx, cancel := context.WithCancel(context.Background())
		first := prefix.New(d, z, prefix.Options{Underlay: netip.MustParseAddr("fd00:1122:3344:101::1"), Period: time.Hour, StateFile: state})
		done := make(chan struct{})
		go func() { first.Run(ctx); close(done) }()
		synctest.Wait()
		cancel()
		<-done
		if got := d.originated(); !slices.Contains(got, "fd00:1122:3344:1::/64") {
			t.Fatalf("originated %v", got)
		}

		// The next agent: the DNS zone is gone from the config.
		z.set()
		r := start(t, d, z, prefix.Options{Period: time.Hour, StateFile: state})
		synctest.Wait()
		st := r.Status()
		i := slices.IndexFunc(st.History, func(c prefix.Change) bool { return c.Prefix == "fd00:1122:3344:1::/64" })
		if i < 0 || st.History[i].Action != "withdrew" || st.History[i].Why != "no longer wanted" {
			t.Fatalf("history %+v: want the old DNS prefix withdrawn as no longer wanted", st.History)
		}
		// Withdrawn, it is ours no more: if it comes back, it is somebody else's.
		d.change("inject", []netip.Prefix{netip.MustParsePrefix("fd00:1122:3344:1::/64")}, true)
		r.Poke()
		synctest.Wait()
		st = r.Status()
		if last := st.History[len(st.History)-1]; last.Prefix != "fd00:1122:3344:1::/64" || last.Why != "not this sled's" {
			t.Fatalf("history %+v", st.History)
		}
	})
}

// While zones run that no config judges (the ledger lost), a prefix no
// zone wants may be theirs: nothing is withdrawn, and what is kept is
// reported; once they are judged, it goes.
func TestNothingWithdrawnWhileZonesAreUnjudged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM("fd00:1122:3344:1::/64") // a live DNS zone's
		z := &fakeZones{restored: make(chan struct{}), unmanaged: []string{dnsZone(0).Name()}}
		close(z.restored)
		r := start(t, d, z, prefix.Options{Period: 30 * time.Second})
		synctest.Wait()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		for _, c := range d.changes() {
			if strings.HasPrefix(c, "withdraw") {
				t.Fatalf("withdrew while zones are unjudged: %v", d.changes())
			}
		}
		if st := r.Status(); !slices.Equal(st.Kept, []string{"fd00:1122:3344:1::/64"}) || st.InSync {
			t.Fatalf("status %+v: want the prefix kept, not in sync", st)
		}
		z.mu.Lock()
		z.unmanaged = nil
		z.mu.Unlock()
		r.Poke()
		synctest.Wait()
		want := []string{underlay, bootstrap}
		slices.Sort(want)
		if got := d.originated(); !slices.Equal(got, want) {
			t.Fatalf("once judged: originated %v, want %v", got, want)
		}
	})
}

// Zones judged without the present zones changing (nothing pokes the
// reconciler): what was kept for them is looked at again within the capped
// retry delay, not at the next period.
func TestKeptPrefixesAreLookedAtAgainUnpoked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDDM("fd00:1122:3344:1::/64")
		z := &fakeZones{restored: make(chan struct{}), unmanaged: []string{dnsZone(0).Name()}}
		close(z.restored)
		r := start(t, d, z, prefix.Options{Period: time.Hour, RetryInitial: time.Second, RetryMax: 5 * time.Second})
		synctest.Wait()
		if st := r.Status(); len(st.Kept) != 1 {
			t.Fatalf("status %+v: want the prefix kept", st)
		}
		z.mu.Lock()
		z.unmanaged = nil
		z.mu.Unlock()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		want := []string{underlay, bootstrap}
		slices.Sort(want)
		if got := d.originated(); !slices.Equal(got, want) {
			t.Fatalf("judged, unpoked, 5 s later: originated %v, want %v", got, want)
		}
	})
}
