package gateway

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// The port of OPTE's integration tests (opte-test-utils g1_cfg and
// base_dhcp_config): guest a8:40:25:fa:fa:37 with 172.30.0.5 and fd00::5,
// gateway 172.30.0.1, MTU 1500.
var (
	guestMAC = wire.MAC{0xa8, 0x40, 0x25, 0xfa, 0xfa, 0x37}
	priv4    = netip.MustParseAddr("172.30.0.5")
	gw4      = netip.MustParseAddr("172.30.0.1")
	priv6    = netip.MustParseAddr("fd00::5")
	gwLL     = netip.MustParseAddr("fe80::aa40:25ff:feff:7777")
	guestLL  = netip.MustParseAddr("fe80::aa40:25ff:fefa:fa37")
	otherMAC = wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x66}
)

func g1Config() Config {
	return Config{
		GuestMAC:   guestMAC,
		GatewayMAC: MAC,
		IPv4:       &IPv4Config{Private: priv4, Gateway: gw4},
		IPv6:       &IPv6Config{Private: priv6},
		DHCP: DHCP{
			Hostname:   MustDomainName("testbox"),
			HostDomain: MustDomainName("test.oxide.computer"),
			Search:     []DomainName{MustDomainName("oxide.computer")},
			DNS4:       []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("1.1.1.1")},
			DNS6: []netip.Addr{
				netip.MustParseAddr("2001:4860:4860::8888"), netip.MustParseAddr("2001:4860:4860::8844"),
				netip.MustParseAddr("2606:4700:4700::1111"), netip.MustParseAddr("2606:4700:4700::1001"),
			},
		},
		MTU: 1500,
	}
}

func newG1(t testing.TB, v2p V2P) *Gateway {
	t.Helper()
	g, err := New(g1Config(), v2p)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// unhex decodes hex with spaces, newlines and // comments.
func unhex(s string) []byte {
	var clean strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		panic(err)
	}
	return b
}

// csum is RFC 1071 over the concatenation of parts, written here apart from
// the wire package so that golden frames do not check the code with itself.
func csum(parts ...[]byte) uint16 {
	all := bytes.Join(parts, nil)
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var s uint32
	for i := 0; i < len(all); i += 2 {
		s += uint32(all[i])<<8 | uint32(all[i+1])
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func a16(a netip.Addr) []byte {
	v := a.As16()
	return v[:]
}
func a4(a netip.Addr) []byte {
	v := a.As4()
	return v[:]
}

// pseudo6 is the IPv6 pseudo-header (RFC 8200 §8.1).
func pseudo6(src, dst netip.Addr, next uint8, n int) []byte {
	return bytes.Join([][]byte{a16(src), a16(dst), be32(uint32(n)), {0, 0, 0, next}}, nil)
}

// withCsum puts the checksum of parts (the message's own bytes last) at off
// of the message and returns the message.
func withCsum(msg []byte, off int, pseudo []byte) []byte {
	binary.BigEndian.PutUint16(msg[off:], csum(pseudo, msg))
	return msg
}

// v4hdr is a 20-byte IPv4 header with its checksum.
func v4hdr(src, dst netip.Addr, proto uint8, payload int, ttl uint8) []byte {
	h := bytes.Join([][]byte{{0x45, 0}, be16(uint16(20 + payload)), {0, 0, 0, 0, ttl, proto, 0, 0}, a4(src), a4(dst)}, nil)
	binary.BigEndian.PutUint16(h[10:], csum(h))
	return h
}

func v6hdr(src, dst netip.Addr, next uint8, payload int, hop uint8) []byte {
	return bytes.Join([][]byte{{0x60, 0, 0, 0}, be16(uint16(payload)), {next, hop}, a16(src), a16(dst)}, nil)
}

func ethhdr(dst, src wire.MAC, typ uint16) []byte {
	return bytes.Join([][]byte{dst[:], src[:], be16(typ)}, nil)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// parse is wire.Parse, failing the test on an error.
func parse(t testing.TB, b []byte) *wire.Frame {
	t.Helper()
	var f wire.Frame
	if err := wire.Parse(b, &f); err != nil {
		t.Fatalf("wire.Parse: %v", err)
	}
	return &f
}

// out runs Outbound and returns the decision and the reply bytes.
func outbound(t testing.TB, g *Gateway, b []byte) (Decision, []byte) {
	t.Helper()
	buf := make([]byte, 2048)
	d := g.Outbound(b, parse(t, b), buf)
	return d, buf[:d.Len]
}

func wantReply(t *testing.T, d Decision, r Reason) {
	t.Helper()
	if d.Verdict != Reply || d.Reason != r {
		t.Fatalf("decision %v (%v), want reply (%v)", d.Verdict, d.Reason, r)
	}
}

func wantDrop(t *testing.T, d Decision, r Reason) {
	t.Helper()
	if d.Verdict != Drop || d.Reason != r {
		t.Fatalf("decision %v (%v), want drop (%v)", d.Verdict, d.Reason, r)
	}
}

func wantBytes(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("frame differs\n got %x\nwant %x", got, want)
	}
}

// icmpFrame4 builds an ICMP echo request as opte-test-utils gen_icmp_echo.
func echo4(srcMAC, dstMAC wire.MAC, src, dst netip.Addr, typ, code uint8, id, seq uint16, data []byte) []byte {
	icmp := cat([]byte{typ, code, 0, 0}, be16(id), be16(seq), data)
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeIPv4), v4hdr(src, dst, wire.ProtoICMP, len(icmp), 128), icmp)
}

// icmp6Frame builds an ICMPv6 message with its checksum.
func icmp6Frame(srcMAC, dstMAC wire.MAC, src, dst netip.Addr, hop uint8, msg []byte) []byte {
	msg = withCsum(append([]byte(nil), msg...), 2, pseudo6(src, dst, wire.ProtoICMPv6, len(msg)))
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeIPv6), v6hdr(src, dst, wire.ProtoICMPv6, len(msg), hop), msg)
}
