package mappings

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// BoundaryVNI is the VNI of the switches' boundary services, which every
// tunnel endpoint the switches originate carries (OPTE's
// BOUNDARY_SERVICES_VNI).
const BoundaryVNI = 99

// TEP is a tunnel endpoint: a switch's boundary services address and the
// VNI to send to it with.
type TEP struct {
	Addr netip.Addr
	VNI  uint32
}

// Boundary is one v2b entry: a prefix and its endpoints, ordered by address.
type Boundary struct {
	Prefix netip.Prefix
	TEPs   []TEP
}

// v2bSnap is an immutable state of the table: its entries, the longest
// prefix first, for lookups.
type v2bSnap struct {
	byPrefix map[netip.Prefix][]TEP
	ordered  []Boundary
}

// V2B is the sled's virtual-to-boundary table. The zero value is empty and
// ready.
type V2B struct {
	mu    sync.Mutex // writers
	snap  atomic.Pointer[v2bSnap]
	epoch atomic.Uint64
}

func (t *V2B) load() *v2bSnap {
	if s := t.snap.Load(); s != nil {
		return s
	}
	return &v2bSnap{}
}

// Set adds teps to prefix's endpoints (OPTE's set_v2b). As OPTE's set of
// endpoints, which compares them by address alone, an endpoint whose
// address is there already keeps the VNI it has.
func (t *V2B) Set(prefix netip.Prefix, teps ...TEP) error {
	if !prefix.IsValid() {
		return fmt.Errorf("v2b: no prefix")
	}
	for _, e := range teps {
		if !e.Addr.Is6() || e.Addr.Is4In6() || e.VNI > MaxVNI {
			return fmt.Errorf("v2b: tunnel endpoint %s VNI %d: want an IPv6 address and a 24-bit VNI", e.Addr, e.VNI)
		}
	}
	prefix = prefix.Masked()
	t.mu.Lock()
	defer t.mu.Unlock()
	m := maps.Clone(t.load().byPrefix)
	if m == nil {
		m = map[netip.Prefix][]TEP{}
	}
	set := slices.Clone(m[prefix])
	for _, e := range teps {
		if !slices.ContainsFunc(set, func(o TEP) bool { return o.Addr == e.Addr }) {
			set = append(set, e)
		}
	}
	slices.SortFunc(set, func(a, b TEP) int { return a.Addr.Compare(b.Addr) })
	m[prefix] = set
	t.publish(m)
	return nil
}

// Remove takes teps (by address) from prefix's endpoints, and the prefix
// with its last one (OPTE's clear_v2b).
func (t *V2B) Remove(prefix netip.Prefix, teps ...TEP) {
	prefix = prefix.Masked()
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load().byPrefix
	if _, ok := old[prefix]; !ok {
		return
	}
	m := maps.Clone(old)
	set := slices.DeleteFunc(slices.Clone(m[prefix]), func(o TEP) bool {
		return slices.ContainsFunc(teps, func(e TEP) bool { return e.Addr == o.Addr })
	})
	if len(set) == 0 {
		delete(m, prefix)
	} else {
		m[prefix] = set
	}
	t.publish(m)
}

// Replace makes the table exactly want, by the adds and removals that take
// it there (as ddmd adds the tunnel routes it learns and removes those
// withdrawn), and reports whether anything changed.
func (t *V2B) Replace(want map[netip.Prefix][]TEP) (bool, error) {
	norm := map[netip.Prefix][]TEP{}
	for p, teps := range want {
		p = p.Masked()
		for _, e := range teps {
			if !e.Addr.Is6() || e.Addr.Is4In6() || e.VNI > MaxVNI {
				return false, fmt.Errorf("v2b: tunnel endpoint %s VNI %d: want an IPv6 address and a 24-bit VNI", e.Addr, e.VNI)
			}
			if !slices.ContainsFunc(norm[p], func(o TEP) bool { return o.Addr == e.Addr }) {
				norm[p] = append(norm[p], e)
			}
		}
	}
	for p := range norm {
		slices.SortFunc(norm[p], func(a, b TEP) int { return a.Addr.Compare(b.Addr) })
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if maps.EqualFunc(t.load().byPrefix, norm, slices.Equal) {
		return false, nil
	}
	t.publish(norm)
	return true, nil
}

func (t *V2B) publish(m map[netip.Prefix][]TEP) {
	s := &v2bSnap{byPrefix: m}
	for p, teps := range m {
		s.ordered = append(s.ordered, Boundary{Prefix: p, TEPs: teps})
	}
	// Longest prefix first; then by address, for a stable order.
	slices.SortFunc(s.ordered, func(a, b Boundary) int {
		return cmp.Or(cmp.Compare(b.Prefix.Bits(), a.Prefix.Bits()), a.Prefix.Addr().Compare(b.Prefix.Addr()))
	})
	t.snap.Store(s)
	t.epoch.Add(1)
}

// Get is the endpoints of the longest prefix holding ip.
func (t *V2B) Get(ip netip.Addr) ([]TEP, bool) {
	ip = ip.Unmap()
	for _, b := range t.load().ordered {
		if b.Prefix.Contains(ip) {
			return b.TEPs, true
		}
	}
	return nil, false
}

// Pick is the endpoint a flow of hash flowHash to ip goes to: of the
// longest prefix's endpoints, ordered by address, the one at flowHash
// modulo their number (OPTE's EncapAction).
func (t *V2B) Pick(ip netip.Addr, flowHash uint32) (TEP, bool) {
	teps, ok := t.Get(ip)
	if !ok || len(teps) == 0 {
		return TEP{}, false
	}
	return teps[int(flowHash%uint32(len(teps)))], true
}

// Dump lists every entry, the longest prefix first.
func (t *V2B) Dump() []Boundary { return slices.Clone(t.load().ordered) }

// Epoch moves with every change.
func (t *V2B) Epoch() uint64 { return t.epoch.Load() }
