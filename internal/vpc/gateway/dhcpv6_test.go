package gateway

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// testSolicitPacket is OPTE's TEST_SOLICIT_PACKET (opte
// engine/dhcpv6/mod.rs test_data): a Solicit snooped from a Linux client,
// without rapid commit, from a8:40:25:fa:dd:0b.
var testSolicitPacket = unhex(`
	333300010002 a84025fadd0b 86dd
	600aeaa7 0040 11 01 fe80000000000000aa4025fffefadd0b ff020000000000000000000000010002
	0222 0223 0040 8086
	01 b3e009
	0001 000e 00010001 2ac9f22d a84025fadd0b  // client id: DUID-LLT
	0006 0008 0017 0018 0027 001f             // option request: DNS, domain list, FQDN, SNTP
	0008 0002 0000                            // elapsed time
	0003 000c 25fadd0b 00000e10 00001518      // IA_NA`)

func v6opt(code uint16, data ...[]byte) []byte {
	d := cat(data...)
	return cat(be16(code), be16(uint16(len(d))), d)
}

// dhcpv6Frame is opte-test-utils packet_from_client_dhcpv6_message.
func dhcpv6Frame(src netip.Addr, msg []byte) []byte {
	udp := cat(be16(546), be16(547), be16(uint16(8+len(msg))), []byte{0, 0}, msg)
	binary.BigEndian.PutUint16(udp[6:], csum(pseudo6(src, allDHCPRelaysAndServers, wire.ProtoUDP, len(udp)), udp))
	return cat(ethhdr(mcastMAC(allDHCPRelaysAndServers), guestMAC, wire.EtherTypeIPv6),
		v6hdr(src, allDHCPRelaysAndServers, wire.ProtoUDP, len(udp), 128), udp)
}

// wantDHCPv6 wraps a reply message as the gateway sends it: from its
// link-local address and MAC to dst and mac, UDP 547 to 546 with a checksum.
func wantDHCPv6(mac wire.MAC, dst netip.Addr, msg []byte) []byte {
	udp := cat(be16(547), be16(546), be16(uint16(8+len(msg))), []byte{0, 0}, msg)
	binary.BigEndian.PutUint16(udp[6:], csum(pseudo6(gwLL, dst, wire.ProtoUDP, len(udp)), udp))
	return cat(ethhdr(mac, MAC, wire.EtherTypeIPv6), v6hdr(gwLL, dst, wire.ProtoUDP, len(udp), 128), udp)
}

func TestDHCPv6SnoopedSolicitGolden(t *testing.T) {
	c := g1Config()
	c.GuestMAC = wire.MAC{0xa8, 0x40, 0x25, 0xfa, 0xdd, 0x0b}
	g, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, got := outbound(t, g, testSolicitPacket)
	wantReply(t, d, ReasonDHCPv6Reply)
	// Built by hand from OPTE's generate_reply_options.
	msg := unhex(`
		02 b3e009                                  // Advertise, the client's xid
		0002 000a 00030001 a84025ff7777            // server id: DUID-LL of the gateway MAC
		0001 000e 00010001 2ac9f22d a84025fadd0b  // the client's id, as sent
		0017 0040 20014860486000000000000000008888 20014860486000000000000000008844
		          26064700470000000000000000001111 26064700470000000000000000001001 // DNS
		0003 0028 25fadd0b ffffffff ffffffff      // IA_NA: the client's IAID, T1 and T2 infinite
		  0005 0018 fd000000000000000000000000000005 ffffffff ffffffff // the private address, for ever
		0018 0010 056f78696465 08636f6d7075746572 00 // domain list: oxide.computer
		0027 001e 03 0774657374626f78 0474657374 056f78696465 08636f6d7075746572 00 // FQDN, flags S|O`)
	wantBytes(t, got, wantDHCPv6(c.GuestMAC, netip.MustParseAddr("fe80::aa40:25ff:fefa:dd0b"), msg))
}

// v6Walk parses a reply's options back: code to data, the first of each.
func v6Walk(t *testing.T, p []byte) map[uint16][]byte {
	t.Helper()
	opts := map[uint16][]byte{}
	for len(p) > 0 {
		code, n := binary.BigEndian.Uint16(p), int(binary.BigEndian.Uint16(p[2:]))
		if _, dup := opts[code]; dup {
			t.Fatalf("option %d twice", code)
		}
		opts[code] = p[4 : 4+n]
		p = p[4+n:]
	}
	return opts
}

