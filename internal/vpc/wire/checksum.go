package wire

import (
	"encoding/binary"
	"net/netip"
)

// Sum adds b to the ones'-complement running sum acc (RFC 1071). An odd
// trailing byte is padded with zero, so only the last slice of a sum may
// have odd length.
func Sum(b []byte, acc uint32) uint32 {
	s := uint64(acc)
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		s += v >> 48
		s += (v >> 32) & 0xffff
		s += (v >> 16) & 0xffff
		s += v & 0xffff
		b = b[8:]
	}
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	for s>>32 != 0 {
		s = (s & 0xffffffff) + s>>32
	}
	return uint32(s)
}

// Fold folds a running sum to 16 bits and complements it: the value that
// goes into a checksum field.
func Fold(acc uint32) uint16 {
	for acc>>16 != 0 {
		acc = (acc & 0xffff) + acc>>16
	}
	return ^uint16(acc)
}

// PseudoHeaderSum is the running sum of the IPv4 (RFC 793/768) or IPv6
// (RFC 8200 §8.1) pseudo-header for an upper-layer packet of length bytes.
func PseudoHeaderSum(src, dst netip.Addr, proto uint8, length int) uint32 {
	var acc uint32
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		acc = Sum(s[:], 0)
		acc = Sum(d[:], acc)
	} else {
		s, d := src.As16(), dst.As16()
		acc = Sum(s[:], 0)
		acc = Sum(d[:], acc)
	}
	return acc + uint32(proto) + uint32(length>>16) + uint32(length&0xffff)
}

// IPv4HeaderChecksum computes the header checksum of the IPv4 header hdr
// (its length from the IHL), skipping the checksum field itself.
func IPv4HeaderChecksum(hdr []byte) uint16 {
	hl := int(hdr[0]&0x0f) * 4
	acc := Sum(hdr[0:10], 0)
	acc = Sum(hdr[12:hl], acc)
	return Fold(acc)
}

// L4ChecksumOffset is where the checksum field sits in the transport
// header of proto, or -1 when the protocol has none this package knows.
func L4ChecksumOffset(proto uint8) int {
	switch proto {
	case ProtoTCP:
		return 16
	case ProtoUDP:
		return 6
	case ProtoICMP, ProtoICMPv6:
		return 2
	}
	return -1
}

// L4Checksum computes the checksum of the transport segment seg (header
// and payload) sent from src to dst, treating its checksum field as zero.
// ICMPv4 has no pseudo-header; TCP, UDP and ICMPv6 do. A UDP result of 0
// is sent as 0xffff (RFC 768).
func L4Checksum(src, dst netip.Addr, proto uint8, seg []byte) uint16 {
	off := L4ChecksumOffset(proto)
	var acc uint32
	if proto != ProtoICMP {
		acc = PseudoHeaderSum(src, dst, proto, len(seg))
	}
	acc = Sum(seg[:off], acc)
	acc = Sum(seg[off+2:], acc)
	c := Fold(acc)
	if proto == ProtoUDP && c == 0 {
		c = 0xffff
	}
	return c
}

// UpdateChecksum16 is RFC 1624's incremental update (eqn. 3,
// HC' = ~(~HC + ~m + m')) of checksum csum for one 16-bit word changing
// from old to new.
func UpdateChecksum16(csum, old, new uint16) uint16 {
	acc := uint32(^csum) + uint32(^old) + uint32(new)
	return Fold(acc)
}

// UpdateChecksum applies RFC 1624 for the even-length field old becoming new
// (an address: 4 or 16 bytes).
func UpdateChecksum(csum uint16, old, new []byte) uint16 {
	acc := uint32(^csum)
	for i := 0; i+1 < len(old); i += 2 {
		acc += uint32(^binary.BigEndian.Uint16(old[i:]))
		acc += uint32(binary.BigEndian.Uint16(new[i:]))
	}
	return Fold(acc)
}

// IPv4HeaderChecksumValid reports whether an IPv4 frame's header checksum is right.
func (f *Frame) IPv4HeaderChecksumValid(b []byte) bool {
	hdr := b[f.L3Off : f.L3Off+f.IPv4HeaderLen]
	return Fold(Sum(hdr, 0)) == 0
}

// L4ChecksumValid reports whether the transport checksum of a parsed,
// unfragmented frame is right. A UDP-over-IPv4 checksum of 0 means "none"
// and is valid.
func (f *Frame) L4ChecksumValid(b []byte) bool {
	if !f.HasL4 || f.IsFragment() {
		return false
	}
	off := f.L4Off + L4ChecksumOffset(f.Proto)
	got := binary.BigEndian.Uint16(b[off:])
	if f.Proto == ProtoUDP && got == 0 && f.L3 == L3IPv4 {
		return true
	}
	return got == L4Checksum(f.SrcIP, f.DstIP, f.Proto, b[f.L4Off:f.L4End])
}

