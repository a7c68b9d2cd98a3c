package rules

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/uuid"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

// TestPriority is the table in opte lib/oxide-vpc/src/engine/router.rs:206-232.
func TestPriority(t *testing.T) {
	cases := []struct {
		dest  string
		class Class
		want  uint16
	}{
		{"10.0.0.1/32", Custom, 10},
		{"10.0.0.1/32", System, 11},
		{"10.0.0.0/31", Custom, 12},
		{"10.0.0.0/30", Custom, 14},
		{"0.0.0.0/0", Custom, 74},
		{"0.0.0.0/0", System, 75},
		{"fd00::1/128", Custom, 10},
		{"fd00::1/128", System, 11},
		{"fd00::/127", Custom, 12},
		{"fd00::/126", Custom, 14},
		{"::/0", Custom, 266},
		{"::/0", System, 267},
	}
	for _, c := range cases {
		if got := Priority(pfx(c.dest), c.class); got != c.want {
			t.Errorf("Priority(%s, %s) = %d, want %d", c.dest, c.class, got, c.want)
		}
	}
}

func out(dst string) Flow {
	return Flow{Dir: Out, Proto: ProtoUDP, Src: ipA, Dst: addr(dst), SrcPort: 40000, DstPort: 53}
}

func table(t *testing.T, system, custom []Route) *Table {
	t.Helper()
	tb, err := NewTable().Apply(System, nil, system)
	if err != nil {
		t.Fatal(err)
	}
	if tb, err = tb.Apply(Custom, nil, custom); err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestRouterLookup(t *testing.T) {
	igw := uuid.MustParse("1a5e0c5e-0000-4000-8000-0000000000a1")
	s2 := []Route{
		{Dest: pfx("172.30.0.0/22"), Target: SubnetTarget(pfx("172.30.0.0/22"))},
		{Dest: pfx("0.0.0.0/0"), Target: InstanceIGW(igw)},
		{Dest: pfx("::/0"), Target: InstanceIGW(igw)},
	}
	cases := []struct {
		name           string
		system, custom []Route
		flow           Flow
		want           RouteResult
	}{
		// Outbound default Deny, inbound Allow (router.rs:248-258).
		{"empty table denies outbound", nil, nil, out("172.30.0.6"), RouteResult{Action: Deny, Entry: -1}},
		{"inbound is allowed", nil, nil, Flow{Dir: In, Proto: ProtoUDP, Src: addr("8.8.8.8"), Dst: ipA}, RouteResult{Action: Allow, Entry: -1}},
		// Multicast bypasses the table (router.rs:261-270).
		{"v4 multicast bypasses", nil, nil, out("224.0.0.251"), RouteResult{Action: Allow, Multicast: true, Entry: -1}},
		{"v6 multicast bypasses", nil, nil, out("ff02::1"), RouteResult{Action: Allow, Multicast: true, Entry: -1}},
		// Longest prefix first: the subnet before the default (router.rs:233).
		{"subnet route", s2, nil, out("172.30.0.6"), RouteResult{Action: Allow, Entry: 0, Target: SubnetTarget(pfx("172.30.0.0/22"))}},
		{"default route to the igw", s2, nil, out("198.51.100.1"), RouteResult{Action: Allow, Entry: 1, Target: InstanceIGW(igw)}},
		{"v6 default route", s2, nil, out("2001:db8::1"), RouteResult{Action: Allow, Entry: 2, Target: InstanceIGW(igw)}},
		{"no v6 route", s2[:2], nil, out("2001:db8::1"), RouteResult{Action: Deny, Entry: -1}},
		// A longer system prefix beats a shorter custom one.
		{"longer system beats shorter custom", []Route{{Dest: pfx("10.1.0.0/16"), Target: SystemIGW()}},
			[]Route{{Dest: pfx("10.0.0.0/8"), Target: DropTarget()}}, out("10.1.2.3"), RouteResult{Action: Allow, Entry: 0, Target: SystemIGW()}},
		// Custom beats system at the same length (the is_system bit).
		{"custom beats system at a tie", []Route{{Dest: pfx("10.0.0.0/8"), Target: SystemIGW()}},
			[]Route{{Dest: pfx("10.0.0.0/8"), Target: IPTarget(addr("172.30.0.9"))}}, out("10.1.2.3"), RouteResult{Action: Allow, Entry: 0, Target: IPTarget(addr("172.30.0.9"))}},
		// drop → Deny (router.rs:321-333).
		{"drop denies", s2, []Route{{Dest: pfx("198.51.100.0/24"), Target: DropTarget()}}, out("198.51.100.1"), RouteResult{Action: Deny, Entry: 0, Target: DropTarget()}},
		// ip(x): the target is x, for the overlay to resolve (router.rs:351-365).
		{"ip target", s2, []Route{{Dest: pfx("10.0.0.0/8"), Target: IPTarget(addr("172.30.0.9"))}}, out("10.9.9.9"), RouteResult{Action: Allow, Entry: 1, Target: IPTarget(addr("172.30.0.9"))}},
		// Host bits of a destination are cleared, as OPTE's Ipv4Cidr::new does.
		{"destination with host bits", []Route{{Dest: pfx("172.30.0.5/22"), Target: SubnetTarget(pfx("172.30.0.5/22"))}}, nil, out("172.30.3.1"),
			RouteResult{Action: Allow, Entry: 0, Target: SubnetTarget(pfx("172.30.0.0/22"))}},
		// A drop beats another target at the same destination and class:
		// it is a Deny rule, and Deny sorts first (layer.rs:1683-1691).
		{"drop first at equal priority", nil, []Route{{Dest: pfx("10.0.0.0/8"), Target: SystemIGW()}, {Dest: pfx("10.0.0.0/8"), Target: DropTarget()}}, out("10.0.0.1"),
			RouteResult{Action: Deny, Entry: 0, Target: DropTarget()}},
		// Otherwise the entry added last comes first.
		{"last added first at equal priority", nil, []Route{{Dest: pfx("10.0.0.0/8"), Target: SystemIGW()}, {Dest: pfx("10.0.0.0/8"), Target: IPTarget(addr("172.30.0.9"))}}, out("10.0.0.1"),
			RouteResult{Action: Allow, Entry: 0, Target: IPTarget(addr("172.30.0.9"))}},
		// An internet gateway serves either family (router.rs:280-281).
		{"igw for v6", nil, []Route{{Dest: pfx("fd00::/16"), Target: SystemIGW()}}, out("fd00::1"), RouteResult{Action: Allow, Entry: 0, Target: SystemIGW()}},
		{"v4-mapped v6 is v6", s2[:2], nil, out("::ffff:198.51.100.1"), RouteResult{Action: Deny, Entry: -1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := table(t, c.system, c.custom)
			got := tb.Lookup(&c.flow)
			if got != c.want {
				t.Errorf("%s: got %+v, want %+v", c.flow, got, c.want)
			}
			if got.Entry >= 0 && tb.Entries()[got.Entry].Target != got.Target {
				t.Errorf("entry %v does not carry the target %v", tb.Entries()[got.Entry], got.Target)
			}
			if got != linearLookup(tb, &c.flow) {
				t.Errorf("index %+v, scan %+v", got, linearLookup(tb, &c.flow))
			}
			// The same with the table too large to scan, through the index.
			var pad []Route
			for i := range scanMax + 1 {
				pad = append(pad, Route{Dest: netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), 32), Target: DropTarget()})
			}
			big := table(t, c.system, append(slices.Clone(c.custom), pad...))
			bg := big.Lookup(&c.flow)
			if bg.Action != got.Action || bg.Target != got.Target || bg.Multicast != got.Multicast || (bg.Entry < 0) != (got.Entry < 0) ||
				(bg.Entry >= 0 && big.Entries()[bg.Entry].Dest != tb.Entries()[got.Entry].Dest) {
				t.Errorf("through the index: %+v, want %+v", bg, got)
			}
		})
	}
}

