package gateway

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// dhcpMsgBytes is a client's DHCP message laid out as smoltcp's
// DhcpRepr::emit (opte-test-utils packet_from_client_dhcpv4_message).
func dhcpMsgBytes(op byte, xid uint32, flags uint16, ciaddr netip.Addr, opts []byte) []byte {
	m := make([]byte, 240)
	m[0], m[1], m[2] = op, 1, 6
	binary.BigEndian.PutUint32(m[4:], xid)
	binary.BigEndian.PutUint16(m[10:], flags)
	copy(m[12:16], a4(ciaddr))
	copy(m[28:34], guestMAC[:])
	binary.BigEndian.PutUint32(m[236:], dhcpMagic)
	return cat(m, opts, []byte{optEnd})
}

func dhcpFrame(srcMAC, dstMAC wire.MAC, src, dst netip.Addr, sport, dport uint16, msg []byte) []byte {
	udp := cat(be16(sport), be16(dport), be16(uint16(8+len(msg))), []byte{0, 0}, msg)
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeIPv4), v4hdr(src, dst, wire.ProtoUDP, len(udp), 64), udp)
}

func discover(typ byte, flags uint16, extra ...byte) []byte {
	opts := cat([]byte{optMessageType, 1, typ}, []byte{55, 4, 1, 3, 6, 121}, extra)
	return dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(1, 0xdeadbeef, flags, ipv4Any, opts))
}

// wantOffer is the gateway's reply to discover's message, built here from
// OPTE's DhcpAction::gen_packet and smoltcp 0.11's DhcpRepr::emit.
func wantOffer(typ byte, broadcast bool) []byte {
	fixed := make([]byte, 240)
	copy(fixed, unhex(`
		02 01 06 00   // reply, Ethernet, hops 0
		deadbeef      // the client's xid
		0000 0000     // secs 0, flags 0
		00000000      // ciaddr
		ac1e0005      // yiaddr: the private address
		ac1e0001      // siaddr: the gateway
		00000000      // giaddr
		a84025fafa37  // chaddr`))
	binary.BigEndian.PutUint32(fixed[236:], 0x63825363)
	opts := unhex(`
		35 01 ` + string("0123456789abcdef"[typ>>4]) + string("0123456789abcdef"[typ&15]) + `
		36 04 ac1e0001                  // server identifier
		03 04 ac1e0001                  // router
		01 04 ffffffff                  // subnet mask: a /32
		33 04 00015180                  // lease 86400 s
		06 08 08080808 01010101         // DNS
		79 0e 20 ac1e0001 00000000 00 ac1e0001 // routes: gw/32 on-link, 0/0 via gw
		0c 07 74657374626f78            // "testbox"
		0f 13 746573742e6f786964652e636f6d7075746572 // "test.oxide.computer"
		77 10 056f78696465 08636f6d7075746572 00     // search: oxide.computer
		ff`)
	msg := cat(fixed, opts)
	dstMAC, dst := guestMAC, priv4
	if broadcast {
		dstMAC, dst = broadcastMAC, ipv4Broadcast
	}
	udp := cat(be16(67), be16(68), be16(uint16(8+len(msg))), []byte{0, 0}, msg)
	return cat(ethhdr(dstMAC, MAC, wire.EtherTypeIPv4), v4hdr(gw4, dst, wire.ProtoUDP, len(udp), 128), udp)
}

func TestDHCPOfferAckGolden(t *testing.T) {
	g := newG1(t, nil)
	for _, tc := range []struct {
		name      string
		typ, want byte
		r         Reason
		flags     uint16
	}{
		{"discover broadcast", dhcpDiscover, dhcpOffer, ReasonDHCPOffer, 0x8000},
		{"discover unicast", dhcpDiscover, dhcpOffer, ReasonDHCPOffer, 0},
		{"request broadcast", dhcpRequest, dhcpAck, ReasonDHCPAck, 0x8000},
		{"request unicast", dhcpRequest, dhcpAck, ReasonDHCPAck, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, got := outbound(t, g, discover(tc.typ, tc.flags))
			wantReply(t, d, tc.r)
			wantBytes(t, got, wantOffer(tc.want, tc.flags != 0))
		})
	}
}

// dhcpOpts parses the options of a DHCP reply back, joining split options
// (RFC 3396).
func dhcpOpts(t *testing.T, frame []byte) map[byte][]byte {
	t.Helper()
	f := parse(t, frame)
	p := frame[f.PayloadOff:f.L4End]
	if !bytes.Equal(p[236:240], []byte{0x63, 0x82, 0x53, 0x63}) {
		t.Fatal("no magic cookie")
	}
	opts := map[byte][]byte{}
	for o := p[240:]; ; {
		if o[0] == optEnd {
			if len(o) != 1 {
				t.Fatalf("%d bytes after the end option", len(o)-1)
			}
			return opts
		}
		n := int(o[1])
		opts[o[0]] = append(opts[o[0]], o[2:2+n]...)
		o = o[2+n:]
	}
}

