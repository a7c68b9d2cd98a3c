package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// The builders reproduce the golden inner frames byte for byte.
func TestBuildersReproduceGoldenInner(t *testing.T) {
	v := netip.MustParseAddr
	t.Run("icmp4", func(t *testing.T) {
		want := goldenInternalICMP[OuterLen+GeneveLen:]
		b := make([]byte, len(want))
		PutEthernet(b, guestB, guestA, EtherTypeIPv4)
		icmp := []byte{ICMPEchoRequest, 0, 0, 0, 0x12, 0x34, 0, 1, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
		if _, err := PutIPv4(b[EthernetLen:], v("172.30.0.5"), v("172.30.0.6"), ProtoICMP, len(icmp), 64, 0xbeef, true); err != nil {
			t.Fatal(err)
		}
		copy(b[EthernetLen+IPv4MinLen:], icmp)
		var f Frame
		if err := Parse(b, &f); err != nil {
			t.Fatal(err)
		}
		f.SetChecksums(b)
		if !bytes.Equal(b, want) {
			t.Errorf("got %x\nwant %x", b, want)
		}
	})
	t.Run("udp4", func(t *testing.T) {
		want := goldenSwitchUDP[OuterLen+GeneveLen+4:]
		b := make([]byte, len(want))
		PutEthernet(b, guestA, MAC{}, EtherTypeIPv4)
		payload := []byte{0xaa, 0xbb, 0xcc, 0xdd, 0xee}
		if _, err := PutIPv4(b[EthernetLen:], v("203.0.113.7"), v("198.51.100.10"), ProtoUDP, UDPLen+len(payload), 61, 0x5152, false); err != nil {
			t.Fatal(err)
		}
		if _, err := PutUDP(b[EthernetLen+IPv4MinLen:], 53, 16400, len(payload)); err != nil {
			t.Fatal(err)
		}
		copy(b[EthernetLen+IPv4MinLen+UDPLen:], payload)
		var f Frame
		if err := Parse(b, &f); err != nil {
			t.Fatal(err)
		}
		// SetChecksums leaves a zero UDP-over-IPv4 checksum ("none") alone.
		f.SetChecksums(b)
		c := L4Checksum(f.SrcIP, f.DstIP, ProtoUDP, b[f.L4Off:f.L4End])
		b[f.L4Off+6], b[f.L4Off+7] = byte(c>>8), byte(c)
		if !bytes.Equal(b, want) {
			t.Errorf("got %x\nwant %x", b, want)
		}
	})
	t.Run("udp6", func(t *testing.T) {
		want := ipv6Frame(ProtoUDP, []byte{0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0xac, 0xd5, 'h', 'e', 'l', 'l', 'o'})
		b := make([]byte, len(want))
		PutEthernet(b, guestB, guestA, EtherTypeIPv6)
		if _, err := PutIPv6(b[EthernetLen:], v("fd00:1::5"), v("fd00:1::6"), ProtoUDP, UDPLen+5, 64); err != nil {
			t.Fatal(err)
		}
		if _, err := PutUDP(b[EthernetLen+IPv6Len:], 5353, 53, 5); err != nil {
			t.Fatal(err)
		}
		copy(b[EthernetLen+IPv6Len+UDPLen:], "hello")
		var f Frame
		if err := Parse(b, &f); err != nil {
			t.Fatal(err)
		}
		f.SetChecksums(b)
		if !bytes.Equal(b, want) {
			t.Errorf("got %x\nwant %x", b, want)
		}
	})
}

func TestBuildersRefuse(t *testing.T) {
	v := netip.MustParseAddr
	b := make([]byte, 64)
	if _, err := PutIPv4(b, v("fd00::1"), v("10.0.0.1"), ProtoUDP, 0, 64, 0, false); !errors.Is(err, ErrAddressFamily) {
		t.Errorf("PutIPv4 v6: %v", err)
	}
	if _, err := PutIPv4(b[:19], v("10.0.0.2"), v("10.0.0.1"), ProtoUDP, 0, 64, 0, false); !errors.Is(err, ErrShortBuffer) {
		t.Errorf("PutIPv4 short: %v", err)
	}
	if _, err := PutIPv6(b, v("10.0.0.2"), v("fd00::1"), ProtoUDP, 0, 64); !errors.Is(err, ErrAddressFamily) {
		t.Errorf("PutIPv6 v4: %v", err)
	}
	if _, err := PutUDP(b, 1, 2, 0xffff); !errors.Is(err, ErrUDPLength) {
		t.Errorf("PutUDP long: %v", err)
	}
}
