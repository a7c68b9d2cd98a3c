package rules

import (
	"net/netip"
	"slices"
)

// The index finds the first matching rule without scanning every rule. A
// rule can only match flows of its protocol, so rules are split into one
// bucket per protocol (a rule with no protocol is in every bucket). Within
// a bucket a rule is found through its host: an ip host under its network
// (looked up by masking the flow's remote address to each prefix length
// present), a vpc host under its VNI, no host in the rest. Each of those
// lists, for TCP and UDP, is split again by destination port into segments
// of the port space. A lookup scans the few candidate lists, each in rule
// order, and keeps the earliest rule that matches in full: every candidate
// is checked with the same predicate as the linear scan, so the index can
// only narrow the search, never change its answer.

// protoSlots: tcp, udp, icmp, icmp6, every other protocol.
const protoSlots = 5

func protoSlot(p Proto) int {
	switch p {
	case ProtoTCP:
		return 0
	case ProtoUDP:
		return 1
	case ProtoICMP:
		return 2
	case ProtoICMPv6:
		return 3
	}
	return 4
}

// maxSegs bounds how many port segments one rule is listed under; a rule
// wider than that is listed once, as if it had no port filter (it is still
// checked in full), which keeps the index linear in the rules.
const maxSegs = 64

type index struct {
	rules   []Rule
	buckets [protoSlots]bucket
}

type bucket struct {
	rest   *cands
	vni    map[uint32]*cands
	nets   map[netip.Prefix]*cands
	lens4  []int // prefix lengths present in nets, longest first
	lens6  []int
	byPort bool
}

// cands is a list of candidate rules in rule order; for TCP and UDP it is
// split by destination port.
type cands struct {
	any    []int32   // rules without a port filter, or too wide to split
	starts []uint16  // segment i is [starts[i], starts[i+1]-1]
	segs   [][]int32 // rules whose ports cover segment i
	ported [][]PortRange
	ids    []int32
}

func buildIndex(rules []Rule) index {
	ix := index{rules: rules}
	for s := range ix.buckets {
		b := &ix.buckets[s]
		b.byPort = s <= 1
		b.rest = &cands{}
	}
	for i := range rules {
		r := &rules[i]
		for s := range ix.buckets {
			if r.Proto != nil && protoSlot(r.Proto.Proto) != s {
				continue
			}
			ix.buckets[s].add(int32(i), r)
		}
	}
	for s := range ix.buckets {
		ix.buckets[s].finish()
	}
	return ix
}

func (b *bucket) add(i int32, r *Rule) {
	var c *cands
	switch {
	case r.Host == nil:
		c = b.rest
	case r.Host.Kind == HostVPC:
		if b.vni == nil {
			b.vni = map[uint32]*cands{}
		}
		if c = b.vni[r.Host.VNI]; c == nil {
			c = &cands{}
			b.vni[r.Host.VNI] = c
		}
	default:
		p := r.Host.Net.Masked()
		if b.nets == nil {
			b.nets = map[netip.Prefix]*cands{}
		}
		if c = b.nets[p]; c == nil {
			c = &cands{}
			b.nets[p] = c
			if p.Addr().Is4() {
				b.lens4 = append(b.lens4, p.Bits())
			} else {
				b.lens6 = append(b.lens6, p.Bits())
			}
		}
	}
	if b.byPort && r.HasPorts {
		c.ids = append(c.ids, i)
		c.ported = append(c.ported, r.Ports)
		return
	}
	c.any = append(c.any, i)
}

func (b *bucket) finish() {
	desc := func(l []int) []int {
		slices.Sort(l)
		l = slices.Compact(l)
		slices.Reverse(l)
		return l
	}
	b.lens4, b.lens6 = desc(b.lens4), desc(b.lens6)
	b.rest.split()
	for _, c := range b.vni {
		c.split()
	}
	for _, c := range b.nets {
		c.split()
	}
}

// split turns the ported rules into port segments. Rules were added in
// rule order, so every list stays sorted.
func (c *cands) split() {
	if len(c.ids) == 0 {
		return
	}
	starts := []uint16{0}
	for _, rs := range c.ported {
		for _, r := range rs {
			starts = append(starts, r.First)
			if r.Last < 0xffff {
				starts = append(starts, r.Last+1)
			}
		}
	}
	slices.Sort(starts)
	c.starts = slices.Compact(starts)
	c.segs = make([][]int32, len(c.starts))
	var wide []int32
	for k, id := range c.ids {
		var hit []int
		for _, r := range c.ported[k] {
			lo, _ := slices.BinarySearch(c.starts, r.First)
			for s := lo; s < len(c.starts) && c.starts[s] <= r.Last; s++ {
				hit = append(hit, s)
			}
		}
		if len(hit) > maxSegs {
			wide = append(wide, id)
			continue
		}
		for _, s := range hit {
			c.segs[s] = append(c.segs[s], id)
		}
	}
	if len(wide) > 0 {
		c.any = append(c.any, wide...)
		slices.Sort(c.any)
	}
	c.ids, c.ported = nil, nil
}

// first returns the earliest rule of c before best that matches f, or best.
func (c *cands) first(rules []Rule, f *Flow, best int32) int32 {
	for _, i := range c.any {
		if i >= best {
			break
		}
		if rules[i].matches(f) {
			best = i
			break
		}
	}
	if len(c.starts) == 0 {
		return best
	}
	s, found := slices.BinarySearch(c.starts, f.DstPort)
	if !found {
		s--
	}
	for _, i := range c.segs[s] {
		if i >= best {
			break
		}
		if rules[i].matches(f) {
			return i
		}
	}
	return best
}

// match returns the index of the first rule matching f, or -1.
func (ix *index) match(f *Flow) int {
	b := &ix.buckets[protoSlot(f.Proto)]
	best := int32(len(ix.rules))
	best = b.rest.first(ix.rules, f, best)
	if f.VNI.Present && b.vni != nil {
		if c := b.vni[f.VNI.VNI]; c != nil {
			best = c.first(ix.rules, f, best)
		}
	}
	if b.nets != nil {
		remote := f.Remote()
		lens := b.lens6
		if remote.Is4() {
			lens = b.lens4
		}
		for _, l := range lens {
			p, err := remote.Prefix(l)
			if err != nil {
				break
			}
			if c := b.nets[p]; c != nil {
				best = c.first(ix.rules, f, best)
			}
		}
	}
	if int(best) == len(ix.rules) {
		return -1
	}
	return int(best)
}
