package wire

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// ipv6Frame is an Ethernet frame carrying IPv6 from fd00:1::5 to fd00:1::6
// with next header nh and payload l4.
func ipv6Frame(nh uint8, l4 []byte) []byte {
	b := make([]byte, EthernetLen+IPv6Len, EthernetLen+IPv6Len+len(l4))
	PutEthernet(b, guestB, guestA, EtherTypeIPv6)
	ip := b[EthernetLen:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	ip[6], ip[7] = nh, 64
	s, d := netip.MustParseAddr("fd00:1::5").As16(), netip.MustParseAddr("fd00:1::6").As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(b, l4...)
}

func TestParseIPv6UDP(t *testing.T) {
	// checksum 0xacd5 computed independently (RFC 8200 §8.1 pseudo-header)
	b := ipv6Frame(ProtoUDP, []byte{0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0xac, 0xd5, 'h', 'e', 'l', 'l', 'o'})
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.L3 != L3IPv6 || f.Proto != ProtoUDP || f.SrcPort != 5353 || f.DstPort != 53 || f.TTL != 64 ||
		f.PayloadOff != EthernetLen+IPv6Len+UDPLen || f.End != len(b) || !f.L4ChecksumValid(b) {
		t.Errorf("%+v", f)
	}
	if got := f.FlowKey().Entropy(); got != 0x6c87 {
		t.Errorf("entropy %#x, want 0x6c87", got)
	}
}

func TestParseICMPv6(t *testing.T) {
	b := ipv6Frame(ProtoICMPv6, []byte{128, 0, 0xa6, 0xd1, 0, 7, 0, 1, 'p', 'i', 'n', 'g'})
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if !f.IsEcho || f.EchoID != 7 || f.EchoSeq != 1 || f.IsNDP() || !f.L4ChecksumValid(b) {
		t.Errorf("%+v", f)
	}
	if got := f.FlowKey().CRC32(); got != 0xf379149a {
		t.Errorf("crc32 %#x", got)
	}
	for typ := uint8(133); typ <= 136; typ++ {
		nd := ipv6Frame(ProtoICMPv6, []byte{typ, 0, 0, 0, 0, 0, 0, 0})
		if err := Parse(nd, &f); err != nil || !f.IsNDP() || f.IsEcho {
			t.Errorf("type %d: %v %+v", typ, err, f)
		}
	}
	// echo id only for code 0, as OPTE's echo_id
	b[EthernetLen+IPv6Len+1] = 1
	if err := Parse(b, &f); err != nil || f.IsEcho || f.FlowKey().EchoID != 0 {
		t.Errorf("echo with code 1: %v %+v", err, f)
	}
}

func TestParseIPv6ExtensionHeader(t *testing.T) {
	for _, nh := range []uint8{0, 43, 44, 60} {
		b := ipv6Frame(nh, make([]byte, 16))
		var f Frame
		if err := Parse(b, &f); err != nil || !f.IPv6Ext || f.HasL4 || f.Proto != nh {
			t.Errorf("next header %d: %v %+v", nh, err, f)
		}
	}
}

// ipv4Frame builds an IPv4 frame with the given options and flags/offset word.
func ipv4Frame(proto uint8, opts []byte, frag uint16, l4 []byte) []byte {
	hl := IPv4MinLen + len(opts)
	b := make([]byte, EthernetLen+hl+len(l4))
	PutEthernet(b, guestB, guestA, EtherTypeIPv4)
	ip := b[EthernetLen:]
	ip[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(l4)))
	binary.BigEndian.PutUint16(ip[6:], frag)
	ip[8], ip[9] = 64, proto
	copy(ip[12:], []byte{172, 30, 0, 5, 172, 30, 0, 6})
	copy(ip[20:], opts)
	copy(ip[hl:], l4)
	binary.BigEndian.PutUint16(ip[10:], IPv4HeaderChecksum(ip))
	return b
}

func TestParseIPv4OptionsAndFragments(t *testing.T) {
	udp := []byte{0x30, 0x39, 0x00, 0x35, 0x00, 0x0c, 0, 0, 1, 2, 3, 4}
	var f Frame
	b := ipv4Frame(ProtoUDP, []byte{0x94, 0x04, 0x00, 0x00}, 0x4000, udp) // router alert
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.IPv4HeaderLen != 24 || f.L4Off != EthernetLen+24 || f.SrcPort != 12345 || !f.DontFragment ||
		f.IsFragment() || !f.IPv4HeaderChecksumValid(b) || !f.L4ChecksumValid(b) {
		t.Errorf("options: %+v", f)
	}
	// first fragment: transport parsed, flagged
	if err := Parse(ipv4Frame(ProtoUDP, nil, 0x2000, append(udp[:4:4], 0, 0x40, 0, 0, 1, 2, 3, 4)), &f); err != nil ||
		!f.HasL4 || !f.MoreFragments || !f.IsFragment() {
		t.Errorf("first fragment: %v %+v", err, f)
	}
	// later fragment: no transport
	if err := Parse(ipv4Frame(ProtoUDP, nil, 0x0003, udp), &f); err != nil || f.HasL4 || f.FragOffset != 3 ||
		f.FlowKey().SrcPort != 0 {
		t.Errorf("later fragment: %v %+v", err, f)
	}
	// A UDP length short of the IP payload bounds the datagram (OPTE's
	// validate_udp accepts it); the checksum covers only the datagram.
	trailing := ipv6Frame(ProtoUDP, []byte{0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0xac, 0xd5, 'h', 'e', 'l', 'l', 'o', 0xee, 0xee})
	if err := Parse(trailing, &f); err != nil || f.L4End != f.End-2 || !f.L4ChecksumValid(trailing) {
		t.Errorf("UDP shorter than its IP payload: %v %+v", err, f)
	}
	// Ethernet padding after a short packet is not part of it
	short := append(ipv4Frame(ProtoUDP, nil, 0, udp), make([]byte, 6)...)
	if err := Parse(short, &f); err != nil || f.End != len(short)-6 {
		t.Errorf("padded: %v end %d", err, f.End)
	}
}

