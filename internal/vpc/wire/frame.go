package wire

import (
	"encoding/binary"
	"net/netip"
)

// L3 is the network layer a frame carries.
type L3 uint8

const (
	L3None L3 = iota
	L3ARP
	L3IPv4
	L3IPv6
)

// IP protocol numbers this package understands.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// Header sizes.
const (
	IPv4MinLen = 20
	IPv6Len    = 40
	UDPLen     = 8
	TCPMinLen  = 20
	ICMPLen    = 8 // type, code, checksum and the 4-byte rest of header
)

// TCP flags (the low byte of the flags field).
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPPsh = 0x08
	TCPAck = 0x10
	TCPUrg = 0x20
	TCPEce = 0x40
	TCPCwr = 0x80
)

// ICMP and ICMPv6 types this package names.
const (
	ICMPEchoReply   = 0
	ICMPEchoRequest = 8

	ICMPv6EchoRequest          = 128
	ICMPv6EchoReply            = 129
	ICMPv6RouterSolicitation   = 133
	ICMPv6RouterAdvertisement  = 134
	ICMPv6NeighborSolicitation = 135
	ICMPv6NeighborAdvert       = 136
)

// Frame is the parse of one Ethernet frame: offsets into the caller's
// buffer and the header fields the VPC data path decides on. Parse fills it
// without allocating; the buffer stays the caller's, and the offsets are
// valid for as long as it is not reshaped.
type Frame struct {
	Dst, Src  MAC
	EtherType uint16
	L3        L3

	// L3Off is where the ARP or IP header starts (14). L4Off is where the
	// TCP, UDP or ICMP header starts, PayloadOff where its payload starts
	// and L4End where the segment ends; all three are 0 when HasL4 is false.
	// End is the end of the IP packet: Ethernet padding after it is not part
	// of the packet. L4End is End but for a UDP datagram shorter than its IP
	// payload (its length field rules, as in OPTE's validate_udp and Linux).
	L3Off, L4Off, PayloadOff, L4End, End int

	ARP ARP // when L3 == L3ARP

	SrcIP, DstIP netip.Addr
	// Proto is the IPv4 protocol, or the IPv6 next header. When IPv6Ext is
	// set it is the first extension header's number, not a transport.
	Proto uint8
	TTL   uint8 // IPv4 TTL or IPv6 hop limit

	IPv4HeaderLen int // 20 + options
	DontFragment  bool
	MoreFragments bool
	FragOffset    uint16 // in 8-byte units
	// IPv6Ext reports an IPv6 extension header after the fixed header. Such
	// packets are not parsed further (HasL4 is false); the data path refuses them.
	IPv6Ext bool

	HasL4            bool
	SrcPort, DstPort uint16
	TCPFlags         uint8
	TCPHeaderLen     int
	ICMPType         uint8
	ICMPCode         uint8
	// IsEcho is set for an ICMP or ICMPv6 echo request or reply with code 0
	// (the only case OPTE reads an identifier from); EchoID and EchoSeq are
	// valid only then.
	IsEcho  bool
	EchoID  uint16
	EchoSeq uint16
}

// IsFragment reports whether an IPv4 packet is a fragment (first or later).
func (f *Frame) IsFragment() bool { return f.MoreFragments || f.FragOffset != 0 }

// IsNDP reports whether the frame is an ICMPv6 router or neighbour
// solicitation or advertisement.
func (f *Frame) IsNDP() bool {
	return f.L3 == L3IPv6 && f.HasL4 && f.Proto == ProtoICMPv6 &&
		f.ICMPType >= ICMPv6RouterSolicitation && f.ICMPType <= ICMPv6NeighborAdvert
}

// IsIPv6ExtHeader reports whether next is an IPv6 extension header
// (RFC 8200 §4 and the IANA list: hop-by-hop, routing, fragment, ESP, AH,
// destination options, mobility, HIP, shim6 and the two experimental values).
func IsIPv6ExtHeader(next uint8) bool {
	switch next {
	case 0, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254:
		return true
	}
	return false
}

// Parse parses the Ethernet frame in b into f. VLAN-tagged frames are
// refused with ErrVLAN (a VPC port is untagged; OPTE's parser knows no VLAN
// header); other ethertypes than IPv4, IPv6 and ARP give ErrEtherType.
// IP fragments after the first and IPv6 packets with extension headers are
// accepted with HasL4 false, for the caller to decide.
func Parse(b []byte, f *Frame) error {
	*f = Frame{}
	if len(b) < EthernetLen {
		return ErrTruncated
	}
	copy(f.Dst[:], b[0:6])
	copy(f.Src[:], b[6:12])
	f.EtherType = binary.BigEndian.Uint16(b[12:14])
	f.L3Off = EthernetLen
	switch f.EtherType {
	case EtherTypeIPv4:
		return parseIPv4(b, f)
	case EtherTypeIPv6:
		return parseIPv6(b, f)
	case EtherTypeARP:
		f.L3 = L3ARP
		f.End = EthernetLen + ARPLen
		return parseARP(b[EthernetLen:], &f.ARP)
	case EtherTypeVLAN, EtherTypeQinQ, EtherTypeQinQv1:
		return ErrVLAN
	}
	return ErrEtherType
}