func TestDHCPOptionsParsedBack(t *testing.T) {
	c := g1Config()
	long := make([]DomainName, 6)
	for i := range long {
		long[i] = MustDomainName("something.that.is.very.long.so.we.need.to.split.the.option")
	}
	c.DHCP.Search = append([]DomainName{MustDomainName("foo.bar.com")}, long...)
	c.DHCP.DNS4 = []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"),
		netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")}
	g, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, got := outbound(t, g, discover(dhcpDiscover, 0))
	wantReply(t, d, ReasonDHCPOffer)
	opts := dhcpOpts(t, got)
	var search []byte
	for _, n := range c.DHCP.Search {
		search = append(search, n.Encoded()...)
	}
	for code, want := range map[byte][]byte{
		optMessageType:  {dhcpOffer},
		optServerID:     a4(gw4),
		optRouter:       a4(gw4),
		optSubnetMask:   {255, 255, 255, 255},
		optLeaseTime:    be32(86400),
		optDNS:          unhex("0a000001 0a000002 0a000003"), // three at most, as smoltcp
		optClasslessRte: unhex("20 ac1e0001 00000000 00 ac1e0001"),
		optHostname:     []byte("testbox"),
		optDomainName:   []byte("test.oxide.computer"),
		optDomainSearch: search,
	} {
		if !bytes.Equal(opts[code], want) {
			t.Errorf("option %d = %x, want %x", code, opts[code], want)
		}
		delete(opts, code)
	}
	if len(opts) != 0 {
		t.Errorf("unexpected options %v (no MTU option, nothing else)", opts)
	}
	if len(search) <= 255 {
		t.Fatal("the search list should need two options")
	}

	// No DNS option without servers, no hostname, domain or search without them.
	c = g1Config()
	c.DHCP = DHCP{}
	g, err = New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, got = outbound(t, g, discover(dhcpDiscover, 0))
	opts = dhcpOpts(t, got)
	for _, code := range []byte{optDNS, optHostname, optDomainName, optDomainSearch} {
		if _, ok := opts[code]; ok {
			t.Errorf("option %d without its configuration", code)
		}
	}
	if len(opts) != 6 {
		t.Errorf("%d options, want 6: %v", len(opts), opts)
	}
}

// TestDHCPOptionEncoding replays opte engine/dhcp.rs's unit tests, byte
// for byte.
func TestDHCPOptionEncoding(t *testing.T) {
	r := func(p, router string) func([]byte) []byte {
		return func(b []byte) []byte {
			return appendClasslessRoute(b, netip.MustParsePrefix(p), netip.MustParseAddr(router))
		}
	}
	routes := func(fs ...func([]byte) []byte) []byte {
		var b []byte
		for _, f := range fs {
			b = f(b)
		}
		return appendSplitOption(nil, optClasslessRte, b)
	}
	p1, p2, p3 := r("0.0.0.0/0", "10.0.0.1"), r("10.0.0.0/8", "10.0.0.1"), r("10.0.0.0/24", "10.0.0.1")
	p4, p5 := r("10.17.0.0/16", "10.0.0.1"), r("10.27.129.0/24", "10.0.0.1")
	p6, p7, p8 := r("10.229.0.128/25", "10.0.0.1"), r("10.198.122.47/32", "10.0.0.1"), r("10.16.0.0/15", "10.0.0.1")
	for i, tc := range []struct{ got, want []byte }{
		{appendSplitOption(nil, optHostname, []byte("myhost")), []byte{12, 6, 109, 121, 104, 111, 115, 116}},
		{appendSplitOption(nil, optDomainName, []byte("myhost.oxide.computer")), []byte{15, 21, 109, 121, 104, 111, 115, 116, 46, 111, 120, 105, 100, 101, 46, 99, 111, 109, 112, 117, 116, 101, 114}},
		{routes(r("172.30.7.77/32", "0.0.0.0"), r("0.0.0.0/0", "172.30.4.1")), []byte{121, 14, 32, 172, 30, 7, 77, 0, 0, 0, 0, 0, 172, 30, 4, 1}},
		{routes(p1), []byte{121, 5, 0, 10, 0, 0, 1}},
		{routes(p1, p2), []byte{121, 11, 0, 10, 0, 0, 1, 8, 10, 10, 0, 0, 1}},
		{routes(p1, p2, p3), []byte{121, 19, 0, 10, 0, 0, 1, 8, 10, 10, 0, 0, 1, 24, 10, 0, 0, 10, 0, 0, 1}},
		{routes(p4), []byte{121, 7, 16, 10, 17, 10, 0, 0, 1}},
		{routes(p4, p5), []byte{121, 15, 16, 10, 17, 10, 0, 0, 1, 24, 10, 27, 129, 10, 0, 0, 1}},
		{routes(p4, p5, p6), []byte{121, 24, 16, 10, 17, 10, 0, 0, 1, 24, 10, 27, 129, 10, 0, 0, 1, 25, 10, 229, 0, 128, 10, 0, 0, 1}},
		{routes(p6, p7), []byte{121, 18, 25, 10, 229, 0, 128, 10, 0, 0, 1, 32, 10, 198, 122, 47, 10, 0, 0, 1}},
		{routes(p6, p7, p8), []byte{121, 25, 25, 10, 229, 0, 128, 10, 0, 0, 1, 32, 10, 198, 122, 47, 10, 0, 0, 1, 15, 10, 16, 10, 0, 0, 1}},
	} {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("case %d: %v, want %v", i, tc.got, tc.want)
		}
	}
	// domain_search_option_encode: seven names split into 255 bytes and the rest.
	var names []byte
	for _, s := range []string{"foo.bar.com", "something.that.is.very.long.so.we.need.to.split.the.option",
		"something.that.is.very.long.so.we.need.to.split.the.option", "something.that.is.very.long.so.we.need.to.split.the.option",
		"something.that.is.very.long.so.we.need.to.split.the.option", "something.that.is.very.long.so.we.need.to.split.the.option",
		"oxide.computer"} {
		names = append(names, MustDomainName(s).Encoded()...)
	}
	b := appendSplitOption(nil, optDomainSearch, names)
	if b[0] != 119 || b[1] != 255 || !bytes.Equal(b[2:257], names[:255]) ||
		b[257] != 119 || int(b[258]) != len(names)-255 || !bytes.Equal(b[259:], names[255:]) {
		t.Errorf("search list split wrongly: %x", b)
	}
}