// TestDHCPv6SolicitRequest is OPTE's test_reply_to_dhcpv6_solicit_or_request.
func TestDHCPv6SolicitRequest(t *testing.T) {
	g := newG1(t, nil)
	duid := cat([]byte{0, 3, 0, 1}, guestMAC[:])
	for _, typ := range []byte{v6Solicit, v6Request} {
		for _, rapid := range []bool{false, true} {
			opts := [][]byte{
				v6opt(v6OptClientID, duid),
				v6opt(v6OptElapsedTime, be16(10)),
				v6opt(v6OptIANA, be32(0xff7), be32(3600), be32(6200)),
				v6opt(v6OptORO, be16(23), be16(24), be16(39)),
			}
			if rapid {
				opts = append(opts, v6opt(v6OptRapidCommit))
			}
			if typ == v6Request {
				opts = append(opts, v6opt(v6OptServerID, []byte{0, 3, 0, 1}, MAC[:]))
			}
			req := dhcpv6Frame(guestLL, cat([]byte{typ, 0, 1, 2}, cat(opts...)))
			d, got := outbound(t, g, req)
			wantReply(t, d, ReasonDHCPv6Reply)
			f := parse(t, got)
			if f.Src != MAC || f.Dst != guestMAC || f.SrcIP != gwLL || f.DstIP != guestLL ||
				f.SrcPort != 547 || f.DstPort != 546 || !f.L4ChecksumValid(got) {
				t.Fatalf("reply headers %+v", f)
			}
			if binary.BigEndian.Uint16(got[f.L4Off+6:]) == 0 {
				t.Fatal("UDP checksum 0")
			}
			p := got[f.PayloadOff:f.L4End]
			wantType := byte(v6Advertise)
			if rapid || typ == v6Request {
				wantType = v6Reply
			}
			if p[0] != wantType || !bytes.Equal(p[1:4], []byte{0, 1, 2}) {
				t.Fatalf("type %d xid %x", p[0], p[1:4])
			}
			o := v6Walk(t, p[4:])
			want := map[uint16][]byte{
				v6OptServerID:   cat([]byte{0, 3, 0, 1}, MAC[:]),
				v6OptClientID:   duid,
				v6OptDNSServers: cat(a16(g.cfg.DHCP.DNS6[0]), a16(g.cfg.DHCP.DNS6[1]), a16(g.cfg.DHCP.DNS6[2]), a16(g.cfg.DHCP.DNS6[3])),
				v6OptIANA:       cat(be32(0xff7), be32(v6Infinite), be32(v6Infinite), v6opt(v6OptIAAddr, a16(priv6), be32(v6Infinite), be32(v6Infinite))),
				v6OptDomainList: MustDomainName("oxide.computer").Encoded(),
				v6OptFQDN:       cat([]byte{3}, []byte("\x07testbox\x04test\x05oxide\x08computer\x00")),
			}
			if rapid && typ == v6Solicit {
				want[v6OptRapidCommit] = []byte{}
			}
			for code, w := range want {
				if !bytes.Equal(o[code], w) {
					t.Errorf("type %d rapid %v: option %d = %x, want %x", typ, rapid, code, o[code], w)
				}
			}
			if len(o) != len(want) {
				t.Errorf("type %d rapid %v: %d options, want %d", typ, rapid, len(o), len(want))
			}
		}
	}
}

func TestDHCPv6OptionsOnRequest(t *testing.T) {
	c := g1Config()
	c.DHCP = DHCP{}
	g, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	duid := cat([]byte{0, 3, 0, 1}, guestMAC[:])
	// Nothing asked for: server and client ids only. DNS asked for with no
	// servers: an empty option, as OPTE; search and FQDN without a
	// configuration: none.
	for _, tc := range []struct {
		extra []byte
		want  []uint16
	}{
		{nil, []uint16{v6OptServerID, v6OptClientID}},
		{v6opt(v6OptORO, be16(23), be16(24), be16(39)), []uint16{v6OptServerID, v6OptClientID, v6OptDNSServers}},
	} {
		msg := cat([]byte{v6Solicit, 9, 9, 9}, v6opt(v6OptClientID, duid), v6opt(v6OptElapsedTime, be16(0)), tc.extra)
		d, got := outbound(t, g, dhcpv6Frame(guestLL, msg))
		wantReply(t, d, ReasonDHCPv6Reply)
		f := parse(t, got)
		o := v6Walk(t, got[f.PayloadOff+4:f.L4End])
		if len(o) != len(tc.want) {
			t.Fatalf("options %v, want %v", o, tc.want)
		}
		for _, code := range tc.want {
			if _, ok := o[code]; !ok {
				t.Fatalf("no option %d in %v", code, o)
			}
		}
		if d, ok := o[v6OptDNSServers]; ok && len(d) != 0 {
			t.Fatalf("DNS %x", d)
		}
	}
}

