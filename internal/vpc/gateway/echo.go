package gateway

import (
	"encoding/binary"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// arpReply writes the gateway's answer to an ARP request for its address
// (opte engine/arp.rs gen_arp_reply, as oxide-vpc's handle_arp_out calls it):
// from the gateway's MAC and address to the request's sender hardware and
// protocol addresses, the Ethernet destination being the sender hardware
// address too. 42 bytes, no padding.
func (g *Gateway) arpReply(f *wire.Frame, out []byte) (int, error) {
	const n = wire.EthernetLen + wire.ARPLen
	if len(out) < n {
		return 0, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, f.ARP.SenderMAC, g.cfg.GatewayMAC, wire.EtherTypeARP)
	err := wire.PutARP(out[wire.EthernetLen:], &wire.ARP{
		Op:        wire.ARPReply,
		SenderMAC: g.cfg.GatewayMAC,
		SenderIP:  g.gw4,
		TargetMAC: f.ARP.SenderMAC,
		TargetIP:  f.ARP.SenderIP,
	})
	return n, err
}

// ttl is the TTL and hop limit of the replies OPTE builds with ingot's
// defaults (Ipv4 and Ipv6 default to 128); router and neighbour
// advertisements use 255 (RFC 4861 §6.1.2, §7.1.2).
const ttl = 128

// echoReply4 writes the gateway's echo reply (opte engine/icmp/v4.rs
// IcmpEchoReply): identifier, sequence and data of the request; IPv4 with
// ingot's defaults (TTL 128, identification 0, no flags) from the gateway
// to the guest's private address; the checksum updated from the request's
// for the type change, or computed when the request carried none.
func (g *Gateway) echoReply4(b []byte, f *wire.Frame, out []byte) (int, error) {
	seg := b[f.L4Off:f.L4End]
	n := wire.EthernetLen + wire.IPv4MinLen + len(seg)
	if len(out) < n {
		return 0, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, g.cfg.GuestMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv4)
	if _, err := wire.PutIPv4(out[wire.EthernetLen:], g.gw4, g.priv4, wire.ProtoICMP, len(seg), ttl, 0, false); err != nil {
		return 0, err
	}
	icmp := out[wire.EthernetLen+wire.IPv4MinLen : n]
	copy(icmp, seg)
	icmp[0], icmp[1] = wire.ICMPEchoReply, 0
	req := binary.BigEndian.Uint16(seg[2:4])
	var c uint16
	if req == 0 {
		c = wire.L4Checksum(g.gw4, g.priv4, wire.ProtoICMP, icmp)
	} else {
		c = wire.UpdateChecksum16(req, wire.ICMPEchoRequest<<8, wire.ICMPEchoReply<<8)
	}
	binary.BigEndian.PutUint16(icmp[2:4], c)
	return n, nil
}

// echoReply6 is echoReply4 for ICMPv6 (opte engine/icmp/v6.rs
// Icmpv6EchoReply): from the gateway's link-local address to the address
// the request came from, hop limit 128.
func (g *Gateway) echoReply6(b []byte, f *wire.Frame, out []byte) (int, error) {
	seg := b[f.L4Off:f.L4End]
	n := wire.EthernetLen + wire.IPv6Len + len(seg)
	if len(out) < n {
		return 0, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, g.cfg.GuestMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv6)
	if _, err := wire.PutIPv6(out[wire.EthernetLen:], g.gwLL, f.SrcIP, wire.ProtoICMPv6, len(seg), ttl); err != nil {
		return 0, err
	}
	icmp := out[wire.EthernetLen+wire.IPv6Len : n]
	copy(icmp, seg)
	icmp[0], icmp[1] = wire.ICMPv6EchoReply, 0
	req := binary.BigEndian.Uint16(seg[2:4])
	var c uint16
	if req == 0 {
		c = wire.L4Checksum(g.gwLL, f.SrcIP, wire.ProtoICMPv6, icmp)
	} else {
		c = wire.UpdateChecksum16(req, wire.ICMPv6EchoRequest<<8, wire.ICMPv6EchoReply<<8)
	}
	binary.BigEndian.PutUint16(icmp[2:4], c)
	return n, nil
}
