package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/snat"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// SNAT is a port's source NAT in one family: an external address and the
// ports of it the port may use (upstream's SourceNatConfig).
type SNAT struct {
	IP          netip.Addr
	First, Last uint16
}

// ExternalIPs is a port's external addresses in one family (OPTE's
// ExternalIpCfg): its source NAT, its ephemeral address and its floating
// ones.
type ExternalIPs struct {
	SNAT      *SNAT
	Ephemeral netip.Addr // the zero Addr: none
	Floating  []netip.Addr
}

// External is what OPTE's set_external_ips sets on a port: the external
// addresses of each family it has, and the internet gateways each address
// may leave through (PUT /eip-gateways, OPTE's InternetGatewayMap). An
// address the map does not hold leaves through the system gateway only; an
// address it holds, through the gateways listed only.
type External struct {
	IPv4, IPv6 *ExternalIPs
	Gateways   map[netip.Addr][]uuid.UUID
}

// Equal reports whether e and o set the same.
func (e External) Equal(o External) bool {
	same := func(a, b *ExternalIPs) bool {
		if a == nil || b == nil {
			return a == b
		}
		if (a.SNAT == nil) != (b.SNAT == nil) || a.SNAT != nil && *a.SNAT != *b.SNAT {
			return false
		}
		return a.Ephemeral == b.Ephemeral && slices.Equal(a.Floating, b.Floating)
	}
	if !same(e.IPv4, o.IPv4) || !same(e.IPv6, o.IPv6) || len(e.Gateways) != len(o.Gateways) {
		return false
	}
	for ip, g := range e.Gateways {
		h, ok := o.Gateways[ip]
		if !ok || !slices.Equal(g, h) {
			return false
		}
	}
	return true
}

func (e External) clone() External {
	c := External{Gateways: make(map[netip.Addr][]uuid.UUID, len(e.Gateways))}
	for ip, g := range e.Gateways {
		c.Gateways[ip.Unmap()] = slices.Clone(g)
	}
	for _, x := range []struct{ from, to **ExternalIPs }{{&e.IPv4, &c.IPv4}, {&e.IPv6, &c.IPv6}} {
		if *x.from == nil {
			continue
		}
		f := **x.from
		f.Floating = slices.Clone(f.Floating)
		if f.SNAT != nil {
			s := *f.SNAT
			f.SNAT = &s
		}
		*x.to = &f
	}
	return c
}

// ErrExternalIPs is an external configuration the port cannot take.
var ErrExternalIPs = errors.New("engine: bad external addresses")

// CheckExternalIPs reports whether SetExternalIPs would take e.
func (p *Port) CheckExternalIPs(e External) error { return p.checkExternal(e) }

func (p *Port) checkExternal(e External) error {
	for _, x := range []struct {
		fam  string
		ips  *ExternalIPs
		have bool
		is4  bool
	}{{"IPv4", e.IPv4, p.cfg.IPv4 != nil, true}, {"IPv6", e.IPv6, p.cfg.IPv6 != nil, false}} {
		if x.ips == nil {
			continue
		}
		// OPTE's InvalidIpCfg: external addresses of a family the port
		// does not have.
		if !x.have {
			return fmt.Errorf("%w: port %s has no %s address for external ones", ErrExternalIPs, p.cfg.Name, x.fam)
		}
		fam := func(a netip.Addr) bool { return a.IsValid() && a.Is4() == x.is4 && !a.Is4In6() }
		if s := x.ips.SNAT; s != nil {
			if !fam(s.IP) {
				return fmt.Errorf("%w: port %s: source NAT address %s is not %s", ErrExternalIPs, p.cfg.Name, s.IP, x.fam)
			}
			if s.First > s.Last {
				return fmt.Errorf("%w: port %s: source NAT ports %d-%d are none", ErrExternalIPs, p.cfg.Name, s.First, s.Last)
			}
		}
		if x.ips.Ephemeral.IsValid() && !fam(x.ips.Ephemeral) {
			return fmt.Errorf("%w: port %s: ephemeral address %s is not %s", ErrExternalIPs, p.cfg.Name, x.ips.Ephemeral, x.fam)
		}
		for _, a := range x.ips.Floating {
			if !fam(a) {
				return fmt.Errorf("%w: port %s: floating address %s is not %s", ErrExternalIPs, p.cfg.Name, a, x.fam)
			}
		}
	}
	return nil
}

