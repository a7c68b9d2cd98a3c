package gateway

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// rs is opte-test-utils gen_router_solicitation: from the guest's MAC and
// EUI-64 address to all routers, hop limit 255, with its link-layer address.
func rs(srcMAC wire.MAC, src netip.Addr, hop uint8, opts []byte) []byte {
	return icmp6Frame(srcMAC, allRoutersMAC, src, allRouters, hop, cat([]byte{133, 0, 0, 0, 0, 0, 0, 0}, opts))
}

func slla(m wire.MAC) []byte { return cat([]byte{1, 1}, m[:]) }

func TestRouterAdvertGolden(t *testing.T) {
	g := newG1(t, nil)
	d, got := outbound(t, g, rs(guestMAC, guestLL, 255, slla(guestMAC)))
	wantReply(t, d, ReasonRouterAdvert)
	// Built by hand from smoltcp 0.11's NdiscRepr::RouterAdvert layout; the
	// values are what OPTE's gateway_router_advert_reply asserts: from the
	// gateway's MAC and link-local address to the guest's, hop limit 255,
	// current hop limit 255, Managed, lifetime 9000 s, reachable and
	// retransmit 0, the gateway's MAC, MTU 1500, no prefix.
	ra := withCsum(unhex(`
		86 00 0000          // router advertisement, code 0, checksum
		ff 80 2328          // current hop limit 255, M, router lifetime 9000
		00000000 00000000   // reachable time, retransmit timer
		01 01 a84025ff7777  // source link-layer address
		05 01 0000 000005dc // MTU 1500`), 2, pseudo6(gwLL, guestLL, wire.ProtoICMPv6, 32))
	wantBytes(t, got, cat(ethhdr(guestMAC, MAC, wire.EtherTypeIPv6), v6hdr(gwLL, guestLL, wire.ProtoICMPv6, 32, 255), ra))

	// The jumbo MTU is announced as it is.
	c := g1Config()
	c.MTU = 8500
	gj, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, got = outbound(t, gj, rs(guestMAC, guestLL, 255, nil))
	if mtu := binary.BigEndian.Uint32(got[len(got)-4:]); mtu != 8500 {
		t.Fatalf("MTU option %d, want 8500", mtu)
	}
}

func TestRouterSolicitationNotAnswered(t *testing.T) {
	g := newG1(t, nil)
	badCsum := rs(guestMAC, guestLL, 255, nil)
	badCsum[14+40+2] ^= 0xff
	for name, tc := range map[string]struct {
		b []byte
		r Reason
	}{
		"hop limit 64":        {rs(guestMAC, guestLL, 64, nil), ReasonNDPInvalid},
		"bad checksum":        {badCsum, ReasonNDPInvalid},
		"option of length 0":  {rs(guestMAC, guestLL, 255, []byte{1, 0, 0, 0, 0, 0, 0, 0}), ReasonNDPInvalid},
		"truncated option":    {rs(guestMAC, guestLL, 255, []byte{1, 2, 0, 0, 0, 0, 0, 0}), ReasonNDPInvalid},
		"short prefix option": {rs(guestMAC, guestLL, 255, []byte{3, 1, 0, 0, 0, 0, 0, 0}), ReasonNDPInvalid},
		"from ::":             {rs(guestMAC, ipv6Any, 255, nil), ReasonNDP},
		"from fe80:0:0:1::1":  {rs(guestMAC, netip.MustParseAddr("fe80:0:0:1::1"), 255, nil), ReasonNDP},
		"from another MAC":    {rs(otherMAC, guestLL, 255, nil), ReasonNDP},
		"nonzero code": {icmp6Frame(guestMAC, allRoutersMAC, guestLL, allRouters, 255,
			[]byte{133, 1, 0, 0, 0, 0, 0, 0}), ReasonNDPInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			d, _ := outbound(t, g, tc.b)
			wantDrop(t, d, tc.r)
		})
	}
	// An unknown option is skipped, as smoltcp does.
	d, _ := outbound(t, g, rs(guestMAC, guestLL, 255, []byte{200, 1, 0, 0, 0, 0, 0, 0}))
	wantReply(t, d, ReasonRouterAdvert)
}

func ns(srcMAC, dstMAC wire.MAC, src, dst, target netip.Addr, hop uint8, lladdr *wire.MAC) []byte {
	msg := cat([]byte{135, 0, 0, 0, 0, 0, 0, 0}, a16(target))
	if lladdr != nil {
		msg = cat(msg, slla(*lladdr))
	}
	return icmp6Frame(srcMAC, dstMAC, src, dst, hop, msg)
}

func mcastMAC(a netip.Addr) wire.MAC {
	m, _ := wire.MulticastMAC(a)
	return m
}

func na(dstMAC wire.MAC, dst netip.Addr, flags byte) []byte {
	msg := withCsum(cat([]byte{136, 0, 0, 0, flags, 0, 0, 0}, a16(gwLL), []byte{2, 1}, MAC[:]), 2,
		pseudo6(gwLL, dst, wire.ProtoICMPv6, 32))
	return cat(ethhdr(dstMAC, MAC, wire.EtherTypeIPv6), v6hdr(gwLL, dst, wire.ProtoICMPv6, 32, 255), msg)
}

