package gateway

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

func udp4(srcMAC, dstMAC wire.MAC, src, dst netip.Addr) []byte {
	udp := cat(be16(40000), be16(53), be16(12), []byte{0, 0, 'a', 'b', 'c', 'd'})
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeIPv4), v4hdr(src, dst, wire.ProtoUDP, len(udp), 64), udp)
}

func udp6(srcMAC, dstMAC wire.MAC, src, dst netip.Addr) []byte {
	udp := cat(be16(40000), be16(53), be16(12), []byte{0, 0, 'a', 'b', 'c', 'd'})
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeIPv6), v6hdr(src, dst, wire.ProtoUDP, len(udp), 64), udp)
}

func withExceptions() Config {
	c := g1Config()
	c.IPv4.Transit = []Transit{
		{Prefix: netip.MustParsePrefix("10.9.0.0/16"), In: true, Out: true},
		{Prefix: netip.MustParsePrefix("10.8.0.0/16"), In: true},
		{Prefix: netip.MustParsePrefix("10.7.0.0/16"), Out: true},
	}
	c.IPv4.Attached = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	c.IPv6.Transit = []Transit{{Prefix: netip.MustParsePrefix("fd99::/64"), In: true, Out: true}}
	c.IPv6.Attached = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}
	return c
}

func TestOutboundAntiSpoof(t *testing.T) {
	var v2p mappings.V2P
	peer4, peer6 := netip.MustParseAddr("172.30.0.6"), netip.MustParseAddr("fd00::6")
	for _, a := range []netip.Addr{peer4, peer6} {
		if _, err := v2p.Set(1287581, a, mappings.Phys{MAC: otherMAC, Sled: netip.MustParseAddr("fd00:f7:101::1")}); err != nil {
			t.Fatal(err)
		}
	}
	g, err := New(withExceptions(), &v2p)
	if err != nil {
		t.Fatal(err)
	}
	ext4, ext6 := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8:99::1")
	for _, tc := range []struct {
		name    string
		b       []byte
		verdict Verdict
		reason  Reason
		vni     uint32
		tagged  bool
	}{
		{"v4 to a peer", udp4(guestMAC, MAC, priv4, peer4), Continue, ReasonGuest, 1287581, true},
		{"v4 outside the VPCs", udp4(guestMAC, MAC, priv4, ext4), Continue, ReasonGuest, 0, false},
		{"v4 multicast", udp4(guestMAC, mcastMAC(netip.MustParseAddr("239.1.1.1")), priv4, netip.MustParseAddr("239.1.1.1")), Continue, ReasonGuest, 0, false},
		{"v6 to a peer", udp6(guestMAC, MAC, priv6, peer6), Continue, ReasonGuest, 1287581, true},
		{"v6 outside", udp6(guestMAC, MAC, priv6, ext6), Continue, ReasonGuest, 0, false},
		{"v4 from transit both ways", udp4(guestMAC, MAC, netip.MustParseAddr("10.9.1.1"), peer4), Continue, ReasonTransit, 1287581, true},
		{"v4 from transit out", udp4(guestMAC, MAC, netip.MustParseAddr("10.7.1.1"), ext4), Continue, ReasonTransit, 0, false},
		{"v4 from transit in only", udp4(guestMAC, MAC, netip.MustParseAddr("10.8.1.1"), ext4), Drop, ReasonSpoofed, 0, false},
		{"v4 from an attached subnet", udp4(guestMAC, MAC, netip.MustParseAddr("192.0.2.9"), ext4), Continue, ReasonTransit, 0, false},
		{"v6 from transit", udp6(guestMAC, MAC, netip.MustParseAddr("fd99::7"), ext6), Continue, ReasonTransit, 0, false},
		{"v6 from an attached subnet", udp6(guestMAC, MAC, netip.MustParseAddr("2001:db8:1::7"), peer6), Continue, ReasonTransit, 1287581, true},
		{"v4 from another address", udp4(guestMAC, MAC, peer4, ext4), Drop, ReasonSpoofed, 0, false},
		{"v4 from another MAC", udp4(otherMAC, MAC, priv4, ext4), Drop, ReasonSpoofed, 0, false},
		{"v4 transit from another MAC", udp4(otherMAC, MAC, netip.MustParseAddr("10.9.1.1"), ext4), Drop, ReasonSpoofed, 0, false},
		{"v6 from another address", udp6(guestMAC, MAC, peer6, ext6), Drop, ReasonSpoofed, 0, false},
		{"v6 from the link-local address", udp6(guestMAC, MAC, guestLL, ext6), Drop, ReasonSpoofed, 0, false},
		{"v6 from another MAC", udp6(otherMAC, MAC, priv6, ext6), Drop, ReasonSpoofed, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := outbound(t, g, tc.b)
			if d.Verdict != tc.verdict || d.Reason != tc.reason || d.VNI != tc.vni || d.HasVNI != tc.tagged {
				t.Fatalf("got %v %v vni %d/%v, want %v %v vni %d/%v", d.Verdict, d.Reason, d.VNI, d.HasVNI,
					tc.verdict, tc.reason, tc.vni, tc.tagged)
			}
		})
	}
	if vni, ok := g.VNITag(peer4); !ok || vni != 1287581 {
		t.Fatalf("VNITag %d %v", vni, ok)
	}
	// Without mappings, nothing is tagged.
	g0 := newG1(t, nil)
	if d, _ := outbound(t, g0, udp4(guestMAC, MAC, priv4, peer4)); d.Verdict != Continue || d.HasVNI {
		t.Fatalf("got %+v", d)
	}
}

