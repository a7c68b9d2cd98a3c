package wire

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// FlowKey is OPTE's InnerFlowId (opte lib/opte/src/api.rs): the protocol,
// the address pair and, for TCP and UDP, the ports, or for ICMP and ICMPv6
// the type, code and echo identifier (0 unless an echo with code 0). It is
// comparable, so it can key a map.
type FlowKey struct {
	Proto            uint8
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	ICMPType         uint8
	ICMPCode         uint8
	EchoID           uint16
}

// FlowKey returns the frame's flow key as OPTE builds it from a parsed
// packet (engine/packet.rs, From<&PacketData> for InnerFlowId). A frame
// with no IP layer gets protocol 255 and IPv4 0.0.0.0 addresses, as OPTE's
// FLOW_ID_DEFAULT. One difference: for an IPv6 packet with extension
// headers OPTE uses the transport after them; we refuse such packets, and
// the key carries the first extension header's number.
func (f *Frame) FlowKey() FlowKey {
	if f.L3 != L3IPv4 && f.L3 != L3IPv6 {
		return FlowKey{Proto: 255, Src: netip.IPv4Unspecified(), Dst: netip.IPv4Unspecified()}
	}
	k := FlowKey{Proto: f.Proto, Src: f.SrcIP, Dst: f.DstIP}
	if !f.HasL4 {
		return k
	}
	switch f.Proto {
	case ProtoTCP, ProtoUDP:
		k.SrcPort, k.DstPort = f.SrcPort, f.DstPort
	case ProtoICMP, ProtoICMPv6:
		k.ICMPType, k.ICMPCode = f.ICMPType, f.ICMPCode
		if f.IsEcho {
			k.EchoID = f.EchoID
		}
	}
	return k
}

// Mirror returns the key of the reverse direction: addresses and ports
// swapped, and an echo request turned into a reply and back (code 0 only),
// as InnerFlowId::mirror.
func (k FlowKey) Mirror() FlowKey {
	m := k
	m.Src, m.Dst = k.Dst, k.Src
	switch k.Proto {
	case ProtoTCP, ProtoUDP:
		m.SrcPort, m.DstPort = k.DstPort, k.SrcPort
	case ProtoICMP:
		if k.ICMPCode == 0 {
			m.ICMPType = swapEcho(k.ICMPType, ICMPEchoRequest, ICMPEchoReply)
		}
	case ProtoICMPv6:
		if k.ICMPCode == 0 {
			m.ICMPType = swapEcho(k.ICMPType, ICMPv6EchoRequest, ICMPv6EchoReply)
		}
	}
	return m
}

func swapEcho(t, req, rep uint8) uint8 {
	switch t {
	case req:
		return rep
	case rep:
		return req
	}
	return t
}

// illumos address family numbers, which OPTE hashes as AddrPair's
// discriminant (opte lib/opte/src/api.rs AF_INET, AF_INET6).
const (
	afINET  = 2
	afINET6 = 26
)

// CRC32 is OPTE's InnerFlowId::crc32: the IEEE CRC-32 (crc32fast) of the
// bytes Rust's derived Hash feeds for the key on a 64-bit little-endian
// host (illumos on x86-64):
//
//	proto                            1 byte
//	AddrPair discriminant (2 or 26)  u16, little-endian
//	src: length prefix (4 or 16)     u64, little-endian, then the address bytes
//	dst: the same
//	proto_info: length prefix (2)    u64, little-endian, then two u16 in host
//	                                 (little-endian) order: src and dst port,
//	                                 or the bytes type, code and the echo id
//
// The stream was checked against rustc's derive(Hash) on replicas of the
// structs, and the result reproduces the entropy OPTE's own integration
// tests assert (TestEntropyMatchesOPTEIntegrationTests).
func (k FlowKey) CRC32() uint32 {
	var buf [1 + 2 + 8 + 16 + 8 + 16 + 8 + 4]byte
	buf[0] = k.Proto
	n := 1
	if k.Src.Is4() {
		binary.LittleEndian.PutUint16(buf[n:], afINET)
		n += 2
		s, d := k.Src.As4(), k.Dst.As4()
		binary.LittleEndian.PutUint64(buf[n:], 4)
		n += 8
		n += copy(buf[n:], s[:])
		binary.LittleEndian.PutUint64(buf[n:], 4)
		n += 8
		n += copy(buf[n:], d[:])
	} else {
		binary.LittleEndian.PutUint16(buf[n:], afINET6)
		n += 2
		s, d := k.Src.As16(), k.Dst.As16()
		binary.LittleEndian.PutUint64(buf[n:], 16)
		n += 8
		n += copy(buf[n:], s[:])
		binary.LittleEndian.PutUint64(buf[n:], 16)
		n += 8
		n += copy(buf[n:], d[:])
	}
	binary.LittleEndian.PutUint64(buf[n:], 2)
	n += 8
	switch k.Proto {
	case ProtoTCP, ProtoUDP:
		binary.LittleEndian.PutUint16(buf[n:], k.SrcPort)
		binary.LittleEndian.PutUint16(buf[n+2:], k.DstPort)
	case ProtoICMP, ProtoICMPv6:
		buf[n], buf[n+1] = k.ICMPType, k.ICMPCode
		binary.LittleEndian.PutUint16(buf[n+2:], k.EchoID)
	}
	n += 4
	return crc32IEEE(buf[:n])
}

// crc32IEEE is crc32.ChecksumIEEE byte at a time over crc32.IEEETable: for
// these 39 or 63 bytes it is faster than the library's dispatch, and its
// argument does not escape (the library's does, costing an allocation).
func crc32IEEE(b []byte) uint32 {
	c := ^uint32(0)
	for _, x := range b {
		c = crc32.IEEETable[byte(c)^x] ^ c>>8
	}
	return ^c
}

// Entropy is the outer UDP source port OPTE puts on a flow's encapsulated
// packets: the low 16 bits of CRC32 (oxide-vpc engine/overlay.rs,
// GenevePush { entropy: flow_id.crc32() as u16 }). OPTE hashes the flow as
// the overlay layer sees it, after the NAT layer's rewrites.
func (k FlowKey) Entropy() uint16 { return uint16(k.CRC32()) }