// linearLookup is the first entry in order whose destination holds the
// flow's, the reference for the index.
func linearLookup(t *Table, f *Flow) RouteResult {
	if f.Dir == In {
		return RouteResult{Action: Allow, Entry: -1}
	}
	if f.Dst.IsMulticast() {
		return RouteResult{Action: Allow, Multicast: true, Entry: -1}
	}
	for i, e := range t.Entries() {
		if e.Dest.Contains(f.Dst) {
			a := Allow
			if e.Target.Kind == TargetDrop {
				a = Deny
			}
			return RouteResult{Action: a, Entry: i, Target: e.Target}
		}
	}
	return RouteResult{Action: Deny, Entry: -1}
}

// TestRouteRefused: OPTE's make_rule refuses multicast destinations and
// ip/vpc_subnet targets of the other family (router.rs:275-319); the rest
// of the delta is applied.
func TestRouteRefused(t *testing.T) {
	bad := []Route{
		{Dest: pfx("224.0.0.0/4"), Target: DropTarget()},
		{Dest: pfx("ff00::/8"), Target: SystemIGW()},
		{Dest: pfx("10.0.0.0/8"), Target: IPTarget(addr("fd00::1"))},
		{Dest: pfx("fd00::/64"), Target: IPTarget(addr("10.0.0.1"))},
		{Dest: pfx("10.0.0.0/8"), Target: SubnetTarget(pfx("fd00::/64"))},
		{Dest: pfx("fd00::/64"), Target: SubnetTarget(pfx("10.0.0.0/8"))},
	}
	good := Route{Dest: pfx("0.0.0.0/0"), Target: SystemIGW()}
	tb, err := NewTable().Apply(Custom, nil, append(bad, good))
	for _, r := range bad {
		var re *RouteError
		found := false
		for _, e := range unwrapAll(err) {
			if errors.As(e, &re) && re.Route == r {
				found = true
			}
		}
		if !found {
			t.Errorf("route %s was not refused (%v)", r, err)
		}
	}
	if len(tb.Entries()) != 1 || tb.Entries()[0].Target != SystemIGW() {
		t.Errorf("entries %v, want the valid route alone", tb.Entries())
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// TestTableIsAList: a route added twice is there twice and a deletion
// removes one (OPTE's add_rule does not deduplicate; del_entry removes
// the first rule equal to the one it builds, router.rs:395-425).
// Deletion is per class, and Apply leaves the old table as it was.
func TestTableIsAList(t *testing.T) {
	igw := Route{Dest: pfx("0.0.0.0/0"), Target: SystemIGW()}
	t1, _ := NewTable().Apply(Custom, nil, []Route{igw})
	t2, _ := t1.Apply(Custom, nil, []Route{igw})
	t3, _ := t2.Apply(System, nil, []Route{igw})
	if n := len(t3.Entries()); n != 3 {
		t.Fatalf("%d entries, want 3: %v", n, t3.Entries())
	}
	t4, _ := t3.Apply(System, []Route{igw}, nil)
	if n := len(t4.Entries()); n != 2 || t4.Entries()[0].Class != Custom || t4.Entries()[1].Class != Custom {
		t.Errorf("after deleting the system entry: %v", t4.Entries())
	}
	t5, _ := t4.Apply(Custom, []Route{igw, {Dest: pfx("10.0.0.0/8"), Target: DropTarget()}}, nil)
	if n := len(t5.Entries()); n != 1 {
		t.Errorf("after deleting one custom entry and an absent one: %v", t5.Entries())
	}
	if f := out("8.8.8.8"); t5.Lookup(&f).Action != Allow {
		t.Error("the remaining entry does not route")
	}
	if len(t1.Entries()) != 1 || len(t3.Entries()) != 3 {
		t.Error("Apply changed an older table")
	}
	// A deletion names the destination as sent; host bits do not matter.
	t6, _ := t5.Apply(Custom, []Route{{Dest: pfx("0.0.0.9/0"), Target: SystemIGW()}}, nil)
	if len(t6.Entries()) != 0 {
		t.Errorf("entries left: %v", t6.Entries())
	}
}
