package wire

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestChecksumRFC1071Example(t *testing.T) {
	// RFC 1071 §3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2 (before complement).
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := ^Fold(Sum(b, 0)); got != 0xddf2 {
		t.Errorf("sum %#x, want 0xddf2", got)
	}
	// Split at an even boundary, the running sum is the same.
	if got := ^Fold(Sum(b[4:], Sum(b[:4], 0))); got != 0xddf2 {
		t.Errorf("split sum %#x", got)
	}
	// Odd tail is padded with zero.
	if got := ^Fold(Sum([]byte{0x12, 0x34, 0x56}, 0)); got != 0x1234+0x5600 {
		t.Errorf("odd sum %#x", got)
	}
}

func TestUpdateChecksum16RFC1624(t *testing.T) {
	// RFC 1624 §4's example: HC 0xdd2f, m 0x5555 -> m' 0x3285 gives 0x0000,
	// not eqn. 2's -0 0xffff.
	if got := UpdateChecksum16(0xdd2f, 0x5555, 0x3285); got != 0x0000 {
		t.Errorf("got %#x, want 0x0000", got)
	}
}

// natCase rewrites one field of a parsed frame; the incremental result must
// equal a full recomputation.
type natCase struct {
	name string
	do   func(f *Frame, b []byte, r *rand.Rand) error
}

var natCases = []natCase{
	{"src ip", func(f *Frame, b []byte, r *rand.Rand) error { return f.SetSrcIP(b, randAddr(r, f.SrcIP.Is4())) }},
	{"dst ip", func(f *Frame, b []byte, r *rand.Rand) error { return f.SetDstIP(b, randAddr(r, f.DstIP.Is4())) }},
	{"src port", func(f *Frame, b []byte, r *rand.Rand) error { return f.SetSrcPort(b, uint16(r.Uint32())) }},
	{"dst port", func(f *Frame, b []byte, r *rand.Rand) error { return f.SetDstPort(b, uint16(r.Uint32())) }},
	{"echo id", func(f *Frame, b []byte, r *rand.Rand) error { return f.SetEchoID(b, uint16(r.Uint32())) }},
}

func randAddr(r *rand.Rand, v4 bool) netip.Addr {
	if v4 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], r.Uint32())
		return netip.AddrFrom4(a)
	}
	var a [16]byte
	binary.BigEndian.PutUint64(a[:], r.Uint64())
	binary.BigEndian.PutUint64(a[8:], r.Uint64())
	a[0] = 0xfd
	return netip.AddrFrom16(a)
}

func innerFrames(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{
		"udp6":  ipv6Frame(ProtoUDP, []byte{0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0xac, 0xd5, 'h', 'e', 'l', 'l', 'o'}),
		"icmp6": ipv6Frame(ProtoICMPv6, []byte{128, 0, 0xa6, 0xd1, 0, 7, 0, 1, 'p', 'i', 'n', 'g'}),
	}
	for name, g := range map[string][]byte{"tcp4": goldenInternalTCP, "icmp4": goldenInternalICMP, "udp4": goldenSwitchUDP} {
		var d Decap
		if err := DecapFrame(g, &d); err != nil {
			t.Fatal(err)
		}
		out[name] = append([]byte(nil), d.Inner(g)...)
	}
	return out
}

func TestNATRewritesMatchRecompute(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for name, orig := range innerFrames(t) {
		for _, c := range natCases {
			for i := 0; i < 200; i++ {
				b := append([]byte(nil), orig...)
				var f Frame
				if err := Parse(b, &f); err != nil {
					t.Fatal(err)
				}
				if err := c.do(&f, b, r); err != nil {
					continue // not applicable: ports on ICMP, echo id on TCP
				}
				var g Frame
				if err := Parse(b, &g); err != nil {
					t.Fatal(err)
				}
				if g.FlowKey() != f.FlowKey() {
					t.Fatalf("%s %s: frame says %+v, bytes say %+v", name, c.name, f.FlowKey(), g.FlowKey())
				}
				want := append([]byte(nil), b...)
				g.SetChecksums(want)
				if !bytes.Equal(b, want) {
					t.Fatalf("%s %s: incremental\n%x\nrecomputed\n%x", name, c.name, b, want)
				}
				if g.L3 == L3IPv4 && !g.IPv4HeaderChecksumValid(b) || !g.L4ChecksumValid(b) {
					t.Fatalf("%s %s: checksums do not verify", name, c.name)
				}
			}
		}
	}
}

func TestNATRewriteRefusals(t *testing.T) {
	b := innerFrames(t)["icmp4"]
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if err := f.SetSrcPort(b, 1); err != ErrNoL4 {
		t.Errorf("port on ICMP: %v", err)
	}
	if err := f.SetSrcIP(b, netip.MustParseAddr("fd00::1")); err != ErrAddressFamily {
		t.Errorf("IPv6 into IPv4: %v", err)
	}
	b = innerFrames(t)["tcp4"]
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if err := f.SetEchoID(b, 1); err != ErrNoL4 {
		t.Errorf("echo id on TCP: %v", err)
	}
}

func TestNATKeepsZeroUDPChecksum(t *testing.T) {
	udp := []byte{0x30, 0x39, 0x00, 0x35, 0x00, 0x0c, 0, 0, 1, 2, 3, 4}
	b := ipv4Frame(ProtoUDP, nil, 0, udp)
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if err := f.SetSrcIP(b, netip.MustParseAddr("198.51.100.10")); err != nil {
		t.Fatal(err)
	}
	if err := f.SetSrcPort(b, 40000); err != nil {
		t.Fatal(err)
	}
	if c := binary.BigEndian.Uint16(b[f.L4Off+6:]); c != 0 || !f.IPv4HeaderChecksumValid(b) {
		t.Errorf("UDP checksum %#x, want 0 (none); header valid %v", c, f.IPv4HeaderChecksumValid(b))
	}
}

func TestNATLaterFragmentUpdatesOnlyIPv4Header(t *testing.T) {
	body := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	b := ipv4Frame(ProtoTCP, nil, 0x0002, body)
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if err := f.SetDstIP(b, netip.MustParseAddr("10.1.2.3")); err != nil {
		t.Fatal(err)
	}
	if !f.IPv4HeaderChecksumValid(b) || !bytes.Equal(b[len(b)-8:], body) {
		t.Errorf("later fragment rewrite: %x", b)
	}
}
