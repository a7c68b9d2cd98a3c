package wire

import (
	"encoding/binary"
	"net/netip"
)

// PutIPv4 writes a 20-byte IPv4 header (no options) for a payload of
// payloadLen bytes into b, checksum included, and returns 20. The data
// path uses it for the replies it makes itself (gateway ICMP, DHCP).
func PutIPv4(b []byte, src, dst netip.Addr, proto uint8, payloadLen int, ttl uint8, id uint16, dontFragment bool) (int, error) {
	if !src.Is4() || !dst.Is4() {
		return 0, ErrAddressFamily
	}
	if len(b) < IPv4MinLen {
		return 0, ErrShortBuffer
	}
	if IPv4MinLen+payloadLen > 0xffff {
		return 0, ErrIPLength
	}
	b[0], b[1] = 0x45, 0
	binary.BigEndian.PutUint16(b[2:4], uint16(IPv4MinLen+payloadLen))
	binary.BigEndian.PutUint16(b[4:6], id)
	var ff uint16
	if dontFragment {
		ff = 0x4000
	}
	binary.BigEndian.PutUint16(b[6:8], ff)
	b[8], b[9] = ttl, proto
	b[10], b[11] = 0, 0
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:12], IPv4HeaderChecksum(b))
	return IPv4MinLen, nil
}

// PutIPv6 writes a 40-byte IPv6 header (traffic class and flow label 0)
// into b and returns 40.
func PutIPv6(b []byte, src, dst netip.Addr, next uint8, payloadLen int, hopLimit uint8) (int, error) {
	if !src.Is6() || !dst.Is6() || src.Is4In6() || dst.Is4In6() {
		return 0, ErrAddressFamily
	}
	if len(b) < IPv6Len {
		return 0, ErrShortBuffer
	}
	if payloadLen > 0xffff {
		return 0, ErrIPLength
	}
	b[0], b[1], b[2], b[3] = 0x60, 0, 0, 0
	binary.BigEndian.PutUint16(b[4:6], uint16(payloadLen))
	b[6], b[7] = next, hopLimit
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return IPv6Len, nil
}

// PutUDP writes a UDP header for a payload of payloadLen bytes into b with
// checksum 0, and returns 8. Frame.SetChecksums (or L4Checksum) fills the
// checksum once the payload is in place.
func PutUDP(b []byte, srcPort, dstPort uint16, payloadLen int) (int, error) {
	if len(b) < UDPLen {
		return 0, ErrShortBuffer
	}
	if UDPLen+payloadLen > 0xffff {
		return 0, ErrUDPLength
	}
	binary.BigEndian.PutUint16(b[0:2], srcPort)
	binary.BigEndian.PutUint16(b[2:4], dstPort)
	binary.BigEndian.PutUint16(b[4:6], uint16(UDPLen+payloadLen))
	b[6], b[7] = 0, 0
	return UDPLen, nil
}
