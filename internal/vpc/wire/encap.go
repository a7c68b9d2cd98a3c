package wire

import (
	"encoding/binary"
	"net/netip"
)

// Hop limits of the outer IPv6 header: OPTE pushes ingot's Ipv6 default
// (#[ingot(default = 128)] in opte engine/ip/v6.rs; overlay.rs sets only
// src, dst and protocol), the switch's NAT ingress sets 255 (dendrite
// sidecar.p4 add_encap_headers) and then routes the packet, so a sled
// receives it with 254.
const (
	OPTEHopLimit   = 128
	SwitchHopLimit = 255
)

// OuterLen is the length of the outer Ethernet, IPv6 and UDP headers.
const OuterLen = EthernetLen + IPv6Len + UDPLen

// Encap describes the encapsulation of one inner Ethernet frame.
// Traffic class and flow label are always 0, as OPTE and the switch send.
type Encap struct {
	VNI uint32

	// Oxide options, written in this order when several are set (OPTE
	// never combines them).
	External    bool        // type 0x00, no body
	Multicast   bool        // type 0x01, 4-byte body
	Replication Replication // for Multicast
	MSS         bool        // type 0x02, 4-byte body
	MSSValue    uint32      // 0 unless segmentation offload needs the MSS carried

	// Outer headers: used only by PutFrame (a full outer frame).
	OuterDst, OuterSrc MAC
	Src, Dst           netip.Addr // IPv6
	HopLimit           uint8
	SrcPort            uint16 // entropy; the destination port is always 6081
	// UDPChecksum asks for a real outer UDP checksum. OPTE always sends 0
	// (RFC 6935/6936, headers.rs SizeHoldingEncap); the switch computes one
	// when the inner packet is TCP or UDP and sends 0 for ICMP (sidecar.p4
	// IngressDeparser).
	UDPChecksum bool
}

// InternalEncap is OPTE's encapsulation of VPC-internal traffic to a v2p
// target (oxide-vpc engine/overlay.rs EncapAction::gen_ht): VNI of the
// port's VPC, the entropy of the (post-NAT) inner flow as source port, hop
// limit 128, checksum 0, and the MSS option on TCP only.
func InternalEncap(vni uint32, src, dst netip.Addr, key FlowKey) Encap {
	return Encap{VNI: vni, Src: src, Dst: dst, HopLimit: OPTEHopLimit,
		SrcPort: key.Entropy(), MSS: key.Proto == ProtoTCP}
}

// BoundaryEncap is OPTE's encapsulation towards boundary services (an
// internet gateway target): the tunnel endpoint's VNI (99), no options.
// The caller sets the inner destination MAC to TunnelEndpointMAC.
func BoundaryEncap(vni uint32, src, tep netip.Addr, key FlowKey) Encap {
	return Encap{VNI: vni, Src: src, Dst: tep, HopLimit: OPTEHopLimit, SrcPort: key.Entropy()}
}

// SwitchEncap is what the switch's NAT ingress builds towards a sled
// (dendrite sidecar.p4 add_encap_headers): source address :: (dendrite's
// nat.rs test: "The switch should be using the switch port IP, but isn't
// yet"), ports 6081 to 6081, hop limit 255, the External option, and a UDP
// checksum only for an inner TCP or UDP packet. The inner frame it wraps
// has source MAC 0 and the NAT target's MAC as destination.
func SwitchEncap(vni uint32, sled netip.Addr, innerProto uint8) Encap {
	return Encap{VNI: vni, Src: netip.IPv6Unspecified(), Dst: sled, HopLimit: SwitchHopLimit,
		SrcPort: GenevePort, External: true,
		UDPChecksum: innerProto == ProtoTCP || innerProto == ProtoUDP}
}

// OptLen is the length of the options e carries.
func (e *Encap) OptLen() int {
	n := 0
	if e.External {
		n += OptionHeaderLen
	}
	if e.Multicast {
		n += OptionHeaderLen + oxideBodyLen
	}
	if e.MSS {
		n += OptionHeaderLen + oxideBodyLen
	}
	return n
}

