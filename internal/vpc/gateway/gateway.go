package gateway

import (
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// Verdict is what the gateway layer decides for a frame.
type Verdict uint8

const (
	// Continue passes the frame on to the next layer (the firewall
	// outbound; towards the guest inbound, the gateway being the last layer).
	Continue Verdict = iota
	// Reply hairpins: the gateway answered, the reply frame is in the
	// caller's buffer, and the request goes no further.
	Reply
	// Drop discards the frame.
	Drop
)

func (v Verdict) String() string {
	switch v {
	case Continue:
		return "continue"
	case Reply:
		return "reply"
	case Drop:
		return "drop"
	}
	return "unknown"
}

// Reason says which rule decided. It never allocates: the data path may
// count or log it per packet.
type Reason uint8

const (
	ReasonNone Reason = iota
	// Continue and Reply reasons.
	ReasonGuest   // outbound from the guest's addresses, or inbound to them
	ReasonTransit // a transit IP or attached subnet
	ReasonMulticast
	ReasonARPReply
	ReasonEchoReply
	ReasonDHCPOffer
	ReasonDHCPAck
	ReasonRouterAdvert
	ReasonNeighborAdvert
	ReasonDHCPv6Reply
	// Drop reasons.
	ReasonSpoofed        // outbound from a MAC or IP that is not the guest's
	ReasonNotForGuest    // inbound to a MAC or IP that is not the guest's
	ReasonARP            // ARP other than the guest's broadcast request for the gateway
	ReasonNDP            // NDP the gateway does not answer (all inbound NDP)
	ReasonNDPInvalid     // an RS or NS to the gateway that fails RFC 4861's checks
	ReasonEchoInvalid    // an echo request to the gateway with a nonzero code
	ReasonDHCPv6         // a DHCPv6 message the gateway does not answer
	ReasonIPv6ExtHeaders // IPv6 with extension headers, which the data path refuses
	ReasonReplyBuffer    // the reply does not fit the caller's buffer
)

var reasonNames = [...]string{
	ReasonNone:           "none",
	ReasonGuest:          "guest address",
	ReasonTransit:        "transit IP or attached subnet",
	ReasonMulticast:      "multicast",
	ReasonARPReply:       "ARP reply",
	ReasonEchoReply:      "echo reply",
	ReasonDHCPOffer:      "DHCP offer",
	ReasonDHCPAck:        "DHCP ack",
	ReasonRouterAdvert:   "router advertisement",
	ReasonNeighborAdvert: "neighbor advertisement",
	ReasonDHCPv6Reply:    "DHCPv6 reply",
	ReasonSpoofed:        "source is not the guest's",
	ReasonNotForGuest:    "destination is not the guest's",
	ReasonARP:            "ARP not answered",
	ReasonNDP:            "NDP not answered",
	ReasonNDPInvalid:     "invalid NDP solicitation",
	ReasonEchoInvalid:    "invalid echo request",
	ReasonDHCPv6:         "DHCPv6 message not answered",
	ReasonIPv6ExtHeaders: "IPv6 extension headers",
	ReasonReplyBuffer:    "reply buffer too small",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Decision is the gateway layer's answer for one frame.
type Decision struct {
	Verdict Verdict
	Reason  Reason
	// Len is, for Reply, the length of the reply frame at the start of
	// the caller's buffer.
	Len int
	// VNI and HasVNI are, for outbound Continue, the VNI holding the
	// destination in the sled's mappings: the tag the firewall's "vpc"
	// host filters match on (OPTE's VniTag). No tag when no VPC holds it.
	VNI    uint32
	HasVNI bool
	// SrcMAC is, for inbound Continue, the source MAC the frame must carry
	// to the guest: the gateway's (Rewrite writes it).
	SrcMAC wire.MAC
}

// Rewrite applies an inbound Continue's transform to the frame b in place:
// its source MAC becomes the gateway's. It does nothing for other decisions.
func (d *Decision) Rewrite(b []byte) {
	if d.Verdict == Continue && d.SrcMAC != (wire.MAC{}) {
		copy(b[6:12], d.SrcMAC[:])
	}
}

// V2P is what the gateway needs of the sled's virtual-to-physical
// mappings: the VNI that holds an address (mappings.V2P satisfies it).
type V2P interface {
	VNIOf(vip netip.Addr) (uint32, bool)
}

// Gateway is one port's gateway layer. It is immutable: a new
// configuration (transit IPs changed, say) is a new Gateway, as OPTE
// rebuilds the layer's rules. Its methods are safe for concurrent use.
type Gateway struct {
	cfg Config
	v2p V2P

	v4, v6 bool
	// IPv4
	gw4, priv4 netip.Addr
	in4, out4  []netip.Prefix // attached ∪ transit, by direction
	dhcpTail   []byte         // DHCPv4 reply options after the message type
	// IPv6
	priv6, gwLL, guestLL netip.Addr
	gwSNMC               netip.Addr // the gateway link-local's solicited-node group
	gwSNMAC              wire.MAC
	in6, out6            []netip.Prefix
	serverDUID           [10]byte
	dns6Opt              []byte // DHCPv6 option 23, whole
	searchOpt            []byte // DHCPv6 option 24, whole; nil with no search list
	fqdnOpt              []byte // DHCPv6 option 39, whole; nil with no hostname
}

// New builds a port's gateway layer. v2p may be nil: outbound flows are
// then never tagged.
func New(cfg Config, v2p V2P) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.clone()
	g := &Gateway{cfg: cfg, v2p: v2p}
	if v := cfg.IPv4; v != nil {
		g.v4 = true
		g.gw4, g.priv4 = v.Gateway, v.Private
		g.in4, g.out4 = exceptions(v.Transit, v.Attached)
		g.dhcpTail = dhcpOptions(&cfg, v)
	}
	if v := cfg.IPv6; v != nil {
		g.v6 = true
		g.priv6 = v.Private
		g.gwLL = LinkLocal(cfg.GatewayMAC)
		g.guestLL = LinkLocal(cfg.GuestMAC)
		g.gwSNMC = SolicitedNode(g.gwLL)
		g.gwSNMAC, _ = wire.MulticastMAC(g.gwSNMC)
		g.in6, g.out6 = exceptions(v.Transit, v.Attached)
		g.dhcpv6Options()
	}
	return g, nil
}

// exceptions splits attached subnets and transit IPs by direction, as OPTE's
// compute_exceptions: attached subnets both ways, transit IPs as flagged.
func exceptions(transit []Transit, attached []netip.Prefix) (in, out []netip.Prefix) {
	for _, p := range attached {
		in, out = append(in, p.Masked()), append(out, p.Masked())
	}
	for _, t := range transit {
		if t.In {
			in = append(in, t.Prefix.Masked())
		}
		if t.Out {
			out = append(out, t.Prefix.Masked())
		}
	}
	return in, out
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// VNITag is the VNI an outbound flow to dst is tagged with: the VNI of the
// sled's mappings that holds dst (OPTE's VpcMeta, ip_to_vni), none when no
// VPC holds it. Outbound fills Decision.VNI with it; an engine that
// re-tags a cached flow calls it directly.
func (g *Gateway) VNITag(dst netip.Addr) (uint32, bool) {
	if g.v2p == nil {
		return 0, false
	}
	return g.v2p.VNIOf(dst)
}

// Config is the configuration g was built from.
func (g *Gateway) Config() Config { return g.cfg.clone() }

func drop(r Reason) Decision { return Decision{Verdict: Drop, Reason: r} }

func reply(r Reason, n int, err error) Decision {
	if err != nil {
		return drop(ReasonReplyBuffer)
	}
	return Decision{Verdict: Reply, Reason: r, Len: n}
}

// Outbound decides a frame from the guest: b is the frame and f its
// wire.Parse. A reply is written into out (a buffer of its own, not b);
// the data path sends out[:Len] back to the guest. Decisions other than
// Reply leave out alone.
//
// The rules are OPTE's gateway layer's outbound rules in their priority
// order (oxide-vpc engine/gateway): the hairpins (ARP, DHCP, echo, DHCPv6,
// router and neighbour solicitations), then the filter of all other NDP,
// then the no-spoof rule, which passes frames from the guest's MAC and
// one of its addresses, tagged with the destination's VNI. Everything
// else is dropped.
func (g *Gateway) Outbound(b []byte, f *wire.Frame, out []byte) Decision {
	if f.IPv6Ext {
		return drop(ReasonIPv6ExtHeaders)
	}
	fromGuest := f.Src == g.cfg.GuestMAC
	switch f.L3 {
	case wire.L3ARP:
		if g.v4 && fromGuest && f.Dst.IsBroadcast() {
			// OPTE's handle_arp_out: a request for the gateway's
			// address is answered; any other ARP is not.
			if f.ARP.Op == wire.ARPRequest && f.ARP.TargetIP == g.gw4 {
				n, err := g.arpReply(f, out)
				return reply(ReasonARPReply, n, err)
			}
		}
		return drop(ReasonARP)
	case wire.L3IPv4:
		if !g.v4 {
			return drop(ReasonSpoofed)
		}
		if d, ok := g.outbound4(b, f, out, fromGuest); ok {
			return d
		}
		if fromGuest && f.SrcIP == g.priv4 {
			return g.tagged(f.DstIP, ReasonGuest)
		}
		if fromGuest && containsAny(g.out4, f.SrcIP) {
			return g.tagged(f.DstIP, ReasonTransit)
		}
		return drop(ReasonSpoofed)
	case wire.L3IPv6:
		if isNDPType(f) && !g.v6 {
			return drop(ReasonNDP)
		}
		if !g.v6 {
			return drop(ReasonSpoofed)
		}
		if d, ok := g.outbound6(b, f, out, fromGuest); ok {
			return d
		}
		if fromGuest && f.SrcIP == g.priv6 {
			return g.tagged(f.DstIP, ReasonGuest)
		}
		if fromGuest && containsAny(g.out6, f.SrcIP) {
			return g.tagged(f.DstIP, ReasonTransit)
		}
		return drop(ReasonSpoofed)
	}
	return drop(ReasonSpoofed)
}

func (g *Gateway) tagged(dst netip.Addr, r Reason) Decision {
	d := Decision{Verdict: Continue, Reason: r}
	d.VNI, d.HasVNI = g.VNITag(dst)
	return d
}

// isNDPType reports an ICMPv6 router solicitation to redirect (133 to 137),
// the range OPTE's NDP filter drops.
func isNDPType(f *wire.Frame) bool {
	return f.L3 == wire.L3IPv6 && f.HasL4 && f.Proto == wire.ProtoICMPv6 &&
		f.ICMPType >= wire.ICMPv6RouterSolicitation && f.ICMPType <= icmpv6Redirect
}

const icmpv6Redirect = 137

// outbound4 runs the IPv4 hairpin rules. ok is false when none matches.
func (g *Gateway) outbound4(b []byte, f *wire.Frame, out []byte, fromGuest bool) (Decision, bool) {
	if !fromGuest || !f.HasL4 || f.IsFragment() {
		return Decision{}, false
	}
	switch f.Proto {
	case wire.ProtoUDP:
		// DHCP: broadcast from 0.0.0.0:68 to 255.255.255.255:67, a
		// DISCOVER or a REQUEST that smoltcp's DhcpRepr parses.
		if f.Dst.IsBroadcast() && f.SrcIP == ipv4Any && f.DstIP == ipv4Broadcast &&
			f.SrcPort == dhcpClientPort && f.DstPort == dhcpServerPort {
			if req, ok := parseDHCP(b[f.PayloadOff:f.L4End]); ok {
				switch req.msgType {
				case dhcpDiscover:
					n, err := g.dhcpReply(&req, dhcpOffer, out)
					return reply(ReasonDHCPOffer, n, err), true
				case dhcpRequest:
					n, err := g.dhcpReply(&req, dhcpAck, out)
					return reply(ReasonDHCPAck, n, err), true
				}
			}
		}
	case wire.ProtoICMP:
		if f.ICMPType == wire.ICMPEchoRequest && f.Dst == g.cfg.GatewayMAC &&
			f.SrcIP == g.priv4 && f.DstIP == g.gw4 {
			if f.ICMPCode != 0 {
				return drop(ReasonEchoInvalid), true
			}
			n, err := g.echoReply4(b, f, out)
			return reply(ReasonEchoReply, n, err), true
		}
	}
	return Decision{}, false
}

// outbound6 runs the IPv6 hairpin rules and the NDP filter.
func (g *Gateway) outbound6(b []byte, f *wire.Frame, out []byte, fromGuest bool) (Decision, bool) {
	if fromGuest && f.HasL4 {
		switch f.Proto {
		case wire.ProtoICMPv6:
			if d, ok := g.icmp6(b, f, out); ok {
				return d, true
			}
		case wire.ProtoUDP:
			if isLinkLocal64(f.SrcIP) && (f.DstIP == allDHCPRelaysAndServers || f.DstIP == allDHCPServers) &&
				f.SrcPort == dhcpv6ClientPort && f.DstPort == dhcpv6ServerPort {
				n, ok, err := g.dhcpv6Reply(b, f, out)
				if !ok {
					return drop(ReasonDHCPv6), true
				}
				return reply(ReasonDHCPv6Reply, n, err), true
			}
		}
	}
	if isNDPType(f) {
		return drop(ReasonNDP), true
	}
	return Decision{}, false
}

// icmp6 runs the echo, RS and NS hairpins, in OPTE's priority order.
func (g *Gateway) icmp6(b []byte, f *wire.Frame, out []byte) (Decision, bool) {
	switch f.ICMPType {
	case wire.ICMPv6EchoRequest:
		// From the guest's private address or the EUI-64 link-local of its
		// MAC, to the gateway's link-local address and MAC.
		if f.Dst == g.cfg.GatewayMAC && f.DstIP == g.gwLL && (f.SrcIP == g.priv6 || f.SrcIP == g.guestLL) {
			if f.ICMPCode != 0 {
				return drop(ReasonEchoInvalid), true
			}
			n, err := g.echoReply6(b, f, out)
			return reply(ReasonEchoReply, n, err), true
		}
	case wire.ICMPv6RouterSolicitation:
		if f.Dst == allRoutersMAC && isLinkLocal64(f.SrcIP) && f.DstIP == allRouters {
			n, ok, err := g.routerAdvert(b, f, out)
			if !ok {
				return drop(ReasonNDPInvalid), true
			}
			return reply(ReasonRouterAdvert, n, err), true
		}
	case wire.ICMPv6NeighborSolicitation:
		if (f.Dst == g.cfg.GatewayMAC || f.Dst == g.gwSNMAC) &&
			(isLinkLocal64(f.SrcIP) || f.SrcIP == ipv6Any) &&
			(f.DstIP == g.gwLL || f.DstIP == g.gwSNMC) {
			n, r, err := g.neighborAdvert(b, f, out)
			if r != ReasonNeighborAdvert {
				return drop(r), true
			}
			return reply(r, n, err), true
		}
	}
	return Decision{}, false
}

// Inbound decides a frame on its way to the guest (decapsulated, after
// the other layers): OPTE's inbound gateway rules. NDP is dropped; unicast
// to the guest's MAC and one of its addresses (or an attached subnet or
// transit IP), and multicast to a multicast MAC, continue with the source
// MAC to be rewritten to the gateway's (Decision.Rewrite). Everything else
// is dropped.
func (g *Gateway) Inbound(b []byte, f *wire.Frame) Decision {
	if f.IPv6Ext {
		return drop(ReasonIPv6ExtHeaders)
	}
	toGuest := f.Dst == g.cfg.GuestMAC
	pass := func(r Reason) Decision {
		return Decision{Verdict: Continue, Reason: r, SrcMAC: g.cfg.GatewayMAC}
	}
	switch {
	case f.L3 == wire.L3IPv4 && g.v4:
		switch {
		case toGuest && f.DstIP == g.priv4:
			return pass(ReasonGuest)
		case toGuest && containsAny(g.in4, f.DstIP):
			return pass(ReasonTransit)
		case f.Dst.IsMulticast() && ipv4Multicast.Contains(f.DstIP):
			return pass(ReasonMulticast)
		}
	case f.L3 == wire.L3IPv6 && g.v6:
		switch {
		case isNDPType(f):
			return drop(ReasonNDP)
		case toGuest && f.DstIP == g.priv6:
			return pass(ReasonGuest)
		case toGuest && containsAny(g.in6, f.DstIP):
			return pass(ReasonTransit)
		case f.Dst.IsMulticast() && ipv6Multicast.Contains(f.DstIP):
			return pass(ReasonMulticast)
		}
	case isNDPType(f):
		return drop(ReasonNDP)
	}
	return drop(ReasonNotForGuest)
}

var (
	ipv4Any       = netip.IPv4Unspecified()
	ipv4Broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	ipv4Multicast = netip.MustParsePrefix("224.0.0.0/4")
	ipv6Any       = netip.IPv6Unspecified()
	ipv6Multicast = netip.MustParsePrefix("ff00::/8")
	// OPTE's Ipv6Cidr::LINK_LOCAL is fe80::/64, not RFC 4291's fe80::/10.
	linkLocal64   = netip.MustParsePrefix("fe80::/64")
	allNodes      = netip.MustParseAddr("ff02::1")
	allRouters    = netip.MustParseAddr("ff02::2")
	allRoutersMAC = wire.MAC{0x33, 0x33, 0, 0, 0, 2}
	broadcastMAC  = wire.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

func isLinkLocal64(a netip.Addr) bool { return linkLocal64.Contains(a) }
