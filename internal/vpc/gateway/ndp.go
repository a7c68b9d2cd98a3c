package gateway

import (
	"encoding/binary"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// The router advertisement the gateway sends (opte engine/icmp/v6.rs
// RouterAdvertisement::gen_packet, built by smoltcp 0.11's NdiscRepr).
const (
	raRouterLifetime = 9000 // seconds, the most RFC 4861 allows
	ndpHopLimit      = 255
	ndpOptSLLA       = 1
	ndpOptTLLA       = 2
	ndpOptMTU        = 5
	raFlagManaged    = 0x80
	naFlagRouter     = 0x80
	naFlagSolicited  = 0x40
	naFlagOverride   = 0x20
	raLen            = 16 + 8 + 8 // header, source link-layer address, MTU
	naLen            = 24 + 8     // header, target link-layer address
	rsHeaderLen      = 8
	nsHeaderLen      = 24
)

// ndpOptions walks the options of an RS or NS after its fixed header as
// smoltcp 0.11's NdiscRepr::parse does: an option shorter than 8 bytes,
// longer than what is left, of length 0, or a prefix information or
// redirected header option too short for its fields makes the message
// invalid; other options are skipped. It reports whether a source
// link-layer address option is present.
func ndpOptions(opts []byte) (slla bool, ok bool) {
	for len(opts) > 0 {
		if len(opts) < 8 {
			return false, false
		}
		typ, words := opts[0], int(opts[1])
		n := words * 8
		if len(opts) < n || words == 0 {
			return false, false
		}
		switch {
		case typ == 3 && n < 32, typ == 4 && n < 48:
			return false, false
		case typ == ndpOptSLLA:
			slla = true
		}
		opts = opts[n:]
	}
	return slla, true
}

// validSolicitation runs the checks OPTE makes (through smoltcp) of an RS
// or NS before answering: a valid ICMPv6 checksum, code 0, the message's
// fixed header present, well-formed options, hop limit 255 (RFC 4861
// §6.1.1, §7.1.1).
func validSolicitation(b []byte, f *wire.Frame, header int) (icmp []byte, slla bool, ok bool) {
	icmp = b[f.L4Off:f.L4End]
	if len(icmp) < header || f.ICMPCode != 0 || f.TTL != ndpHopLimit {
		return nil, false, false
	}
	// smoltcp's verify_checksum: the sum over the pseudo-header and the
	// whole message, checksum field included, is all ones (so a checksum
	// of 0xffff where 0 is computed passes too).
	if wire.Fold(wire.Sum(icmp, wire.PseudoHeaderSum(f.SrcIP, f.DstIP, wire.ProtoICMPv6, len(icmp)))) != 0 {
		return nil, false, false
	}
	slla, ok = ndpOptions(icmp[header:])
	return icmp, slla, ok
}

// routerAdvert answers a router solicitation: from the gateway's
// link-local address and MAC to the solicitation's source address and the
// guest's MAC, hop limit 255, current hop limit 255, the Managed flag (the
// guest gets its address by DHCPv6), router lifetime 9000 s, reachable
// and retransmit times 0, the gateway's MAC as source link-layer address,
// the port's MTU, and no prefix (nothing but the gateway is on-link).
// ok is false for an invalid solicitation.
func (g *Gateway) routerAdvert(b []byte, f *wire.Frame, out []byte) (int, bool, error) {
	if _, _, ok := validSolicitation(b, f, rsHeaderLen); !ok {
		return 0, false, nil
	}
	const n = wire.EthernetLen + wire.IPv6Len + raLen
	if len(out) < n {
		return 0, true, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, g.cfg.GuestMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv6)
	if _, err := wire.PutIPv6(out[wire.EthernetLen:], g.gwLL, f.SrcIP, wire.ProtoICMPv6, raLen, ndpHopLimit); err != nil {
		return 0, true, err
	}
	ra := out[wire.EthernetLen+wire.IPv6Len : n]
	ra[0], ra[1], ra[2], ra[3] = wire.ICMPv6RouterAdvertisement, 0, 0, 0
	ra[4], ra[5] = ndpHopLimit, raFlagManaged
	binary.BigEndian.PutUint16(ra[6:8], raRouterLifetime)
	clear(ra[8:16])
	ra[16], ra[17] = ndpOptSLLA, 1
	copy(ra[18:24], g.cfg.GatewayMAC[:])
	ra[24], ra[25], ra[26], ra[27] = ndpOptMTU, 1, 0, 0
	binary.BigEndian.PutUint32(ra[28:32], g.cfg.MTU)
	binary.BigEndian.PutUint16(ra[2:4], wire.L4Checksum(g.gwLL, f.SrcIP, wire.ProtoICMPv6, ra))
	return n, true, nil
}

// neighborAdvert answers a neighbour solicitation for the gateway's
// link-local address (opte engine/icmp/v6.rs NeighborAdvertisement):
// Router and Override set, Solicited unless the solicitation came from ::
// (duplicate address detection), in which case the advertisement goes to
// all nodes; the gateway's MAC as target link-layer address. It returns
// the reason of its decision: ReasonNeighborAdvert, ReasonNDPInvalid for a
// solicitation RFC 4861 §7.1.1 rejects, ReasonNDP for one for another target.
func (g *Gateway) neighborAdvert(b []byte, f *wire.Frame, out []byte) (int, Reason, error) {
	icmp, slla, ok := validSolicitation(b, f, nsHeaderLen)
	if !ok {
		return 0, ReasonNDPInvalid, nil
	}
	target := netip.AddrFrom16([16]byte(icmp[8:24]))
	unspec := f.SrcIP == ipv6Any
	if target.IsMulticast() || (unspec && (!isSolicitedNode(f.DstIP) || slla)) {
		return 0, ReasonNDPInvalid, nil
	}
	if target != g.gwLL {
		return 0, ReasonNDP, nil
	}
	flags := byte(naFlagRouter | naFlagOverride)
	dstIP, dstMAC := f.SrcIP, g.cfg.GuestMAC
	if unspec {
		dstIP = allNodes
		dstMAC, _ = wire.MulticastMAC(allNodes)
	} else {
		flags |= naFlagSolicited
		if m, ok := wire.MulticastMAC(dstIP); ok {
			dstMAC = m
		}
	}
	const n = wire.EthernetLen + wire.IPv6Len + naLen
	if len(out) < n {
		return 0, ReasonNeighborAdvert, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, dstMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv6)
	if _, err := wire.PutIPv6(out[wire.EthernetLen:], g.gwLL, dstIP, wire.ProtoICMPv6, naLen, ndpHopLimit); err != nil {
		return 0, ReasonNeighborAdvert, err
	}
	na := out[wire.EthernetLen+wire.IPv6Len : n]
	na[0], na[1], na[2], na[3] = wire.ICMPv6NeighborAdvert, 0, 0, 0
	na[4], na[5], na[6], na[7] = flags, 0, 0, 0
	t := g.gwLL.As16()
	copy(na[8:24], t[:])
	na[24], na[25] = ndpOptTLLA, 1
	copy(na[26:32], g.cfg.GatewayMAC[:])
	binary.BigEndian.PutUint16(na[2:4], wire.L4Checksum(g.gwLL, dstIP, wire.ProtoICMPv6, na))
	return n, ReasonNeighborAdvert, nil
}

// isSolicitedNode reports an address in ff02::1:ff00:0/104.
func isSolicitedNode(a netip.Addr) bool {
	v := a.As16()
	return a.Is6() && v[0] == 0xff && v[1] == 0x02 && v[11] == 0x01 && v[12] == 0xff &&
		v[2]|v[3]|v[4]|v[5]|v[6]|v[7]|v[8]|v[9]|v[10] == 0
}