func TestDHCPv6NotAnswered(t *testing.T) {
	g := newG1(t, nil)
	cid := v6opt(v6OptClientID, []byte{0, 3, 0, 1}, guestMAC[:])
	el := v6opt(v6OptElapsedTime, be16(0))
	sid := v6opt(v6OptServerID, []byte{0, 3, 0, 1}, MAC[:])
	m := func(typ byte, opts ...[]byte) []byte {
		return dhcpv6Frame(guestLL, cat([]byte{typ, 1, 2, 3}, cat(opts...)))
	}
	for name, b := range map[string][]byte{
		"solicit with a server id":     m(v6Solicit, cid, el, sid),
		"solicit without elapsed time": m(v6Solicit, cid),
		"solicit without client id":    m(v6Solicit, el),
		"request without server id":    m(v6Request, cid, el),
		"request for another server":   m(v6Request, cid, el, v6opt(v6OptServerID, []byte{0, 3, 0, 1}, otherMAC[:])),
		"request, DUID too long":       m(v6Request, cid, el, v6opt(v6OptServerID, []byte{0, 3, 0, 1}, MAC[:], []byte{0})),
		"renew":                        m(5, cid, el, sid),
		"rebind":                       m(6, cid, el),
		"information request":          m(11, cid, el),
		"elapsed time of 3 bytes":      m(v6Solicit, cid, v6opt(v6OptElapsedTime, []byte{0, 0, 0})),
		"odd option request":           m(v6Solicit, cid, el, v6opt(v6OptORO, []byte{0, 23, 0})),
		"truncated option":             m(v6Solicit, cid, el, []byte{0, 1, 0, 9, 0}),
		"IA_NA too short":              m(v6Solicit, cid, el, v6opt(v6OptIANA, be32(1))),
		"status not UTF-8":             m(v6Solicit, cid, el, v6opt(v6OptStatusCode, []byte{0, 0, 0xff})),
		"nested too deep":              m(v6Solicit, cid, el, nestIANA(9)),
		"type and xid only":            m(v6Solicit),
		"confirm, RFC 8415 layout":     m(v6Confirm, cid, el, v6opt(v6OptIANA, be32(1), be32(0), be32(0), v6opt(v6OptIAAddr, a16(priv6), be32(0), be32(0)))),
		"confirm with empty IA_NA":     m(v6Confirm, cid, el, v6opt(v6OptIANA, be32(1), be32(0), be32(0))),
		"confirm without IA_NA":        m(v6Confirm, cid, el),
	} {
		t.Run(name, func(t *testing.T) {
			d, _ := outbound(t, g, b)
			wantDrop(t, d, ReasonDHCPv6)
		})
	}
	// Eight levels of nesting parse.
	d, _ := outbound(t, g, m(v6Solicit, cid, el, nestIANA(8)))
	wantReply(t, d, ReasonDHCPv6Reply)
	// From the guest's private address it is no DHCPv6 to the gateway but
	// the guest's traffic; from another MAC, spoofed.
	b := m(v6Solicit, cid, el)
	d, _ = outbound(t, g, dhcpv6Frame(priv6, cat([]byte{v6Solicit, 1, 2, 3}, cid, el)))
	if d.Verdict != Continue {
		t.Fatalf("from the private address: %v %v", d.Verdict, d.Reason)
	}
	copy(b[6:12], otherMAC[:])
	d, _ = outbound(t, g, b)
	wantDrop(t, d, ReasonSpoofed)
}

// nestIANA is an IA_NA holding IA_NAs n deep in all (the top one at depth 0).
func nestIANA(n int) []byte {
	o := v6opt(v6OptIANA, be32(1), be32(0), be32(0))
	for range n {
		o = v6opt(v6OptIANA, be32(1), be32(0), be32(0), o)
	}
	return o
}

func TestDHCPv6Quirks(t *testing.T) {
	g := newG1(t, nil)
	cid := v6opt(v6OptClientID, []byte{0, 3, 0, 1}, guestMAC[:])
	el := v6opt(v6OptElapsedTime, be16(0))
	m := func(typ byte, opts ...[]byte) []byte {
		return dhcpv6Frame(guestLL, cat([]byte{typ, 1, 2, 3}, cat(opts...)))
	}
	reply := func(b []byte) map[uint16][]byte {
		t.Helper()
		d, got := outbound(t, g, b)
		wantReply(t, d, ReasonDHCPv6Reply)
		f := parse(t, got)
		if got[f.PayloadOff] != v6Reply {
			t.Fatalf("type %d, want reply", got[f.PayloadOff])
		}
		return v6Walk(t, got[f.PayloadOff+4:f.L4End])
	}
	// A rapid commit option's body is read as options: here, the elapsed
	// time the Solicit needs.
	o := reply(m(v6Solicit, cid, v6opt(v6OptRapidCommit, el)))
	if _, ok := o[v6OptRapidCommit]; !ok {
		t.Fatal("no rapid commit in the reply")
	}
	// Rapid commit asked for in the option request counts too.
	reply(m(v6Solicit, cid, el, v6opt(v6OptORO, be16(v6OptRapidCommit))))
	// Confirm, with IA addresses inside an IA_NA inside the IA_NA: our
	// address is confirmed, another one is not on link.
	inner := func(a netip.Addr) []byte {
		return v6opt(v6OptIANA, be32(1), be32(0), be32(0),
			v6opt(v6OptIANA, be32(1), be32(0), be32(0), v6opt(v6OptIAAddr, a16(a), be32(0), be32(0))))
	}
	o = reply(m(v6Confirm, cid, el, inner(priv6)))
	if !bytes.Equal(o[v6OptStatusCode], []byte{0, 0}) || len(o) != 3 {
		t.Fatalf("confirm: %x", o)
	}
	o = reply(m(v6Confirm, cid, el, inner(netip.MustParseAddr("fd00::9"))))
	if !bytes.Equal(o[v6OptStatusCode], cat([]byte{0, 4}, []byte("Address(es) not on link"))) {
		t.Fatalf("confirm: %x", o)
	}
}