// TestNeighborAdvert runs the cases of OPTE's
// test_gateway_neighbor_advert_reply (generate_solicit_test_data).
func TestNeighborAdvert(t *testing.T) {
	g := newG1(t, nil)
	gm := guestMAC
	// 1. DAD for the guest's own link-local address: dropped.
	d, _ := outbound(t, g, ns(guestMAC, mcastMAC(SolicitedNode(guestLL)), ipv6Any, SolicitedNode(guestLL), guestLL, 255, nil))
	wantDrop(t, d, ReasonNDP)
	// 2. DAD for the gateway's address: an NA to all nodes, Router and
	// Override, not Solicited.
	d, got := outbound(t, g, ns(guestMAC, mcastMAC(SolicitedNode(gwLL)), ipv6Any, SolicitedNode(gwLL), gwLL, 255, nil))
	wantReply(t, d, ReasonNeighborAdvert)
	wantBytes(t, got, na(wire.MAC{0x33, 0x33, 0, 0, 0, 1}, allNodes, 0xa0))
	// 3. Reachability of the gateway: unicast back, Router, Solicited, Override.
	d, got = outbound(t, g, ns(guestMAC, MAC, guestLL, gwLL, gwLL, 255, &gm))
	wantReply(t, d, ReasonNeighborAdvert)
	want := na(guestMAC, guestLL, 0xe0)
	wantBytes(t, got, want)
	wantBytes(t, got[:14+40+8], cat(unhex(`
		a84025fafa37 a84025ff7777 86dd
		60000000 0020 3a ff
		fe800000000000 00aa4025fffeff7777
		fe800000000000 00aa4025fffefafa37`), unhex("8800"), want[56:58], unhex("e0000000")))
	// 4. Resolution of another link-local address: dropped.
	other := netip.MustParseAddr("fe80::1:1:1:1")
	d, _ = outbound(t, g, ns(guestMAC, mcastMAC(SolicitedNode(other)), guestLL, other, other, 255, nil))
	wantDrop(t, d, ReasonNDP)
	// Resolution of the gateway through its solicited-node group.
	d, got = outbound(t, g, ns(guestMAC, mcastMAC(SolicitedNode(gwLL)), guestLL, SolicitedNode(gwLL), gwLL, 255, &gm))
	wantReply(t, d, ReasonNeighborAdvert)
	wantBytes(t, got, want)
}

func TestNeighborSolicitationNotAnswered(t *testing.T) {
	g := newG1(t, nil)
	gm := guestMAC
	snMAC := mcastMAC(SolicitedNode(gwLL))
	for name, tc := range map[string]struct {
		b []byte
		r Reason
	}{
		"hop limit 64":         {ns(guestMAC, MAC, guestLL, gwLL, gwLL, 64, &gm), ReasonNDPInvalid},
		"multicast target":     {ns(guestMAC, MAC, guestLL, gwLL, allNodes, 255, &gm), ReasonNDPInvalid},
		"from :: unicast":      {ns(guestMAC, MAC, ipv6Any, gwLL, gwLL, 255, nil), ReasonNDPInvalid},
		"from :: with lladdr":  {ns(guestMAC, snMAC, ipv6Any, SolicitedNode(gwLL), gwLL, 255, &gm), ReasonNDPInvalid},
		"for another target":   {ns(guestMAC, MAC, guestLL, gwLL, priv6, 255, &gm), ReasonNDP},
		"from another MAC":     {ns(otherMAC, MAC, guestLL, gwLL, gwLL, 255, &gm), ReasonNDP},
		"from a global source": {ns(guestMAC, MAC, priv6, gwLL, gwLL, 255, &gm), ReasonNDP},
	} {
		t.Run(name, func(t *testing.T) {
			d, _ := outbound(t, g, tc.b)
			wantDrop(t, d, tc.r)
		})
	}
}

// TestOtherNDPDropped: OPTE's outbound_ndp_dropped (an NA from the guest,
// omicron#2857) and inbound_ndp_dropped_at_gateway, and a redirect.
func TestOtherNDPDropped(t *testing.T) {
	g := newG1(t, nil)
	target := netip.MustParseAddr("fd77:e9d2:9cd9:2000::6")
	naOut := icmp6Frame(guestMAC, broadcastMAC, priv6, allNodes, 255,
		cat([]byte{136, 0, 0, 0, 0x20, 0, 0, 0}, a16(target), []byte{2, 1}, guestMAC[:]))
	d, _ := outbound(t, g, naOut)
	wantDrop(t, d, ReasonNDP)
	redirect := icmp6Frame(guestMAC, MAC, priv6, gwLL, 255, cat([]byte{137, 0, 0, 0, 0, 0, 0, 0}, a16(gwLL), a16(gwLL)))
	d, _ = outbound(t, g, redirect)
	wantDrop(t, d, ReasonNDP)

	g2 := netip.MustParseAddr("fd00::6")
	gm := guestMAC
	nsIn := ns(MAC, guestMAC, g2, priv6, priv6, 255, &gm)
	wantDrop(t, g.Inbound(nsIn, parse(t, nsIn)), ReasonNDP)
	raIn := icmp6Frame(MAC, guestMAC, gwLL, priv6, 255, make([]byte, 16))
	raIn[14+40] = 134
	wantDrop(t, g.Inbound(raIn, parse(t, raIn)), ReasonNDP)

	// A v4-only port drops NDP too.
	c := g1Config()
	c.IPv6 = nil
	g4, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ = outbound(t, g4, rs(guestMAC, guestLL, 255, nil))
	wantDrop(t, d, ReasonNDP)
	wantDrop(t, g4.Inbound(nsIn, parse(t, nsIn)), ReasonNDP)
}
