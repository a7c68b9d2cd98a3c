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

// OPTE's own assertions of the outer UDP source port ("Geneve entropy") in
// lib/oxide-vpc/tests/integration_tests.rs, on the flows of
// opte-test-utils' http_syn (sport 44490, dport 80) as the overlay layer sees
// them: guest_to_guest (g1 172.30.0.5 to g2 172.30.0.6), and
// guest_to_internet_ipv4 and _ipv6 after SNAT to g1's external address and
// the last port of its range (EXT_IP4 10.77.77.13 port 4096; 2001:db8::1
// port 8192). The last two show the hash is taken after NAT.
func TestEntropyMatchesOPTEIntegrationTests(t *testing.T) {
	v := netip.MustParseAddr
	for _, c := range []struct {
		name string
		k    FlowKey
		want uint16
	}{
		{"guest_to_guest", FlowKey{Proto: ProtoTCP, Src: v("172.30.0.5"), Dst: v("172.30.0.6"), SrcPort: 44490, DstPort: 80}, 9655},
		{"guest_to_internet_ipv4", FlowKey{Proto: ProtoTCP, Src: v("10.77.77.13"), Dst: v("52.10.128.69"), SrcPort: 4096, DstPort: 80}, 1428},
		{"guest_to_internet_ipv6", FlowKey{Proto: ProtoTCP, Src: v("2001:db8::1"), Dst: v("2606:2800:220:1:248:1893:25c8:1946"), SrcPort: 8192, DstPort: 80}, 22425},
	} {
		if got := c.k.Entropy(); got != c.want {
			t.Errorf("%s: entropy %d, OPTE asserts %d", c.name, got, c.want)
		}
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