// NAT priorities, as OPTE's NAT layer orders its outbound rules
// (oxide-vpc engine/nat.rs): floating 5, ephemeral 10, source NAT 100; an
// internet gateway's traffic that none takes is denied (255).
const (
	natFloating natKind = iota
	natEphemeral
	natSource
)

type natKind uint8

func (k natKind) String() string {
	return [...]string{"floating", "ephemeral", "snat"}[k]
}

// natRule is one outbound NAT rule: which internet gateway's traffic it
// takes (the router's target; system: no id) and the address it gives.
type natRule struct {
	kind        natKind
	igwInstance bool
	igw         uuid.UUID
	ips         []netip.Addr // floating (several) or ephemeral (one)
	pool        *snat.Pool
}

func (r *natRule) matches(t rules.Target) bool {
	return r.igwInstance == t.IGWInstance && (!r.igwInstance || r.igw == t.IGW)
}

// natFamily is the NAT layer's state in one family.
type natFamily struct {
	ext  ExternalIPs
	out  []natRule // by priority
	pool *snat.Pool
	// attachedExt are the attached external subnets: what comes from or
	// goes to them is not translated (OPTE's priority-4 rules).
	attachedExt []netip.Prefix
}

// natConfig is the NAT layer's rules, replaced whole by SetExternalIPs
// and by a change of the attached subnets.
type natConfig struct {
	gen      uint64
	ext      External
	attached []AttachedSubnet
	v4, v6   natFamily
}

func (c *natConfig) family(a netip.Addr) *natFamily {
	if a.Is4() {
		return &c.v4
	}
	return &c.v6
}

// oneToOne reports whether a is the family's ephemeral or a floating
// address (OPTE's VerifyAddr for 1:1 NAT).
func (n *natFamily) oneToOne(a netip.Addr) bool {
	return a.IsValid() && (n.ext.Ephemeral == a || slices.Contains(n.ext.Floating, a))
}

// owns reports whether a is any external address of the family.
func (n *natFamily) owns(a netip.Addr) bool {
	return n.oneToOne(a) || n.pool != nil && n.pool.IP() == a
}

// compileNAT makes the NAT layer's rules of ext and the attached subnets
// (OPTE's create_nat_rules): per family the attached external subnets,
// then floating, then ephemeral, then source NAT, each once per internet
// gateway its address may leave through. old's SNAT pools are kept when
// their address and ports stay, so that no port is handed out twice.
func compileNAT(ext External, attached []AttachedSubnet, old *natConfig, gen uint64) *natConfig {
	c := &natConfig{gen: gen, ext: ext, attached: attached}
	for _, s := range attached {
		if s.External {
			c.family(s.Prefix.Addr()).attachedExt = append(c.family(s.Prefix.Addr()).attachedExt, s.Prefix)
		}
	}
	// gateways is the rules' gateway matches of ip: its listed
	// gateways, or the system one when the map does not hold it.
	gateways := func(ip netip.Addr) []natRule {
		ids, ok := ext.Gateways[ip]
		if !ok {
			return []natRule{{}}
		}
		var out []natRule
		for _, id := range ids {
			out = append(out, natRule{igwInstance: true, igw: id})
		}
		return out
	}
	for _, x := range []struct {
		ips *ExternalIPs
		fam *natFamily
		old *natFamily
	}{{ext.IPv4, &c.v4, oldFamily(old, true)}, {ext.IPv6, &c.v6, oldFamily(old, false)}} {
		if x.ips == nil {
			continue
		}
		x.fam.ext = *x.ips
		// Floating addresses, grouped by gateway in the order given: a
		// flow picks one of its group by its hash.
		var groups []natRule
		for _, ip := range x.ips.Floating {
			for _, g := range gateways(ip) {
				i := slices.IndexFunc(groups, func(r natRule) bool { return r.igwInstance == g.igwInstance && r.igw == g.igw })
				if i < 0 {
					g.kind = natFloating
					groups = append(groups, g)
					i = len(groups) - 1
				}
				groups[i].ips = append(groups[i].ips, ip)
			}
		}
		x.fam.out = append(x.fam.out, groups...)
		if e := x.ips.Ephemeral; e.IsValid() {
			for _, g := range gateways(e) {
				g.kind, g.ips = natEphemeral, []netip.Addr{e}
				x.fam.out = append(x.fam.out, g)
			}
		}
		if s := x.ips.SNAT; s != nil {
			pool := x.old.pool
			if pool == nil || pool.IP() != s.IP {
				pool = nil
			} else if f, l := pool.Range(); f != s.First || l != s.Last {
				pool = nil
			}
			if pool == nil {
				pool, _ = snat.New(s.IP, s.First, s.Last) // checked by checkExternal
			}
			x.fam.pool = pool
			for _, g := range gateways(s.IP) {
				g.kind, g.pool = natSource, pool
				x.fam.out = append(x.fam.out, g)
			}
		}
	}
	return c
}