func TestDHCPNotAnswered(t *testing.T) {
	g := newG1(t, nil)
	// A renewal, unicast from the guest's address to the gateway: not
	// answered, it is the guest's traffic (OPTE's predicates want 0.0.0.0
	// to 255.255.255.255).
	renew := dhcpFrame(guestMAC, MAC, priv4, gw4, 68, 67,
		dhcpMsgBytes(1, 1, 0, priv4, []byte{optMessageType, 1, dhcpRequest}))
	d, _ := outbound(t, g, renew)
	if d.Verdict != Continue || d.Reason != ReasonGuest {
		t.Fatalf("renewal: %v %v, want continue", d.Verdict, d.Reason)
	}
	// A rebind, broadcast from the guest's address: the same.
	rebind := dhcpFrame(guestMAC, broadcastMAC, priv4, ipv4Broadcast, 68, 67,
		dhcpMsgBytes(1, 1, 0, priv4, []byte{optMessageType, 1, dhcpRequest}))
	if d, _ = outbound(t, g, rebind); d.Verdict != Continue {
		t.Fatalf("rebind: %v %v, want continue", d.Verdict, d.Reason)
	}
	short := dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, make([]byte, 239))
	noCookie := discover(dhcpDiscover, 0)
	noCookie[14+20+8+236] = 0
	for name, b := range map[string][]byte{
		"inform":                    discover(8, 0),
		"release":                   discover(7, 0),
		"decline":                   discover(4, 0),
		"no message type":           dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(1, 1, 0, ipv4Any, nil)),
		"type of the other op":      dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(2, 1, 0, ipv4Any, []byte{53, 1, 1})),
		"client id not Ethernet":    discover(dhcpDiscover, 0, 61, 7, 6, 1, 2, 3, 4, 5, 6),
		"shorter than 240 bytes":    short,
		"no magic cookie":           noCookie,
		"from another MAC":          dhcpFrame(otherMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(1, 1, 0, ipv4Any, []byte{53, 1, 1})),
		"unicast to the gateway":    dhcpFrame(guestMAC, MAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(1, 1, 0, ipv4Any, []byte{53, 1, 1})),
		"to another port":           dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 68, dhcpMsgBytes(1, 1, 0, ipv4Any, []byte{53, 1, 1})),
		"truncated type, then none": dhcpFrame(guestMAC, broadcastMAC, ipv4Any, ipv4Broadcast, 68, 67, dhcpMsgBytes(1, 1, 0, ipv4Any, []byte{53, 9, 1})),
	} {
		t.Run(name, func(t *testing.T) {
			d, _ := outbound(t, g, b)
			wantDrop(t, d, ReasonSpoofed)
		})
	}
	// The last valid message type wins; a client identifier of another
	// length is not checked; pads are skipped.
	d, got := outbound(t, g, discover(dhcpDiscover, 0, 0, 0, 53, 1, dhcpRequest, 61, 4, 9, 9, 9, 9))
	wantReply(t, d, ReasonDHCPAck)
	if got[14+20+8+242] != dhcpAck {
		t.Fatal("not an ACK")
	}
}
