package gateway

import (
	"encoding/binary"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// DHCPv4 (RFC 2131, 2132) as OPTE's DhcpAction answers it (opte
// engine/dhcp.rs, with the reply laid out by smoltcp 0.11's DhcpRepr::emit).
const (
	dhcpServerPort = 67
	dhcpClientPort = 68

	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5

	dhcpOpRequest = 1
	dhcpOpReply   = 2

	dhcpMagic     = 0x63825363
	dhcpHeaderLen = 240 // the fixed fields and the magic cookie

	// DHCPLease is the lease OPTE grants, in seconds.
	DHCPLease = 86400

	optPad          = 0
	optSubnetMask   = 1
	optRouter       = 3
	optDNS          = 6
	optHostname     = 12
	optDomainName   = 15
	optLeaseTime    = 51
	optMessageType  = 53
	optServerID     = 54
	optClientID     = 61
	optDomainSearch = 119
	optClasslessRte = 121
	optEnd          = 255

	// dhcpMaxDNS is smoltcp's DHCP_MAX_DNS_SERVER_COUNT: OPTE hands out the
	// first three IPv4 DNS servers.
	dhcpMaxDNS = 3
	maxOptLen  = 255
)

// dhcpMsg is what the gateway needs of a client's DHCP message.
type dhcpMsg struct {
	msgType   uint8
	xid       uint32
	broadcast bool
}

// dhcpOpcode is the BOOTP op a message type goes with (smoltcp's
// MessageType::opcode); 0 for a type smoltcp does not know.
func dhcpOpcode(t uint8) uint8 {
	switch t {
	case 1, 3, 4, 7, 8: // discover, request, decline, release, inform
		return dhcpOpRequest
	case 2, 5, 6: // offer, ack, nak
		return dhcpOpReply
	}
	return 0
}

// parseDHCP reads a client's DHCP message as smoltcp 0.11's DhcpRepr::parse,
// whose success OPTE's DhcpMsgType predicate requires: at least the 240
// bytes of fixed fields and cookie, Ethernet hardware (type 1, length 6), the
// magic cookie, a message type option whose op matches the header's (the
// last one wins); a client identifier option of 7 bytes must be of hardware
// type 1. Options end at an end option or where one would overrun the
// message. ok is false when smoltcp would not parse it.
func parseDHCP(p []byte) (m dhcpMsg, ok bool) {
	if len(p) < dhcpHeaderLen || p[1] != 1 || p[2] != 6 ||
		binary.BigEndian.Uint32(p[236:240]) != dhcpMagic {
		return dhcpMsg{}, false
	}
	op := p[0]
	haveType := false
	for opts := p[dhcpHeaderLen:]; len(opts) > 0; {
		kind := opts[0]
		if kind == optEnd {
			break
		}
		if kind == optPad {
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || len(opts) < 2+int(opts[1]) {
			break
		}
		data := opts[2 : 2+int(opts[1])]
		opts = opts[2+len(data):]
		switch {
		case kind == optMessageType && len(data) == 1:
			if dhcpOpcode(data[0]) == op {
				m.msgType, haveType = data[0], true
			}
		case kind == optClientID && len(data) == 7 && data[0] != 1:
			return dhcpMsg{}, false
		}
	}
	if !haveType {
		return dhcpMsg{}, false
	}
	m.xid = binary.BigEndian.Uint32(p[4:8])
	m.broadcast = binary.BigEndian.Uint16(p[10:12])&0x8000 != 0
	return m, true
}

// dhcpOptions builds the options of the gateway's OFFER and ACK after the
// message type, in smoltcp's order: server identifier, router, subnet mask
// (255.255.255.255: the guest is alone on a /32), lease time, DNS servers
// (at most three, none without any), then OPTE's own: classless static
// routes (RFC 3442: the gateway/32 on-link, the default route through the
// gateway), hostname, domain name, domain search (RFC 3397, each name in
// full, uncompressed), each split into options of at most 255 bytes
// (RFC 3396), and the end option. There is no MTU option.
func dhcpOptions(c *Config, v *IPv4Config) []byte {
	gw := v.Gateway.As4()
	var b []byte
	b = append(b, optServerID, 4)
	b = append(b, gw[:]...)
	b = append(b, optRouter, 4)
	b = append(b, gw[:]...)
	b = append(b, optSubnetMask, 4, 255, 255, 255, 255)
	b = append(b, optLeaseTime, 4)
	b = binary.BigEndian.AppendUint32(b, DHCPLease)
	if dns := c.DHCP.DNS4; len(dns) > 0 {
		dns = dns[:min(len(dns), dhcpMaxDNS)]
		b = append(b, optDNS, byte(4*len(dns)))
		for _, a := range dns {
			v := a.As4()
			b = append(b, v[:]...)
		}
	}
	var routes []byte
	routes = appendClasslessRoute(routes, netip.PrefixFrom(v.Gateway, 32), netip.IPv4Unspecified())
	routes = appendClasslessRoute(routes, netip.PrefixFrom(netip.IPv4Unspecified(), 0), v.Gateway)
	b = appendSplitOption(b, optClasslessRte, routes)
	if h := c.DHCP.Hostname; !h.IsZero() {
		b = appendSplitOption(b, optHostname, []byte(h.String()))
	}
	if d := c.DHCP.HostDomain; !d.IsZero() {
		b = appendSplitOption(b, optDomainName, []byte(d.String()))
	}
	if len(c.DHCP.Search) > 0 {
		var names []byte
		for _, n := range c.DHCP.Search {
			names = append(names, n.Encoded()...)
		}
		b = appendSplitOption(b, optDomainSearch, names)
	}
	return append(b, optEnd)
}

// appendClasslessRoute appends one RFC 3442 route: the prefix length, the
// significant octets of the destination, the router (OPTE's SubnetRouterPair::encode).
func appendClasslessRoute(b []byte, dst netip.Prefix, router netip.Addr) []byte {
	bits := dst.Bits()
	a, r := dst.Masked().Addr().As4(), router.As4()
	b = append(b, byte(bits))
	b = append(b, a[:(bits+7)/8]...)
	return append(b, r[:]...)
}

// appendSplitOption appends data as options of kind code, 255 bytes of data
// at most in each (OPTE's DhcpOption::emit). Empty data gives no option.
func appendSplitOption(b []byte, code byte, data []byte) []byte {
	for len(data) > 0 {
		n := min(len(data), maxOptLen)
		b = append(b, code, byte(n))
		b = append(b, data[:n]...)
		data = data[n:]
	}
	return b
}

// dhcpReply writes the gateway's OFFER or ACK to req: from the gateway's MAC
// and address (UDP 67 to 68), to the broadcast MAC and address when the
// client set the broadcast flag and to the guest's MAC and private address
// otherwise; IPv4 with ingot's defaults (TTL 128, identification 0, no
// flags); no UDP checksum (OPTE leaves it 0, which IPv4 allows). The
// message: op reply, Ethernet hardware, hops 0, the client's transaction
// id, secs 0, flags 0, ciaddr 0, yiaddr the private address, siaddr the
// gateway, giaddr 0, chaddr the guest's MAC, no server or file name, and
// the options.
func (g *Gateway) dhcpReply(req *dhcpMsg, typ uint8, out []byte) (int, error) {
	msgLen := dhcpHeaderLen + 3 + len(g.dhcpTail)
	const hdr = wire.EthernetLen + wire.IPv4MinLen + wire.UDPLen
	n := hdr + msgLen
	if len(out) < n {
		return 0, wire.ErrShortBuffer
	}
	dstMAC, dstIP := g.cfg.GuestMAC, g.priv4
	if req.broadcast {
		dstMAC, dstIP = broadcastMAC, ipv4Broadcast
	}
	wire.PutEthernet(out, dstMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv4)
	if _, err := wire.PutIPv4(out[wire.EthernetLen:], g.gw4, dstIP, wire.ProtoUDP, wire.UDPLen+msgLen, ttl, 0, false); err != nil {
		return 0, err
	}
	if _, err := wire.PutUDP(out[wire.EthernetLen+wire.IPv4MinLen:], dhcpServerPort, dhcpClientPort, msgLen); err != nil {
		return 0, err
	}
	m := out[hdr:n]
	m[0], m[1], m[2], m[3] = dhcpOpReply, 1, 6, 0
	binary.BigEndian.PutUint32(m[4:8], req.xid)
	clear(m[8:16]) // secs, flags, ciaddr
	yi, si := g.priv4.As4(), g.gw4.As4()
	copy(m[16:20], yi[:])
	copy(m[20:24], si[:])
	clear(m[24:28]) // giaddr
	copy(m[28:34], g.cfg.GuestMAC[:])
	clear(m[34:236]) // the rest of chaddr, sname, file
	binary.BigEndian.PutUint32(m[236:240], dhcpMagic)
	m[240], m[241], m[242] = optMessageType, 1, typ
	copy(m[243:], g.dhcpTail)
	return n, nil
}