func TestOutboundFamilies(t *testing.T) {
	c4, c6 := g1Config(), g1Config()
	c4.IPv6, c6.IPv4 = nil, nil
	g4, err := New(c4, nil)
	if err != nil {
		t.Fatal(err)
	}
	g6, err := New(c6, nil)
	if err != nil {
		t.Fatal(err)
	}
	ext4, ext6 := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8:99::1")
	d, _ := outbound(t, g4, udp6(guestMAC, MAC, priv6, ext6))
	wantDrop(t, d, ReasonSpoofed)
	d, _ = outbound(t, g6, udp4(guestMAC, MAC, priv4, ext4))
	wantDrop(t, d, ReasonSpoofed)
	// No echo, DHCP or DHCPv6 answered for a family the port lacks.
	d, _ = outbound(t, g6, discover(dhcpDiscover, 0))
	wantDrop(t, d, ReasonSpoofed)
	d, _ = outbound(t, g4, dhcpv6Frame(guestLL, testSolicitPacket[62:]))
	wantDrop(t, d, ReasonSpoofed)
}

func TestIPv6ExtensionHeadersDropped(t *testing.T) {
	g := newG1(t, nil)
	b := udp6(guestMAC, MAC, priv6, netip.MustParseAddr("fd00::6"))
	// Turn it into hop-by-hop options (8 bytes of padding) in front of UDP.
	hbh := []byte{wire.ProtoUDP, 0, 1, 4, 0, 0, 0, 0}
	b = cat(b[:54], hbh, b[54:])
	b[14+6] = 0
	b[14+5] += 8
	d, _ := outbound(t, g, b)
	wantDrop(t, d, ReasonIPv6ExtHeaders)
	copy(b[0:6], guestMAC[:])
	copy(b[6:12], otherMAC[:])
	b[14+24+15] = 5
	wantDrop(t, g.Inbound(b, parse(t, b)), ReasonIPv6ExtHeaders)
}

