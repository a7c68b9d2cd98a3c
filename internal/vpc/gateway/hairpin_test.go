package gateway

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// arpRequest is the guest's request of OPTE's arp_gateway test: broadcast,
// from the guest's MAC and address, for the gateway's address.
func arpRequest(srcMAC, dstMAC, sha wire.MAC, spa, tpa netip.Addr, op uint16) []byte {
	return cat(ethhdr(dstMAC, srcMAC, wire.EtherTypeARP),
		[]byte{0, 1, 8, 0, 6, 4}, be16(op), sha[:], a4(spa), make([]byte, 6), a4(tpa))
}

func TestARPReplyGolden(t *testing.T) {
	g := newG1(t, nil)
	d, got := outbound(t, g, arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, wire.ARPRequest))
	wantReply(t, d, ReasonARPReply)
	// Built by hand (opte engine/arp.rs gen_arp_reply); OPTE's arp_gateway
	// asserts these fields: from the gateway MAC to the guest's, op reply,
	// sha/spa the gateway's, tha/tpa the guest's.
	wantBytes(t, got, unhex(`
		a84025fafa37 a84025ff7777 0806  // Ethernet: to the guest, from the gateway, ARP
		0001 0800 06 04 0002            // Ethernet/IPv4, reply
		a84025ff7777 ac1e0001           // sender: the gateway
		a84025fafa37 ac1e0005           // target: the guest`))

	// The reply goes to the sender hardware address of the request, not
	// the Ethernet source, as OPTE's does; and to any sender IP.
	odd := wire.MAC{0x02, 0, 0, 0, 0, 9}
	d, got = outbound(t, g, arpRequest(guestMAC, broadcastMAC, odd, netip.IPv4Unspecified(), gw4, wire.ARPRequest))
	wantReply(t, d, ReasonARPReply)
	wantBytes(t, got, cat(ethhdr(odd, MAC, wire.EtherTypeARP), []byte{0, 1, 8, 0, 6, 4, 0, 2},
		MAC[:], a4(gw4), odd[:], []byte{0, 0, 0, 0}))
}

func TestARPDrops(t *testing.T) {
	g := newG1(t, nil)
	for name, req := range map[string][]byte{
		"for another address":  arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, netip.MustParseAddr("172.30.0.6"), wire.ARPRequest),
		"unicast to gateway":   arpRequest(guestMAC, MAC, guestMAC, priv4, gw4, wire.ARPRequest),
		"from another MAC":     arpRequest(otherMAC, broadcastMAC, otherMAC, priv4, gw4, wire.ARPRequest),
		"a reply":              arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, wire.ARPReply),
		"an unknown operation": arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, 3),
	} {
		t.Run(name, func(t *testing.T) {
			d, _ := outbound(t, g, req)
			wantDrop(t, d, ReasonARP)
		})
	}
	t.Run("IPv6-only port", func(t *testing.T) {
		c := g1Config()
		c.IPv4 = nil
		g6, err := New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := outbound(t, g6, arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, wire.ARPRequest))
		wantDrop(t, d, ReasonARP)
	})
	t.Run("inbound", func(t *testing.T) {
		b := arpRequest(otherMAC, broadcastMAC, otherMAC, priv4, gw4, wire.ARPRequest)
		wantDrop(t, g.Inbound(b, parse(t, b)), ReasonNotForGuest)
	})
}

func TestEchoReply4Golden(t *testing.T) {
	g := newG1(t, nil)
	// OPTE's gateway_icmp4_ping: ident 7, seq 777, "reunion\0".
	data := []byte("reunion\x00")
	req := echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 0, 7, 777, data)
	d, got := outbound(t, g, req)
	wantReply(t, d, ReasonEchoReply)
	// Built here: ingot's IPv4 defaults (TTL 128, id 0, no flags), the
	// gateway to the guest, echo reply with the request's id, seq and data.
	icmp := cat([]byte{0, 0, 0, 0}, be16(7), be16(777), data)
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	want := cat(ethhdr(guestMAC, MAC, wire.EtherTypeIPv4), v4hdr(gw4, priv4, wire.ProtoICMP, len(icmp), 128), icmp)
	wantBytes(t, got, want)
	wantBytes(t, got[14:34], unhex("45000024 0000 0000 80 01 e296 ac1e0001 ac1e0005"))

	// A request without a checksum (offloaded) gets a computed one.
	binary.BigEndian.PutUint16(req[14+20+2:], 0)
	d, got = outbound(t, g, req)
	wantReply(t, d, ReasonEchoReply)
	wantBytes(t, got, want)

	// An odd-length payload.
	req = echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 0, 0x1234, 1, []byte("abc"))
	d, got = outbound(t, g, req)
	wantReply(t, d, ReasonEchoReply)
	icmp = cat([]byte{0, 0, 0, 0, 0x12, 0x34, 0, 1}, []byte("abc"))
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	wantBytes(t, got, cat(ethhdr(guestMAC, MAC, wire.EtherTypeIPv4), v4hdr(gw4, priv4, wire.ProtoICMP, len(icmp), 128), icmp))
}