func oldFamily(c *natConfig, v4 bool) *natFamily {
	switch {
	case c == nil:
		return &natFamily{}
	case v4:
		return &c.v4
	}
	return &c.v6
}

// natFlow is one NAT flow, kept under two keys: what the guest sends
// (outbound, before the rewrite) and what answers it (inbound, before the
// rewrite back). Both keys share its lifetime, as OPTE's pair of entries
// share theirs.
type natFlow struct {
	kind     natKind
	private  netip.Addr
	external netip.Addr
	// Source NAT: the guest's port (or echo identifier) and the one it
	// has outside, leased from its pool.
	privPort uint16
	lease    snat.Lease
	outKey   wire.FlowKey
	inKey    wire.FlowKey
	// gen is the NAT config it was last found valid under; gone is set
	// when it is removed and its port given back. Both change under the
	// port's natMu.
	gen  atomic.Uint64
	gone atomic.Bool
}

// natEntry is a flow under one of its keys.
type natEntry struct {
	f   *natFlow
	dir rules.Dir
}

// NATFlow is a NAT flow, for the operator's view.
type NATFlow struct {
	Kind     string
	Out      wire.FlowKey // as the guest sends it
	In       wire.FlowKey // as its answers arrive
	External netip.AddrPort
	Hits     uint64 // after the first packet, both ways
	LastHit  int64  // Unix nanoseconds
}

// SetExternalIPs replaces the port's external addresses and gateways
// (OPTE's set_external_ips). Existing NAT flows are checked again on their
// next packet, as OPTE marks them dirty: a 1:1 flow stays while its address
// is still the port's ephemeral or a floating one, a source NAT flow while
// its address and ports are still the port's; others go (their port given
// back) and the packet is decided anew.
func (p *Port) SetExternalIPs(ext External) error {
	if err := p.checkExternal(ext); err != nil {
		return err
	}
	ext = ext.clone()
	p.natMu.Lock()
	defer p.natMu.Unlock()
	old := p.nat.Load()
	p.nat.Store(compileNAT(ext, old.attached, old, old.gen+1))
	return nil
}

// ExternalIPs is what the port's external addresses are.
func (p *Port) ExternalIPs() External { return p.nat.Load().ext.clone() }

// NATFlows lists the port's NAT flows.
func (p *Port) NATFlows() []NATFlow {
	var out []NATFlow
	entries := p.natFlows.Entries()
	inHits := map[*natFlow]uint64{}
	for _, e := range entries {
		if e.Value.dir == rules.In {
			inHits[e.Value.f] = e.Hits
		}
	}
	for _, e := range entries {
		if e.Value.dir != rules.Out {
			continue
		}
		f := e.Value.f
		port := f.lease.Port
		if f.kind != natSource {
			port = f.outKey.SrcPort
		}
		out = append(out, NATFlow{Kind: f.kind.String(), Out: f.outKey, In: f.inKey,
			External: netip.AddrPortFrom(f.external, port), Hits: e.Hits + inHits[f], LastHit: e.LastHit.UnixNano()})
	}
	slices.SortFunc(out, func(a, b NATFlow) int { return compareKeys(a.Out, b.Out) })
	return out
}