func TestInbound(t *testing.T) {
	g, err := New(withExceptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	peer4, peer6 := netip.MustParseAddr("172.30.0.6"), netip.MustParseAddr("fd00::6")
	g4m, g6m := netip.MustParseAddr("239.1.1.1"), netip.MustParseAddr("ff15::1")
	for _, tc := range []struct {
		name    string
		b       []byte
		verdict Verdict
		reason  Reason
	}{
		{"v4 to the guest", udp4(otherMAC, guestMAC, peer4, priv4), Continue, ReasonGuest},
		{"v6 to the guest", udp6(otherMAC, guestMAC, peer6, priv6), Continue, ReasonGuest},
		{"v4 to transit in", udp4(otherMAC, guestMAC, peer4, netip.MustParseAddr("10.8.0.1")), Continue, ReasonTransit},
		{"v4 to transit out only", udp4(otherMAC, guestMAC, peer4, netip.MustParseAddr("10.7.0.1")), Drop, ReasonNotForGuest},
		{"v4 to an attached subnet", udp4(otherMAC, guestMAC, peer4, netip.MustParseAddr("192.0.2.1")), Continue, ReasonTransit},
		{"v6 to an attached subnet", udp6(otherMAC, guestMAC, peer6, netip.MustParseAddr("2001:db8:1::1")), Continue, ReasonTransit},
		{"v4 multicast", udp4(otherMAC, mcastMAC(g4m), peer4, g4m), Continue, ReasonMulticast},
		{"v6 multicast", udp6(otherMAC, mcastMAC(g6m), peer6, g6m), Continue, ReasonMulticast},
		{"v4 multicast to a unicast MAC", udp4(otherMAC, guestMAC, peer4, g4m), Drop, ReasonNotForGuest},
		{"v4 to another MAC", udp4(otherMAC, otherMAC, peer4, priv4), Drop, ReasonNotForGuest},
		{"v4 to another address", udp4(otherMAC, guestMAC, peer4, peer4), Drop, ReasonNotForGuest},
		{"v6 to another MAC", udp6(otherMAC, MAC, peer6, priv6), Drop, ReasonNotForGuest},
		{"v6 to the link-local", udp6(otherMAC, guestMAC, peer6, guestLL), Drop, ReasonNotForGuest},
		{"v4 transit to another MAC", udp4(otherMAC, otherMAC, peer4, netip.MustParseAddr("10.8.0.1")), Drop, ReasonNotForGuest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), tc.b...)
			d := g.Inbound(b, parse(t, b))
			if d.Verdict != tc.verdict || d.Reason != tc.reason {
				t.Fatalf("got %v %v, want %v %v", d.Verdict, d.Reason, tc.verdict, tc.reason)
			}
			d.Rewrite(b)
			want := append([]byte(nil), tc.b...)
			if d.Verdict == Continue {
				// Only the source MAC changes, to the gateway's.
				copy(want[6:12], MAC[:])
			}
			wantBytes(t, b, want)
		})
	}
}

func TestConfig(t *testing.T) {
	if got := LinkLocal(MAC); got != netip.MustParseAddr("fe80::aa40:25ff:feff:7777") {
		t.Fatalf("gateway link-local %v", got)
	}
	if got := FirstHost(netip.MustParsePrefix("172.30.0.0/22")); got != gw4 {
		t.Fatalf("first host %v", got)
	}
	if got := SolicitedNode(gwLL); got != netip.MustParseAddr("ff02::1:ffff:7777") {
		t.Fatalf("solicited node %v", got)
	}
	for name, mod := range map[string]func(*Config){
		"zero guest MAC":         func(c *Config) { c.GuestMAC = wire.MAC{} },
		"multicast guest MAC":    func(c *Config) { c.GuestMAC[0] |= 1 },
		"gateway MAC = guest's":  func(c *Config) { c.GatewayMAC = c.GuestMAC },
		"no IP":                  func(c *Config) { c.IPv4, c.IPv6 = nil, nil },
		"MTU 0":                  func(c *Config) { c.MTU = 0 },
		"v6 private in IPv4":     func(c *Config) { c.IPv4.Private = priv6 },
		"no v4 gateway":          func(c *Config) { c.IPv4.Gateway = netip.Addr{} },
		"private is the gateway": func(c *Config) { c.IPv4.Private = gw4 },
		"v4 private in IPv6":     func(c *Config) { c.IPv6.Private = priv4 },
		"v6 transit in IPv4": func(c *Config) {
			c.IPv4.Transit = []Transit{{Prefix: netip.MustParsePrefix("fd00::/64"), In: true}}
		},
		"v4 attached in IPv6": func(c *Config) { c.IPv6.Attached = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} },
		"v6 DNS4":             func(c *Config) { c.DHCP.DNS4 = []netip.Addr{priv6} },
		"v4 DNS6":             func(c *Config) { c.DHCP.DNS6 = []netip.Addr{priv4} },
	} {
		t.Run(name, func(t *testing.T) {
			c := g1Config()
			mod(&c)
			if _, err := New(c, nil); !errors.Is(err, ErrConfig) {
				t.Fatalf("New: %v, want ErrConfig", err)
			}
		})
	}
}