func TestEcho4NotAnswered(t *testing.T) {
	g := newG1(t, nil)
	data := []byte("x")
	// A nonzero code: OPTE's action refuses it.
	d, _ := outbound(t, g, echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 1, 1, 1, data))
	wantDrop(t, d, ReasonEchoInvalid)
	// To the gateway's address through another MAC: the guest's traffic.
	d, _ = outbound(t, g, echo4(guestMAC, broadcastMAC, priv4, gw4, wire.ICMPEchoRequest, 0, 1, 1, data))
	if d.Verdict != Continue || d.Reason != ReasonGuest {
		t.Fatalf("got %v %v, want continue", d.Verdict, d.Reason)
	}
	// From another address: spoofed.
	d, _ = outbound(t, g, echo4(guestMAC, MAC, netip.MustParseAddr("172.30.0.9"), gw4, wire.ICMPEchoRequest, 0, 1, 1, data))
	wantDrop(t, d, ReasonSpoofed)
	// A fragment is never answered.
	req := echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 0, 1, 1, data)
	req[14+6] = 0x20 // more fragments
	binary.BigEndian.PutUint16(req[14+10:], 0)
	binary.BigEndian.PutUint16(req[14+10:], csum(req[14:34]))
	d, _ = outbound(t, g, req)
	if d.Verdict != Continue {
		t.Fatalf("fragment: got %v %v, want continue", d.Verdict, d.Reason)
	}
}

func echo6Msg(typ, code uint8, id, seq uint16, data []byte) []byte {
	return cat([]byte{typ, code, 0, 0}, be16(id), be16(seq), data)
}

func TestEchoReply6Golden(t *testing.T) {
	g := newG1(t, nil)
	data := []byte("reunion\x00")
	// OPTE's gateway_icmpv6_ping: from the guest's EUI-64 link-local
	// address and from its private address, to the gateway's link-local.
	for _, src := range []netip.Addr{guestLL, priv6} {
		req := icmp6Frame(guestMAC, MAC, src, gwLL, 64, echo6Msg(wire.ICMPv6EchoRequest, 0, 7, 777, data))
		d, got := outbound(t, g, req)
		wantReply(t, d, ReasonEchoReply)
		msg := withCsum(echo6Msg(wire.ICMPv6EchoReply, 0, 7, 777, data), 2, pseudo6(gwLL, src, wire.ProtoICMPv6, 16))
		want := cat(ethhdr(guestMAC, MAC, wire.EtherTypeIPv6), v6hdr(gwLL, src, wire.ProtoICMPv6, len(msg), 128), msg)
		wantBytes(t, got, want)

		binary.BigEndian.PutUint16(req[14+40+2:], 0)
		d, got = outbound(t, g, req)
		wantReply(t, d, ReasonEchoReply)
		wantBytes(t, got, want)
	}
	// From another link-local address: neither hairpin nor the guest's.
	other := netip.MustParseAddr("fe80::1")
	d, _ := outbound(t, g, icmp6Frame(guestMAC, MAC, other, gwLL, 64, echo6Msg(wire.ICMPv6EchoRequest, 0, 7, 777, data)))
	wantDrop(t, d, ReasonSpoofed)
	d, _ = outbound(t, g, icmp6Frame(guestMAC, MAC, priv6, gwLL, 64, echo6Msg(wire.ICMPv6EchoRequest, 3, 7, 777, data)))
	wantDrop(t, d, ReasonEchoInvalid)
}