func parseIPv4(b []byte, f *Frame) error {
	f.L3 = L3IPv4
	ip := b[EthernetLen:]
	if len(ip) < IPv4MinLen {
		return ErrTruncated
	}
	if ip[0]>>4 != 4 {
		return ErrIPVersion
	}
	hl := int(ip[0]&0x0f) * 4
	if hl < IPv4MinLen {
		return ErrIPv4HeaderLen
	}
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total < hl {
		return ErrIPLength
	}
	if total > len(ip) {
		return ErrTruncated
	}
	f.IPv4HeaderLen = hl
	ff := binary.BigEndian.Uint16(ip[6:8])
	f.DontFragment = ff&0x4000 != 0
	f.MoreFragments = ff&0x2000 != 0
	f.FragOffset = ff & 0x1fff
	f.TTL = ip[8]
	f.Proto = ip[9]
	f.SrcIP = netip.AddrFrom4([4]byte(ip[12:16]))
	f.DstIP = netip.AddrFrom4([4]byte(ip[16:20]))
	f.End = EthernetLen + total
	if f.FragOffset != 0 {
		return nil
	}
	return parseL4(b[:f.End], EthernetLen+hl, f)
}

func parseIPv6(b []byte, f *Frame) error {
	f.L3 = L3IPv6
	ip := b[EthernetLen:]
	if len(ip) < IPv6Len {
		return ErrTruncated
	}
	if ip[0]>>4 != 6 {
		return ErrIPVersion
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if IPv6Len+plen > len(ip) {
		return ErrTruncated
	}
	f.Proto = ip[6]
	f.TTL = ip[7]
	f.SrcIP = netip.AddrFrom16([16]byte(ip[8:24]))
	f.DstIP = netip.AddrFrom16([16]byte(ip[24:40]))
	f.End = EthernetLen + IPv6Len + plen
	if IsIPv6ExtHeader(f.Proto) {
		f.IPv6Ext = true
		return nil
	}
	return parseL4(b[:f.End], EthernetLen+IPv6Len, f)
}

// parseL4 parses the transport header at b[off:]; b ends where the IP packet ends.
func parseL4(b []byte, off int, f *Frame) error {
	l4 := b[off:]
	switch f.Proto {
	case ProtoTCP:
		if len(l4) < TCPMinLen {
			return ErrTruncated
		}
		hl := int(l4[12]>>4) * 4
		if hl < TCPMinLen {
			return ErrTCPHeaderLen
		}
		if hl > len(l4) {
			return ErrTruncated
		}
		f.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		f.DstPort = binary.BigEndian.Uint16(l4[2:4])
		f.TCPFlags = l4[13]
		f.TCPHeaderLen = hl
		f.PayloadOff = off + hl
	case ProtoUDP:
		if len(l4) < UDPLen {
			return ErrTruncated
		}
		ul := int(binary.BigEndian.Uint16(l4[4:6]))
		// A first fragment's UDP length covers the whole datagram.
		if ul < UDPLen || (!f.MoreFragments && ul > len(l4)) {
			return ErrUDPLength
		}
		f.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		f.DstPort = binary.BigEndian.Uint16(l4[2:4])
		f.PayloadOff = off + UDPLen
		f.L4End = off + min(ul, len(l4))
	case ProtoICMP, ProtoICMPv6:
		if (f.Proto == ProtoICMP) != (f.L3 == L3IPv4) {
			return nil // ICMP over IPv6 or ICMPv6 over IPv4: not a transport we know
		}
		if len(l4) < ICMPLen {
			return ErrTruncated
		}
		f.ICMPType = l4[0]
		f.ICMPCode = l4[1]
		req, rep := uint8(ICMPEchoRequest), uint8(ICMPEchoReply)
		if f.Proto == ProtoICMPv6 {
			req, rep = ICMPv6EchoRequest, ICMPv6EchoReply
		}
		if (f.ICMPType == req || f.ICMPType == rep) && f.ICMPCode == 0 {
			f.IsEcho = true
			f.EchoID = binary.BigEndian.Uint16(l4[4:6])
			f.EchoSeq = binary.BigEndian.Uint16(l4[6:8])
		}
		f.PayloadOff = off + ICMPLen
	default:
		return nil
	}
	f.HasL4 = true
	f.L4Off = off
	if f.L4End == 0 {
		f.L4End = len(b)
	}
	return nil
}