func TestNewDHCP(t *testing.T) {
	// As the sled agent builds it from local_config (omicron's
	// InstanceSledLocalConfig: hostname, dhcp_config).
	dom := "test.oxide.computer"
	d, err := NewDHCP("testbox", &dom, []string{"oxide.computer"}, []netip.Addr{
		netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2001:4860:4860::8888"), netip.MustParseAddr("::ffff:1.1.1.1")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Hostname.String() != "testbox" || d.HostDomain.String() != dom || len(d.Search) != 1 ||
		len(d.DNS4) != 2 || d.DNS4[1] != netip.MustParseAddr("1.1.1.1") || len(d.DNS6) != 1 {
		t.Fatalf("%+v", d)
	}
	d, err = NewDHCP("h", nil, nil, nil)
	if err != nil || !d.HostDomain.IsZero() {
		t.Fatalf("%+v %v", d, err)
	}
	bad := "bad..name"
	for _, f := range []func() error{
		func() error { _, err := NewDHCP("", nil, nil, nil); return err },
		func() error { _, err := NewDHCP("h", &bad, nil, nil); return err },
		func() error { _, err := NewDHCP("h", nil, []string{".x"}, nil); return err },
		func() error { _, err := NewDHCP("h", nil, nil, []netip.Addr{{}}); return err },
	} {
		if err := f(); err == nil {
			t.Fatal("accepted")
		}
	}
}

func TestParseDomainName(t *testing.T) {
	for s, enc := range map[string]string{
		"quuz.bar.com":  "047175757a0362617203636f6d00",
		"quuz.bar.com.": "047175757a0362617203636f6d00",
		"a":             "016100",
	} {
		n, err := ParseDomainName(s)
		if err != nil || n.String() != s || string(n.Encoded()) != string(unhex(enc)) {
			t.Errorf("%q: %x %v", s, n.Encoded(), err)
		}
	}
	long := make([]byte, 64)
	for i := range long {
		long[i] = 'a'
	}
	huge := make([]byte, 254)
	for i := range huge {
		huge[i] = 'a'
	}
	for _, s := range []string{"", ".a", "a..b", string(long), string(huge)} {
		if _, err := ParseDomainName(s); !errors.Is(err, ErrDomainName) {
			t.Errorf("%q accepted", s)
		}
	}
}

func TestConfigCopied(t *testing.T) {
	c := withExceptions()
	g, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.IPv4.Private = netip.MustParseAddr("172.30.0.9")
	c.IPv4.Transit[0].Prefix = netip.MustParsePrefix("10.99.0.0/16")
	c.DHCP.DNS4[0] = netip.MustParseAddr("9.9.9.9")
	got := g.Config()
	if got.IPv4.Private != priv4 || got.IPv4.Transit[0].Prefix != netip.MustParsePrefix("10.9.0.0/16") ||
		got.DHCP.DNS4[0] != netip.MustParseAddr("8.8.8.8") {
		t.Fatalf("the gateway's config changed with the caller's: %+v", got.IPv4)
	}
	d, _ := outbound(t, g, udp4(guestMAC, MAC, netip.MustParseAddr("10.9.1.1"), priv4))
	if d.Verdict != Continue {
		t.Fatalf("%v %v", d.Verdict, d.Reason)
	}
}

func TestShortReplyBuffer(t *testing.T) {
	g := newG1(t, nil)
	for _, b := range [][]byte{
		arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, wire.ARPRequest),
		discover(dhcpDiscover, 0),
		echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 0, 1, 1, []byte("x")),
		rs(guestMAC, guestLL, 255, nil),
		dhcpv6Frame(guestLL, testSolicitPacket[62:]),
	} {
		wantDrop(t, g.Outbound(b, parse(t, b), make([]byte, 40)), ReasonReplyBuffer)
	}
}

func TestNames(t *testing.T) {
	for v := Continue; v <= Drop; v++ {
		if v.String() == "unknown" {
			t.Errorf("verdict %d has no name", v)
		}
	}
	for r := ReasonNone; r <= ReasonReplyBuffer; r++ {
		if r.String() == "unknown" || r.String() == "" {
			t.Errorf("reason %d has no name", r)
		}
	}
	if (Drop+1).String() != "unknown" || (ReasonReplyBuffer+1).String() != "unknown" {
		t.Error("out of range values are named")
	}
}
