package wire

import (
	"hash/crc32"
	"net/netip"
	"testing"
)

// Values computed outside this package: rustc's derive(Hash) on replicas of
// opte's InnerFlowId, AddrPair, Ipv4Addr and Ipv6Addr (lib/opte/src/api.rs,
// crates/opte-api/src/ip.rs), fed to a bitwise IEEE CRC-32 (crc32fast's
// polynomial), on x86-64.
func TestFlowHashMatchesOPTE(t *testing.T) {
	v := netip.MustParseAddr
	for _, c := range []struct {
		k   FlowKey
		crc uint32
	}{
		{FlowKey{Proto: ProtoTCP, Src: v("172.30.0.5"), Dst: v("172.30.0.6"), SrcPort: 49152, DstPort: 22}, 0x703b9b25},
		{FlowKey{Proto: ProtoICMP, Src: v("172.30.0.5"), Dst: v("172.30.0.6"), ICMPType: 8, EchoID: 0x1234}, 0x42e526fc},
		{FlowKey{Proto: ProtoTCP, Src: v("198.51.100.10"), Dst: v("203.0.113.7"), SrcPort: 16384, DstPort: 443}, 0x9d9d23ac},
		{FlowKey{Proto: ProtoUDP, Src: v("fd00:1::5"), Dst: v("fd00:1::6"), SrcPort: 5353, DstPort: 53}, 0x4c166c87},
		{FlowKey{Proto: ProtoICMPv6, Src: v("fd00:1::5"), Dst: v("fd00:1::6"), ICMPType: 128, EchoID: 7}, 0xf379149a},
		{FlowKey{Proto: 255, Src: netip.IPv4Unspecified(), Dst: netip.IPv4Unspecified()}, 0x0a2f01f4},
	} {
		if got := c.k.CRC32(); got != c.crc {
			t.Errorf("%+v: crc32 %#08x, want %#08x", c.k, got, c.crc)
		}
		if got := c.k.Entropy(); got != uint16(c.crc) {
			t.Errorf("%+v: entropy %#x", c.k, got)
		}
	}
}

func TestFlowKeyMirror(t *testing.T) {
	v := netip.MustParseAddr
	k := FlowKey{Proto: ProtoTCP, Src: v("10.0.0.1"), Dst: v("10.0.0.2"), SrcPort: 1, DstPort: 2}
	if m := k.Mirror(); m.Src != k.Dst || m.SrcPort != 2 || m.DstPort != 1 || m.Mirror() != k {
		t.Errorf("%+v", m)
	}
	e := FlowKey{Proto: ProtoICMP, Src: v("10.0.0.1"), Dst: v("10.0.0.2"), ICMPType: ICMPEchoRequest, EchoID: 9}
	if m := e.Mirror(); m.ICMPType != ICMPEchoReply || m.EchoID != 9 || m.Mirror() != e {
		t.Errorf("%+v", m)
	}
	e6 := FlowKey{Proto: ProtoICMPv6, Src: v("fd00::1"), Dst: v("fd00::2"), ICMPType: ICMPv6EchoReply}
	if m := e6.Mirror(); m.ICMPType != ICMPv6EchoRequest {
		t.Errorf("%+v", m)
	}
	u := FlowKey{Proto: ProtoICMP, Src: v("10.0.0.1"), Dst: v("10.0.0.2"), ICMPType: 3, ICMPCode: 1}
	if m := u.Mirror(); m.ICMPType != 3 {
		t.Errorf("%+v", m)
	}
}

func TestCRC32IEEEMatchesLibrary(t *testing.T) {
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	for n := 0; n <= len(b); n++ {
		if got, want := crc32IEEE(b[:n]), crc32.ChecksumIEEE(b[:n]); got != want {
			t.Fatalf("%d bytes: %#x, want %#x", n, got, want)
		}
	}
}