// GeneveHeaderLen is the length of the Geneve header and options: what
// precedes the inner frame in a UDP payload.
func (e *Encap) GeneveHeaderLen() int { return GeneveLen + e.OptLen() }

// FrameHeaderLen is the length of everything before the inner frame in a
// full outer frame.
func (e *Encap) FrameHeaderLen() int { return OuterLen + e.GeneveHeaderLen() }

// PutGeneveHeader writes the Geneve header and options into b and returns
// their length. The O and C bits are clear: no option we send is critical.
func (e *Encap) PutGeneveHeader(b []byte) (int, error) {
	if e.VNI > MaxVNI {
		return 0, ErrVNI
	}
	ol := e.OptLen()
	n := GeneveLen + ol
	if len(b) < n {
		return 0, ErrShortBuffer
	}
	b[0] = byte(ol / 4)
	b[1] = 0
	binary.BigEndian.PutUint16(b[2:4], GeneveProtoEthernet)
	b[4], b[5], b[6], b[7] = byte(e.VNI>>16), byte(e.VNI>>8), byte(e.VNI), 0
	o := b[GeneveLen:]
	if e.External {
		putOptionHeader(o, OxideTypeExternal, 0)
		o = o[OptionHeaderLen:]
	}
	if e.Multicast {
		putOptionHeader(o, OxideTypeMulticast, 1)
		binary.BigEndian.PutUint32(o[OptionHeaderLen:], uint32(e.Replication&3)<<30)
		o = o[OptionHeaderLen+oxideBodyLen:]
	}
	if e.MSS {
		putOptionHeader(o, OxideTypeMSS, 1)
		binary.BigEndian.PutUint32(o[OptionHeaderLen:], e.MSSValue)
	}
	return n, nil
}

func putOptionHeader(b []byte, typ uint8, words uint8) {
	binary.BigEndian.PutUint16(b[0:2], OxideOptionClass)
	b[2] = typ
	b[3] = words
}

// EncapGeneve writes into dst the payload a UDP socket sends to port 6081:
// the Geneve header and options followed by the inner frame. It returns
// the length written. When inner already sits at dst[e.GeneveHeaderLen():]
// (the caller left headroom), it is not copied.
func (e *Encap) EncapGeneve(dst, inner []byte) (int, error) {
	h := e.GeneveHeaderLen()
	if len(dst) < h+len(inner) {
		return 0, ErrShortBuffer
	}
	if _, err := e.PutGeneveHeader(dst[:h]); err != nil {
		return 0, err
	}
	moveInner(dst[h:], inner)
	return h + len(inner), nil
}

// EncapFrame writes into dst a full outer frame: outer Ethernet, IPv6, UDP
// (to 6081), Geneve and options, then the inner frame, as it appears on the
// underlay wire. It returns the length written. Headroom as for EncapGeneve.
func (e *Encap) EncapFrame(dst, inner []byte) (int, error) {
	if !e.Src.Is6() || !e.Dst.Is6() || e.Src.Is4In6() || e.Dst.Is4In6() {
		return 0, ErrAddressFamily
	}
	gl := e.GeneveHeaderLen()
	h := OuterLen + gl
	total := h + len(inner)
	udpLen := UDPLen + gl + len(inner)
	if udpLen > 0xffff {
		return 0, ErrIPLength
	}
	if len(dst) < total {
		return 0, ErrShortBuffer
	}
	if _, err := e.PutGeneveHeader(dst[OuterLen:h]); err != nil {
		return 0, err
	}
	moveInner(dst[h:], inner)
	PutEthernet(dst, e.OuterDst, e.OuterSrc, EtherTypeIPv6)
	ip := dst[EthernetLen:]
	ip[0], ip[1], ip[2], ip[3] = 0x60, 0, 0, 0 // version 6, traffic class 0, flow label 0
	binary.BigEndian.PutUint16(ip[4:6], uint16(udpLen))
	ip[6] = ProtoUDP
	ip[7] = e.HopLimit
	s, d := e.Src.As16(), e.Dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	u := ip[IPv6Len:]
	binary.BigEndian.PutUint16(u[0:2], e.SrcPort)
	binary.BigEndian.PutUint16(u[2:4], GenevePort)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen))
	u[6], u[7] = 0, 0
	if e.UDPChecksum {
		binary.BigEndian.PutUint16(u[6:8], L4Checksum(e.Src, e.Dst, ProtoUDP, u[:udpLen]))
	}
	return total, nil
}

