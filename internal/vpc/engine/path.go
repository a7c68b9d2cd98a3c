package engine

import (
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/gateway"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// Verdict is where a packet goes.
type Verdict uint8

const (
	// Drop: nowhere (Result.Reason says why).
	Drop Verdict = iota
	// ToPort: Result.Data, a frame, out of Result.Port's link, to its guest.
	ToPort
	// ToUnderlay: Result.Data, a Geneve payload, to [Result.Dst]:6081
	// from the outer UDP source port Result.SrcPort.
	ToUnderlay
)

// Result is what became of a packet.
type Result struct {
	Verdict Verdict
	Reason  Reason
	Port    *Port
	Dst     netip.Addr
	// SrcPort is ToUnderlay's outer UDP source port: the flow's hash
	// (OPTE's entropy), which spreads the sled's flows over the
	// underlay's paths.
	SrcPort uint16
	// Data is a slice of the caller's buffer.
	Data []byte
}

func dropped(r Reason) Result { return Result{Verdict: Drop, Reason: r} }

func (e *Engine) unmatchedDrop(r Reason) Result {
	e.unmatched.dropped[r].Add(1)
	return dropped(r)
}

func (p *Port) drop(r Reason) Result {
	p.stats.dropped[r].Add(1)
	return dropped(r)
}

// Outbound runs a frame the guest of port p sent, buf[Headroom:Headroom+n],
// through the port's layers. What leaves the sled is encapsulated in place,
// in the headroom.
func (e *Engine) Outbound(p *Port, buf []byte, n int) Result {
	p.stats.out.Add(1)
	if n < 0 || len(buf) < Headroom+n {
		return p.drop(ReasonTooBig)
	}
	frame := buf[Headroom : Headroom+n]
	var f wire.Frame
	if err := wire.Parse(frame, &f); err != nil {
		return p.drop(ReasonParse)
	}
	// Gateway: ARP, DHCP, echo and NDP for the gateway are answered to
	// the guest; anything else must come from its own MAC and addresses.
	gd := p.gw.Load().Outbound(frame, &f, p.reply)
	switch gd.Verdict {
	case gateway.Reply:
		return Result{Verdict: ToPort, Port: p, Data: p.reply[:gd.Len]}
	case gateway.Drop:
		if gd.Reason == gateway.ReasonSpoofed {
			return p.drop(ReasonSpoof)
		}
		return p.drop(ReasonGateway)
	}
	if !f.HasL4 {
		return p.drop(ReasonParse)
	}
	key := f.FlowKey()
	fl := rules.Flow{Dir: rules.Out, Proto: rules.Proto(f.Proto), Src: f.SrcIP, Dst: f.DstIP,
		SrcPort: f.SrcPort, DstPort: f.DstPort, ICMPType: f.ICMPType, ICMPCode: f.ICMPCode}
	if gd.HasVNI {
		fl.VNI = rules.Tag(gd.VNI)
	}
	if r := p.firewall(&fl, key); r != ReasonNone {
		return p.drop(r)
	}
	rt := p.router.Load().Lookup(&fl)
	if rt.Action == rules.Deny || rt.Multicast {
		return p.drop(ReasonNoRoute)
	}
	// NAT: a flow's packets as its first; a new flow to an internet
	// gateway takes an external address, or is dropped.
	fromExternal, r := p.natOut(frame, &f, key, rt.Target)
	if r != ReasonNone {
		return p.drop(r)
	}
	recipient := f.DstIP
	switch rt.Target.Kind {
	case rules.TargetIP:
		recipient = rt.Target.IP
	case rules.TargetVPCSubnet:
	case rules.TargetInternetGateway:
		return e.toBoundary(p, buf, frame, &f, fromExternal)
	default:
		return p.drop(ReasonNoRoute)
	}
	// Into the VPC: never from an external address (OPTE's overlay
	// denies it).
	if fromExternal {
		return p.drop(ReasonExternalToVPC)
	}
	phys, ok := e.cfg.V2P.Get(p.cfg.VNI, recipient)
	if !ok {
		return p.drop(ReasonNoV2P)
	}
	copy(frame[0:6], phys.MAC[:]) // the inner destination: the v2p MAC
	if phys.Sled == e.cfg.Underlay {
		// On this sled: into the other port's inbound path, as OPTE loops
		// it (xde.rs:2905), tagged with this port's VNI.
		dst, ok := e.portByAddr(p.cfg.VNI, phys.MAC)
		if !ok {
			return p.drop(ReasonNoV2P)
		}
		f.Dst = phys.MAC
		return e.deliver(dst, frame, &f, rules.Tag(p.cfg.VNI))
	}
	return p.encap(buf, frame, wire.InternalEncap(p.cfg.VNI, e.cfg.Underlay, phys.Sled, key), phys.Sled)
}

// toBoundary sends what the router gives an internet gateway to the
// switch's boundary services (OPTE's EncapAction): the tunnel endpoint the
// v2b table gives the destination, picked by the hash of the flow after
// NAT, with the endpoint's VNI, the inner destination MAC
// A8:40:25:77:77:77 and no options. It must come from an external address.
func (e *Engine) toBoundary(p *Port, buf, frame []byte, f *wire.Frame, fromExternal bool) Result {
	if !fromExternal {
		return p.drop(ReasonNAT)
	}
	key := f.FlowKey()
	tep, ok := e.cfg.V2B.Pick(f.DstIP, key.CRC32())
	if !ok {
		return p.drop(ReasonNoV2B)
	}
	copy(frame[0:6], wire.TunnelEndpointMAC[:])
	return p.encap(buf, frame, wire.BoundaryEncap(tep.VNI, e.cfg.Underlay, tep.Addr, key), tep.Addr)
}

// encap writes enc's Geneve header in the headroom before frame.
func (p *Port) encap(buf, frame []byte, enc wire.Encap, dst netip.Addr) Result {
	hl := enc.GeneveHeaderLen()
	if hl > Headroom {
		return p.drop(ReasonTooBig)
	}
	out := buf[Headroom-hl:]
	m, err := enc.EncapGeneve(out, frame)
	if err != nil {
		return p.drop(ReasonTooBig)
	}
	return Result{Verdict: ToUnderlay, Port: p, Dst: dst, SrcPort: enc.SrcPort, Data: out[:m]}
}

// firewall decides fl of key: a flow it allowed before passes, both ways;
// a new one is matched against the rules and, allowed, kept.
func (p *Port) firewall(fl *rules.Flow, key wire.FlowKey) Reason {
	if _, ok := p.fwFlows.Lookup(key); ok {
		return ReasonNone
	}
	v := p.fw.Load().Match(fl)
	if v.Action == rules.Deny {
		return ReasonFirewall
	}
	if _, _, err := p.fwFlows.Insert(key, fwFlow{dir: fl.Dir, rule: v.Rule}); err != nil {
		return ReasonFirewall // a full table takes no new flow
	}
	p.fwFlows.Insert(key.Mirror(), fwFlow{dir: fl.Dir, rule: v.Rule, mirror: true})
	return ReasonNone
}

// Inbound runs Geneve from the underlay, pkt (a UDP payload), through the
// port its VNI and inner destination MAC name. The frame delivered is a
// slice of pkt.
func (e *Engine) Inbound(pkt []byte) Result {
	var d wire.Decap
	if err := wire.DecapGeneve(pkt, &d); err != nil {
		return e.unmatchedDrop(ReasonNoPort)
	}
	inner := d.Inner(pkt)
	var f wire.Frame
	if err := wire.Parse(inner, &f); err != nil || !f.HasL4 {
		return e.unmatchedDrop(ReasonParse)
	}
	p, ok := e.portByAddr(d.Geneve.VNI, f.Dst)
	if !ok {
		return e.unmatchedDrop(ReasonNoPort)
	}
	var tag rules.VNITag
	if !d.Geneve.External {
		tag = rules.Tag(d.Geneve.VNI)
	}
	return e.deliver(p, inner, &f, tag)
}

// deliver runs a frame for port p's guest through the port's layers, last
// to first, with its VNI tag.
func (e *Engine) deliver(p *Port, frame []byte, f *wire.Frame, tag rules.VNITag) Result {
	p.stats.in.Add(1)
	// NAT, inbound: answers to NAT flows, and new flows to the
	// ephemeral or a floating address, to the private address.
	if r := p.natIn(frame, f); r != ReasonNone {
		return p.drop(r)
	}
	if fam := p.nat.Load().family(f.DstIP); fam.owns(f.DstIP) && !fam.externalSubnet(f.DstIP) {
		// For an external address of the port, answering no flow of its
		// NAT (and not in an attached external subnet, which the guest
		// answers itself).
		return p.drop(ReasonNAT)
	}
	fl := rules.Flow{Dir: rules.In, Proto: rules.Proto(f.Proto), Src: f.SrcIP, Dst: f.DstIP,
		SrcPort: f.SrcPort, DstPort: f.DstPort, ICMPType: f.ICMPType, ICMPCode: f.ICMPCode, VNI: tag}
	if r := p.firewall(&fl, f.FlowKey()); r != ReasonNone {
		return p.drop(r)
	}
	// Gateway, inbound, last: only for the guest's MAC and addresses,
	// and what it receives comes from its gateway.
	gd := p.gw.Load().Inbound(frame, f)
	if gd.Verdict != gateway.Continue {
		return p.drop(ReasonSpoof)
	}
	gd.Rewrite(frame)
	return Result{Verdict: ToPort, Port: p, Data: frame}
}
