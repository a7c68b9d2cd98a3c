package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Class is a router entry's class. Custom entries beat system entries of
// the same prefix length.
type Class uint8

const (
	Custom Class = iota
	System
)

func (c Class) String() string {
	if c == System {
		return "system"
	}
	return "custom"
}

// Priority is OPTE's priority of a router entry:
// ((max prefix length − prefix length) << 1 | is_system) + 10, so longer
// prefixes come first and custom before system at equal length
// (opte lib/oxide-vpc/src/engine/router.rs:233-241).
func Priority(dest netip.Prefix, class Class) uint16 {
	return uint16(dest.Addr().BitLen()-dest.Bits())<<1 | uint16(class) + 10
}

// Entry is one entry of a port's router table.
type Entry struct {
	// Dest is the route's destination with its host bits cleared, as OPTE
	// stores it.
	Dest     netip.Prefix
	Target   Target
	Class    Class
	Priority uint16
	seq      uint64
}

func (e Entry) String() string {
	return fmt.Sprintf("%s %s priority %d -> %s", e.Class, e.Dest, e.Priority, e.Target)
}

// RouteError says why a route cannot be an entry of a router table.
type RouteError struct {
	Route  Route
	Reason string
}

func (e *RouteError) Error() string { return fmt.Sprintf("route %s: %s", e.Route, e.Reason) }

// entryOf checks a route as OPTE's make_rule does and returns its entry:
// no multicast destination, and an ip or vpc_subnet target of the
// destination's family (opte lib/oxide-vpc/src/engine/router.rs:275-319).
func entryOf(class Class, r Route) (Entry, error) {
	if !r.Dest.IsValid() {
		return Entry{}, &RouteError{Route: r, Reason: "no destination"}
	}
	dest := r.Dest.Masked()
	if dest.Addr().IsMulticast() {
		return Entry{}, &RouteError{Route: r, Reason: "multicast destinations are not routed"}
	}
	t := r.Target
	switch t.Kind {
	case TargetDrop, TargetInternetGateway:
	case TargetIP:
		if !t.IP.IsValid() || t.IP.Is4() != dest.Addr().Is4() {
			return Entry{}, &RouteError{Route: r, Reason: "target address and destination are of different IP families"}
		}
	case TargetVPCSubnet:
		if !t.Subnet.IsValid() || t.Subnet.Addr().Is4() != dest.Addr().Is4() {
			return Entry{}, &RouteError{Route: r, Reason: "target subnet and destination are of different IP families"}
		}
		t.Subnet = t.Subnet.Masked()
	default:
		return Entry{}, &RouteError{Route: r, Reason: "unknown target"}
	}
	return Entry{Dest: dest, Target: t, Class: class, Priority: Priority(dest, class)}, nil
}

// Table is a port's router table. It is immutable: Apply returns a new
// table, which the engine swaps in.
type Table struct {
	entries []Entry // in match order
	v4, v6  lpm
	nextSeq uint64
}

// NewTable returns an empty table: every outbound packet but multicast is
// denied.
func NewTable() *Table { return build(nil, 0) }

// Entries returns the table's entries in match order. The slice is shared:
// do not modify it.
func (t *Table) Entries() []Entry { return t.entries }

// Apply returns the table with the routes of del removed and those of add
// added, in class, as the port manager applies a delta: deletions first
// (omicron illumos-utils/src/opte/port_manager.rs:658-692). Like OPTE's
// rule table it is a list, not a set: an added route already present is
// there twice, and a deletion removes one. A route that cannot be an entry
// is left out and reported in the error (every *RouteError joined); the
// rest is applied.
func (t *Table) Apply(class Class, del, add []Route) (*Table, error) {
	entries := slices.Clone(t.entries)
	var errs []error
	for _, r := range del {
		e, err := entryOf(class, r)
		if err != nil {
			continue // such an entry cannot be in the table
		}
		if i := slices.IndexFunc(entries, func(x Entry) bool {
			return x.Class == e.Class && x.Dest == e.Dest && x.Target == e.Target
		}); i >= 0 {
			entries = slices.Delete(entries, i, i+1)
		}
	}
	seq := t.nextSeq
	for _, r := range add {
		e, err := entryOf(class, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.seq = seq
		seq++
		entries = append(entries, e)
	}
	return build(entries, seq), errors.Join(errs...)
}

// build orders entries as OPTE's rule table does: priority, then a drop
// (a Deny rule) before other targets, then the entry added last first
// (opte lib/opte/src/engine/layer.rs:1677-1693), and indexes them.
func build(entries []Entry, nextSeq uint64) *Table {
	slices.SortFunc(entries, func(a, b Entry) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		if ad, bd := a.Target.Kind == TargetDrop, b.Target.Kind == TargetDrop; ad != bd {
			if ad {
				return -1
			}
			return 1
		}
		switch {
		case a.seq > b.seq:
			return -1
		case a.seq < b.seq:
			return 1
		}
		return 0
	})
	// Entries of one destination have one priority class apart at most
	// and the longer destinations come first, so the first entry of the
	// longest matching destination is the first match in order.
	first4, first6 := map[netip.Prefix]int32{}, map[netip.Prefix]int32{}
	for i, e := range entries {
		first := first6
		if e.Dest.Addr().Is4() {
			first = first4
		}
		if _, ok := first[e.Dest]; !ok {
			first[e.Dest] = int32(i)
		}
	}
	return &Table{entries: entries, nextSeq: nextSeq, v4: buildLPM(first4), v6: buildLPM(first6)}
}

// scanMax is the size up to which a scan of the entries in order beats
// the index (a port's table usually holds a handful of routes).
const scanMax = 8

// RouteResult is the router layer's decision on a flow.
type RouteResult struct {
	Action Action
	// Multicast says the destination is multicast, which bypasses the
	// table (opte lib/oxide-vpc/src/engine/router.rs:261-270).
	Multicast bool
	// Entry is the index of the matched entry in Entries(), or -1.
	Entry int
	// Target is the matched entry's target: what the overlay or NAT acts
	// on (the flow's router-target tag). Zero without an entry.
	Target Target
}

// Lookup decides a flow. Inbound packets are allowed (the router assumes
// a packet that arrived had a route); outbound, multicast passes, the
// first entry of the longest matching prefix decides (a drop target
// denies), and with no entry the packet is denied
// (opte lib/oxide-vpc/src/engine/router.rs:248-258).
func (t *Table) Lookup(f *Flow) RouteResult {
	if f.Dir == In {
		return RouteResult{Action: Allow, Entry: -1}
	}
	dst := f.Dst
	if dst.IsMulticast() {
		return RouteResult{Action: Allow, Multicast: true, Entry: -1}
	}
	if !dst.IsValid() {
		return RouteResult{Action: Deny, Entry: -1}
	}
	i := int32(-1)
	if len(t.entries) <= scanMax {
		for j := range t.entries {
			if t.entries[j].Dest.Contains(dst) {
				i = int32(j)
				break
			}
		}
	} else if dst.Is4() {
		i = t.v4.lookup(dst)
	} else {
		i = t.v6.lookup(dst)
	}
	if i < 0 {
		return RouteResult{Action: Deny, Entry: -1}
	}
	e := &t.entries[i]
	a := Allow
	if e.Target.Kind == TargetDrop {
		a = Deny
	}
	return RouteResult{Action: a, Entry: int(i), Target: e.Target}
}