// moveInner copies inner to dst unless it is already there.
func moveInner(dst, inner []byte) {
	if len(inner) == 0 || (len(dst) > 0 && &dst[0] == &inner[0]) {
		return
	}
	copy(dst, inner)
}

// Decap is the parse of an encapsulated packet. InnerOff is where the inner
// Ethernet frame starts in the buffer given to DecapGeneve or DecapFrame;
// the inner frame is b[InnerOff:] (b[InnerOff:InnerEnd] for a full frame,
// which may carry Ethernet padding).
type Decap struct {
	Geneve   Geneve
	InnerOff int
	InnerEnd int

	// From a full outer frame only.
	OuterDst, OuterSrc MAC
	Src, Dst           netip.Addr
	HopLimit           uint8
	SrcPort, DstPort   uint16
	UDPChecksum        uint16
}

// Inner returns the inner Ethernet frame within b.
func (d *Decap) Inner(b []byte) []byte { return b[d.InnerOff:d.InnerEnd] }

// DecapGeneve parses b as the payload of a UDP datagram received on port
// 6081 (Geneve header, options, inner frame).
func DecapGeneve(b []byte, d *Decap) error {
	*d = Decap{}
	if err := ParseGeneve(b, &d.Geneve); err != nil {
		return err
	}
	d.InnerOff = d.Geneve.InnerOff
	d.InnerEnd = len(b)
	return nil
}

// DecapFrame parses a full outer frame: Ethernet (IPv6, untagged), IPv6
// without extension headers, UDP to port 6081, Geneve. A nonzero outer UDP
// checksum is verified; a zero one is accepted (RFC 6935/6936), as both OPTE
// and the switch send it.
func DecapFrame(b []byte, d *Decap) error {
	*d = Decap{}
	if len(b) < OuterLen {
		return ErrTruncated
	}
	copy(d.OuterDst[:], b[0:6])
	copy(d.OuterSrc[:], b[6:12])
	switch binary.BigEndian.Uint16(b[12:14]) {
	case EtherTypeIPv6:
	case EtherTypeVLAN, EtherTypeQinQ, EtherTypeQinQv1:
		return ErrVLAN
	default:
		return ErrNotGeneve
	}
	ip := b[EthernetLen:]
	if ip[0]>>4 != 6 {
		return ErrIPVersion
	}
	if ip[6] != ProtoUDP {
		return ErrNotGeneve
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if IPv6Len+plen > len(ip) {
		return ErrTruncated
	}
	d.HopLimit = ip[7]
	d.Src = netip.AddrFrom16([16]byte(ip[8:24]))
	d.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
	u := ip[IPv6Len : IPv6Len+plen]
	if len(u) < UDPLen {
		return ErrTruncated
	}
	d.SrcPort = binary.BigEndian.Uint16(u[0:2])
	d.DstPort = binary.BigEndian.Uint16(u[2:4])
	if d.DstPort != GenevePort {
		return ErrNotGeneve
	}
	// The UDP length may fall short of the IPv6 payload (OPTE's
	// validate_udp allows it), never past it.
	ul := int(binary.BigEndian.Uint16(u[4:6]))
	if ul < UDPLen || ul > len(u) {
		return ErrUDPLength
	}
	u = u[:ul]
	d.UDPChecksum = binary.BigEndian.Uint16(u[6:8])
	if d.UDPChecksum != 0 && L4Checksum(d.Src, d.Dst, ProtoUDP, u) != d.UDPChecksum {
		return ErrUDPChecksum
	}
	if err := ParseGeneve(u[UDPLen:], &d.Geneve); err != nil {
		return err
	}
	d.InnerOff = OuterLen + d.Geneve.InnerOff
	d.InnerEnd = EthernetLen + IPv6Len + ul
	return nil
}