// SetChecksums recomputes the IPv4 header checksum and, for an unfragmented
// packet with a parsed transport, its checksum (a UDP-over-IPv4 checksum
// of 0, "none", is left alone).
func (f *Frame) SetChecksums(b []byte) {
	if f.L3 == L3IPv4 {
		binary.BigEndian.PutUint16(b[f.L3Off+10:], IPv4HeaderChecksum(b[f.L3Off:]))
	}
	if !f.HasL4 || f.IsFragment() {
		return
	}
	off := f.L4Off + L4ChecksumOffset(f.Proto)
	if f.Proto == ProtoUDP && f.L3 == L3IPv4 && binary.BigEndian.Uint16(b[off:]) == 0 {
		return
	}
	binary.BigEndian.PutUint16(b[off:], L4Checksum(f.SrcIP, f.DstIP, f.Proto, b[f.L4Off:f.L4End]))
}

// l4CsumOff returns the offset of the transport checksum to update when
// the pseudo-header or a port changes, or -1 when there is none to update:
// no transport header in this frame (a later fragment), ICMPv4 for address
// changes (no pseudo-header), or UDP over IPv4 sent without a checksum.
func (f *Frame) l4CsumOff(b []byte, pseudo bool) int {
	if !f.HasL4 {
		return -1
	}
	if pseudo && f.Proto == ProtoICMP {
		return -1
	}
	off := f.L4Off + L4ChecksumOffset(f.Proto)
	if f.Proto == ProtoUDP && binary.BigEndian.Uint16(b[off:]) == 0 {
		return -1
	}
	return off
}

func (f *Frame) patchL4(b []byte, off int, old, new []byte) {
	c := UpdateChecksum(binary.BigEndian.Uint16(b[off:]), old, new)
	if f.Proto == ProtoUDP && c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[off:], c)
}

// SetSrcIP rewrites the source address of an IP frame in b (NAT), updating
// the IPv4 header checksum and the transport checksum incrementally.
func (f *Frame) SetSrcIP(b []byte, a netip.Addr) error { return f.setIP(b, a, true) }

// SetDstIP rewrites the destination address, as SetSrcIP.
func (f *Frame) SetDstIP(b []byte, a netip.Addr) error { return f.setIP(b, a, false) }

func (f *Frame) setIP(b []byte, a netip.Addr, src bool) error {
	var field []byte
	var new []byte
	switch {
	case f.L3 == L3IPv4 && a.Is4():
		off := f.L3Off + 16
		if src {
			off = f.L3Off + 12
		}
		field = b[off : off+4]
		v := a.As4()
		new = v[:]
	case f.L3 == L3IPv6 && a.Is6() && !a.Is4In6():
		off := f.L3Off + 24
		if src {
			off = f.L3Off + 8
		}
		field = b[off : off+16]
		v := a.As16()
		new = v[:]
	default:
		return ErrAddressFamily
	}
	if f.L3 == L3IPv4 {
		c := f.L3Off + 10
		binary.BigEndian.PutUint16(b[c:], UpdateChecksum(binary.BigEndian.Uint16(b[c:]), field, new))
	}
	if off := f.l4CsumOff(b, true); off >= 0 {
		f.patchL4(b, off, field, new)
	}
	copy(field, new)
	if src {
		f.SrcIP = a
	} else {
		f.DstIP = a
	}
	return nil
}

// SetSrcPort rewrites the TCP or UDP source port, updating the checksum.
func (f *Frame) SetSrcPort(b []byte, p uint16) error { return f.setPort(b, p, 0) }

// SetDstPort rewrites the TCP or UDP destination port, updating the checksum.
func (f *Frame) SetDstPort(b []byte, p uint16) error { return f.setPort(b, p, 2) }

func (f *Frame) setPort(b []byte, p uint16, at int) error {
	if !f.HasL4 || (f.Proto != ProtoTCP && f.Proto != ProtoUDP) {
		return ErrNoL4
	}
	f.set16(b, f.L4Off+at, p)
	if at == 0 {
		f.SrcPort = p
	} else {
		f.DstPort = p
	}
	return nil
}

// SetEchoID rewrites the identifier of an ICMP or ICMPv6 echo (SNAT of
// pings, as OPTE keys ICMP flows on it), updating the checksum.
func (f *Frame) SetEchoID(b []byte, id uint16) error {
	if !f.IsEcho {
		return ErrNoL4
	}
	f.set16(b, f.L4Off+4, id)
	f.EchoID = id
	return nil
}

func (f *Frame) set16(b []byte, at int, v uint16) {
	var old, new [2]byte
	copy(old[:], b[at:at+2])
	binary.BigEndian.PutUint16(new[:], v)
	if off := f.l4CsumOff(b, false); off >= 0 {
		f.patchL4(b, off, old[:], new[:])
	}
	copy(b[at:at+2], new[:])
}
