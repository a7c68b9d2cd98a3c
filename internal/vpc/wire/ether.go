package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// MAC is an Ethernet address.
type MAC [6]byte

// String formats m as a8:40:25:f0:00:01.
func (m MAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }

// IsMulticast reports whether m has the group bit set (broadcast included).
func (m MAC) IsMulticast() bool { return m[0]&1 == 1 }

// Ethertypes and sizes of the headers this package handles.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86dd
	// EtherTypeVLAN (802.1Q), QinQ (802.1ad) and the old QinQ value are
	// refused: a VPC port is untagged, and OPTE's parser (engine/parse.rs)
	// knows no VLAN header, so a tagged frame has no L3 for it.
	EtherTypeVLAN   = 0x8100
	EtherTypeQinQ   = 0x88a8
	EtherTypeQinQv1 = 0x9100

	EthernetLen = 14
	ARPLen      = 28
)

// PutEthernet writes an Ethernet II header into b[:14].
func PutEthernet(b []byte, dst, src MAC, etherType uint16) {
	_ = b[EthernetLen-1]
	copy(b[0:6], dst[:])
	copy(b[6:12], src[:])
	binary.BigEndian.PutUint16(b[12:14], etherType)
}

// ARP operations.
const (
	ARPRequest = 1
	ARPReply   = 2
)

// ARP is an ARP packet for IPv4 over Ethernet (htype 1, ptype 0x0800,
// hlen 6, plen 4), the only kind a VPC port sees.
type ARP struct {
	Op        uint16
	SenderMAC MAC
	SenderIP  netip.Addr
	TargetMAC MAC
	TargetIP  netip.Addr
}

func parseARP(b []byte, a *ARP) error {
	if len(b) < ARPLen {
		return ErrTruncated
	}
	if binary.BigEndian.Uint16(b[0:2]) != 1 || binary.BigEndian.Uint16(b[2:4]) != EtherTypeIPv4 ||
		b[4] != 6 || b[5] != 4 {
		return ErrARPFormat
	}
	a.Op = binary.BigEndian.Uint16(b[6:8])
	copy(a.SenderMAC[:], b[8:14])
	a.SenderIP = netip.AddrFrom4([4]byte(b[14:18]))
	copy(a.TargetMAC[:], b[18:24])
	a.TargetIP = netip.AddrFrom4([4]byte(b[24:28]))
	return nil
}

// PutARP writes a into b[:28]. Both addresses must be IPv4.
func PutARP(b []byte, a *ARP) error {
	if len(b) < ARPLen {
		return ErrShortBuffer
	}
	if !a.SenderIP.Is4() || !a.TargetIP.Is4() {
		return ErrAddressFamily
	}
	binary.BigEndian.PutUint16(b[0:2], 1)
	binary.BigEndian.PutUint16(b[2:4], EtherTypeIPv4)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], a.Op)
	copy(b[8:14], a.SenderMAC[:])
	s, t := a.SenderIP.As4(), a.TargetIP.As4()
	copy(b[14:18], s[:])
	copy(b[18:24], a.TargetMAC[:])
	copy(b[24:28], t[:])
	return nil
}

// MulticastMAC is the Ethernet group address of an IP multicast address:
// 01:00:5e and the low 23 bits for IPv4 (RFC 1112), 33:33 and the low 32
// bits for IPv6 (RFC 2464), as OPTE's multicast_mac. ok is false for a
// unicast address.
func MulticastMAC(a netip.Addr) (m MAC, ok bool) {
	if !a.IsMulticast() {
		return MAC{}, false
	}
	if a.Is4() {
		v := a.As4()
		return MAC{0x01, 0x00, 0x5e, v[1] & 0x7f, v[2], v[3]}, true
	}
	v := a.As16()
	return MAC{0x33, 0x33, v[12], v[13], v[14], v[15]}, true
}