// natValid reports whether f may go on under c.
func natValid(f *natFlow, c *natConfig) bool {
	fam := c.family(f.external)
	if f.kind == natSource {
		return fam.pool != nil && f.lease.Pool == fam.pool
	}
	return fam.oneToOne(f.external)
}

// natLookup is the flow of key in direction dir, checked against the NAT
// config when it changed since; the other key's entry shares the hit.
func (p *Port) natLookup(key wire.FlowKey, dir rules.Dir, now time.Time) *natFlow {
	if p.natActive.Load() == 0 {
		return nil
	}
	e, ok := p.natFlows.LookupAt(key, now)
	if !ok || e.dir != dir {
		return nil
	}
	f := e.f
	if f.gone.Load() {
		return nil
	}
	if c := p.nat.Load(); f.gen.Load() != c.gen && !p.revalidate(f, c) {
		return nil
	}
	other := f.inKey
	if dir == rules.In {
		other = f.outKey
	}
	p.natFlows.Inherit(other, now)
	return f
}

// revalidate checks f again after the NAT config changed to c (OPTE's
// dirty entries, lib/opte/src/engine/layer.rs process_out): it stays, or
// goes with its port given back.
func (p *Port) revalidate(f *natFlow, c *natConfig) bool {
	p.natMu.Lock()
	defer p.natMu.Unlock()
	if f.gone.Load() {
		return false
	}
	if !natValid(f, c) {
		p.removeNATLocked(f)
		return false
	}
	f.gen.Store(c.gen)
	return true
}

// removeNATLocked forgets f under both keys and gives its port back.
// natMu is held.
func (p *Port) removeNATLocked(f *natFlow) {
	if f.gone.Load() {
		return
	}
	f.gone.Store(true)
	for _, k := range []wire.FlowKey{f.outKey, f.inKey} {
		if e, ok := p.natFlows.Peek(k); ok && e.f == f {
			p.natFlows.Remove(k)
		}
	}
	if f.kind == natSource {
		f.lease.Release() // the flow held it: never refused
	}
	p.natActive.Add(-1)
}

// addNAT keeps a new flow under both keys; a full table refuses it.
func (p *Port) addNAT(f *natFlow, now time.Time) error {
	p.natMu.Lock()
	defer p.natMu.Unlock()
	p.natActive.Add(1)
	for _, k := range []struct {
		key wire.FlowKey
		dir rules.Dir
	}{{f.outKey, rules.Out}, {f.inKey, rules.In}} {
		old, replaced, err := p.natFlows.InsertAt(k.key, natEntry{f: f, dir: k.dir}, now)
		if err != nil {
			p.removeNATLocked(f)
			return err
		}
		if replaced && old.Value.f != f {
			// Two packets made the same flow at once (a guest's and
			// an answer to it): the older one goes.
			p.removeNATLocked(old.Value.f)
		}
	}
	return nil
}

// expireNAT forgets the NAT flows idle past their time, each with both its
// keys, and gives their ports back.
func (p *Port) expireNAT() int {
	gone := p.natFlows.Expire()
	if len(gone) == 0 {
		return 0
	}
	n := 0
	p.natMu.Lock()
	defer p.natMu.Unlock()
	for _, e := range gone {
		if !e.Value.f.gone.Load() {
			n++
		}
		p.removeNATLocked(e.Value.f)
	}
	return n
}