func TestParseTCP(t *testing.T) {
	var d Decap
	if err := DecapFrame(goldenInternalTCP, &d); err != nil {
		t.Fatal(err)
	}
	var f Frame
	if err := Parse(d.Inner(goldenInternalTCP), &f); err != nil {
		t.Fatal(err)
	}
	if f.TCPFlags != TCPSyn || f.TCPHeaderLen != 24 || f.PayloadOff != f.End || f.TTL != 64 {
		t.Errorf("%+v", f)
	}
}

func TestParseARP(t *testing.T) {
	a := ARP{Op: ARPRequest, SenderMAC: guestA, SenderIP: netip.MustParseAddr("172.30.0.5"),
		TargetIP: netip.MustParseAddr("172.30.0.1")}
	b := make([]byte, EthernetLen+ARPLen)
	PutEthernet(b, MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, guestA, EtherTypeARP)
	if err := PutARP(b[EthernetLen:], &a); err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 1, 8, 0, 6, 4, 0, 1, 0xa8, 0x40, 0x25, 0xf0, 0, 1, 172, 30, 0, 5, 0, 0, 0, 0, 0, 0, 172, 30, 0, 1}
	if string(b[EthernetLen:]) != string(want) {
		t.Errorf("PutARP %x", b[EthernetLen:])
	}
	var f Frame
	if err := Parse(b, &f); err != nil || f.L3 != L3ARP || f.ARP != a || !f.Dst.IsBroadcast() {
		t.Errorf("%v %+v", err, f)
	}
	if k := f.FlowKey(); k.Proto != 255 || k.Src != netip.IPv4Unspecified() || k.Entropy() != 0x01f4 {
		t.Errorf("non-IP flow key %+v", k)
	}
	b[EthernetLen+5] = 16 // IPv6 protocol length
	if err := Parse(b, &f); !errors.Is(err, ErrARPFormat) {
		t.Errorf("bad plen: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	tcp := goldenInternalTCP[OuterLen+16:]
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), tcp...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"vlan", mod(func(b []byte) { b[12], b[13] = 0x81, 0x00 }), ErrVLAN},
		{"qinq", mod(func(b []byte) { b[12], b[13] = 0x88, 0xa8 }), ErrVLAN},
		{"lldp", mod(func(b []byte) { b[12], b[13] = 0x88, 0xcc }), ErrEtherType},
		{"version", mod(func(b []byte) { b[14] = 0x65 }), ErrIPVersion},
		{"ihl", mod(func(b []byte) { b[14] = 0x44 }), ErrIPv4HeaderLen},
		{"total below header", mod(func(b []byte) { b[17] = 10 }), ErrIPLength},
		{"total past frame", mod(func(b []byte) { b[17] = 200 }), ErrTruncated},
		{"tcp offset", mod(func(b []byte) { b[46] = 0x40 }), ErrTCPHeaderLen},
		{"tcp offset past end", mod(func(b []byte) { b[46] = 0xf0 }), ErrTruncated},
		{"ipv6 short", ipv6Frame(ProtoUDP, nil)[:40], ErrTruncated},
		{"udp length past payload", ipv6Frame(ProtoUDP, []byte{0, 1, 0, 2, 0, 9, 0, 0}), ErrUDPLength},
		{"udp length below header", ipv6Frame(ProtoUDP, []byte{0, 1, 0, 2, 0, 7, 0, 0}), ErrUDPLength},
		{"icmp short", ipv6Frame(ProtoICMPv6, []byte{128, 0, 0, 0}), ErrTruncated},
	} {
		var f Frame
		if err := Parse(c.b, &f); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(goldenInternalTCP[OuterLen+16:])
	f.Add(goldenSwitchUDP[OuterLen+12:])
	f.Add(ipv6Frame(ProtoICMPv6, []byte{135, 0, 0, 0, 0, 0, 0, 0}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr Frame
		if Parse(b, &fr) != nil {
			return
		}
		if fr.End > len(b) || fr.L4Off > fr.End || fr.PayloadOff > fr.End || fr.L4End > fr.End || fr.PayloadOff > fr.L4End && fr.HasL4 {
			t.Fatalf("offsets past the frame: %+v (len %d)", fr, len(b))
		}
		if fr.HasL4 {
			fr.L4ChecksumValid(b) // must not panic
		}
	})
}

func TestMulticastMAC(t *testing.T) {
	for _, c := range []struct {
		a    string
		want MAC
		ok   bool
	}{
		{"224.129.2.3", MAC{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}, true},
		{"ff04::1:ff00:1234", MAC{0x33, 0x33, 0xff, 0x00, 0x12, 0x34}, true},
		{"172.30.0.5", MAC{}, false},
	} {
		m, ok := MulticastMAC(netip.MustParseAddr(c.a))
		if m != c.want || ok != c.ok || (ok && !m.IsMulticast()) {
			t.Errorf("%s: %v %v", c.a, m, ok)
		}
	}
}