// natOut is the NAT layer, outbound: a flow's packets are rewritten as its
// first was; a new flow from an attached external subnet is external as it
// is; a new flow to an internet gateway takes the first rule that the
// gateway matches. It reports whether the packet now comes from an
// external address.
func (p *Port) natOut(frame []byte, f *wire.Frame, key wire.FlowKey, rt rules.Target) (bool, Reason) {
	fam := p.nat.Load().family(key.Src)
	if p.natActive.Load() == 0 && rt.Kind != rules.TargetInternetGateway && len(fam.attachedExt) == 0 {
		return false, ReasonNone
	}
	now := p.e.cfg.Now()
	nf := p.natLookup(key, rules.Out, now)
	if nf == nil {
		// From an attached external subnet: external as it is, to
		// whatever the router chose (OPTE's ExternalIpTagger; the
		// overlay then refuses it into the VPC).
		if fam.externalSubnet(key.Src) {
			return true, ReasonNone
		}
		if rt.Kind != rules.TargetInternetGateway {
			return false, ReasonNone
		}
		var r Reason
		if nf, r = p.newNATOut(f, key, rt, now); r != ReasonNone {
			return false, r
		}
	}
	if err := nf.rewriteOut(frame, f); err != nil {
		return false, ReasonNAT
	}
	return true, ReasonNone
}

func (p *Port) newNATOut(f *wire.Frame, key wire.FlowKey, rt rules.Target, now time.Time) (*natFlow, Reason) {
	c := p.nat.Load()
	fam := c.family(key.Src)
	i := slices.IndexFunc(fam.out, func(r natRule) bool { return r.matches(rt) })
	if i < 0 {
		return nil, ReasonNAT // OPTE's priority-255 deny
	}
	r := &fam.out[i]
	nf := &natFlow{kind: r.kind, private: key.Src, outKey: key}
	nf.gen.Store(c.gen)
	post := key
	switch r.kind {
	case natFloating, natEphemeral:
		nf.external = r.ips[0]
		if len(r.ips) > 1 {
			nf.external = r.ips[key.CRC32()%uint32(len(r.ips))]
		}
	case natSource:
		proto := snat.Proto(key.Proto)
		switch key.Proto {
		case wire.ProtoTCP, wire.ProtoUDP:
			nf.privPort = key.SrcPort
		case wire.ProtoICMP, wire.ProtoICMPv6:
			// Only an echo request begins a flow through source
			// NAT: its identifier is the port (OPTE's gen_icmp_desc).
			req := uint8(wire.ICMPEchoRequest)
			if key.Proto == wire.ProtoICMPv6 {
				req = wire.ICMPv6EchoRequest
			}
			if !f.IsEcho || f.ICMPType != req {
				return nil, ReasonNAT
			}
			nf.privPort = key.EchoID
		default:
			return nil, ReasonNAT
		}
		l, err := r.pool.Alloc(proto)
		if errors.Is(err, snat.ErrExhausted) {
			return nil, ReasonSNATExhausted
		}
		if err != nil {
			return nil, ReasonNAT
		}
		nf.lease, nf.external = l, r.pool.IP()
		post.SrcPort = l.Port
		if key.Proto != wire.ProtoTCP && key.Proto != wire.ProtoUDP {
			post.SrcPort, post.EchoID = 0, l.Port
		}
	}
	post.Src = nf.external
	nf.inKey = post.Mirror()
	if err := p.addNAT(nf, now); err != nil {
		return nil, ReasonNAT
	}
	return nf, ReasonNone
}

// natIn is the NAT layer, inbound: an answer to a NAT flow is rewritten
// back; a new flow to the port's ephemeral or a floating address is
// translated 1:1 to the private one; one to an attached external subnet
// is left alone.
func (p *Port) natIn(frame []byte, f *wire.Frame) Reason {
	c := p.nat.Load()
	if p.natActive.Load() == 0 && !c.family(f.DstIP).oneToOne(f.DstIP) {
		return ReasonNone
	}
	now := p.e.cfg.Now()
	key := f.FlowKey()
	nf := p.natLookup(key, rules.In, now)
	if nf == nil {
		fam := c.family(key.Dst)
		// To an attached external subnet: not translated, even were an
		// external address of the port in it (OPTE's priority 4 comes
		// before 1:1 NAT's 5 and 10).
		if !fam.oneToOne(key.Dst) || fam.externalSubnet(key.Dst) {
			return ReasonNone
		}
		ip := p.cfg.IPv4
		if key.Dst.Is6() {
			ip = p.cfg.IPv6
		}
		kind := natFloating
		if fam.ext.Ephemeral == key.Dst {
			kind = natEphemeral
		}
		nf = &natFlow{kind: kind, private: ip.Private, external: key.Dst, inKey: key}
		nf.gen.Store(c.gen)
		post := key
		post.Dst = ip.Private
		nf.outKey = post.Mirror()
		if err := p.addNAT(nf, now); err != nil {
			return ReasonNAT
		}
	}
	if err := nf.rewriteIn(frame, f); err != nil {
		return ReasonNAT
	}
	return ReasonNone
}

func (nf *natFlow) rewriteOut(b []byte, f *wire.Frame) error {
	if err := f.SetSrcIP(b, nf.external); err != nil {
		return err
	}
	if nf.kind != natSource {
		nf.rewriteQuoted(b, f, false)
		return nil
	}
	if f.Proto == wire.ProtoTCP || f.Proto == wire.ProtoUDP {
		return f.SetSrcPort(b, nf.lease.Port)
	}
	return f.SetEchoID(b, nf.lease.Port)
}

func (nf *natFlow) rewriteIn(b []byte, f *wire.Frame) error {
	if err := f.SetDstIP(b, nf.private); err != nil {
		return err
	}
	if nf.kind != natSource {
		nf.rewriteQuoted(b, f, true)
		return nil
	}
	if f.Proto == wire.ProtoTCP || f.Proto == wire.ProtoUDP {
		return f.SetDstPort(b, nf.privPort)
	}
	return f.SetEchoID(b, nf.privPort)
}

// quotesPacket reports whether f is an ICMP message that quotes the packet
// it answers (OPTE's payload_is_packet): destination unreachable, source
// quench, redirect, time exceeded, parameter problem; for ICMPv6 types 1-4.
func quotesPacket(f *wire.Frame) bool {
	switch f.Proto {
	case wire.ProtoICMP:
		switch f.ICMPType {
		case 3, 4, 5, 11, 12:
			return true
		}
	case wire.ProtoICMPv6:
		return f.ICMPType >= 1 && f.ICMPType <= 4
	}
	return false
}

// rewriteQuoted translates the packet a 1:1 NAT flow's ICMP error quotes,
// as OPTE's body transform (lib/opte/src/engine/nat.rs IcmpV4Nat,
// IcmpV6Nat): inbound, its source from the external address to the
// private one; outbound, its destination from the private address to the
// external one. The quoted IPv4 header's checksum and the ICMP checksum
// are computed again. SNAT flows' errors are not translated (nor are they
// in OPTE).
func (nf *natFlow) rewriteQuoted(b []byte, f *wire.Frame, in bool) {
	if !quotesPacket(f) || f.PayloadOff == 0 {
		return
	}
	q := b[f.PayloadOff:f.L4End]
	var src, dst, n int
	switch {
	case f.L3 == wire.L3IPv4 && len(q) >= wire.IPv4MinLen && q[0]>>4 == 4:
		src, dst, n = 12, 16, 4
	case f.L3 == wire.L3IPv6 && len(q) >= wire.IPv6Len && q[0]>>4 == 6:
		src, dst, n = 8, 24, 16
	default:
		return
	}
	field, from, to := q[src:src+n], nf.external, nf.private
	if !in {
		field, from, to = q[dst:dst+n], nf.private, nf.external
	}
	var got netip.Addr
	if n == 4 {
		got = netip.AddrFrom4([4]byte(field))
	} else {
		got = netip.AddrFrom16([16]byte(field))
	}
	if got != from {
		return
	}
	copy(field, to.AsSlice())
	if n == 4 {
		if hl := int(q[0]&0x0f) * 4; hl >= wire.IPv4MinLen && hl <= len(q) {
			binary.BigEndian.PutUint16(q[10:], wire.IPv4HeaderChecksum(q[:hl]))
		}
	}
	c := f.L4Off + wire.L4ChecksumOffset(f.Proto)
	binary.BigEndian.PutUint16(b[c:], wire.L4Checksum(f.SrcIP, f.DstIP, f.Proto, b[f.L4Off:f.L4End]))
}
