package gateway

import (
	"encoding/binary"
	"net/netip"
	"unicode/utf8"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// DHCPv6 (RFC 8415) as OPTE's Dhcpv6Action answers it (opte
// engine/dhcpv6/{protocol,options}.rs): the guest's private address leased
// for ever, DNS servers, the domain search list and the FQDN on request.
const (
	dhcpv6ServerPort = 547
	dhcpv6ClientPort = 546

	v6Solicit   = 1
	v6Advertise = 2
	v6Request   = 3
	v6Confirm   = 4
	v6Reply     = 7

	v6OptClientID     = 1
	v6OptServerID     = 2
	v6OptIANA         = 3
	v6OptIATA         = 4
	v6OptIAAddr       = 5
	v6OptORO          = 6
	v6OptElapsedTime  = 8
	v6OptStatusCode   = 13
	v6OptRapidCommit  = 14
	v6OptDNSServers   = 23
	v6OptDomainList   = 24
	v6OptSNTPServers  = 31
	v6OptFQDN         = 39
	v6MaxDepth        = 8
	v6Infinite        = 0xffffffff
	v6StatusSuccess   = 0
	v6StatusNotOnLink = 4
)

var (
	allDHCPRelaysAndServers = netip.MustParseAddr("ff02::1:2")
	allDHCPServers          = netip.MustParseAddr("ff05::1:3")
)

// v6Msg is what the gateway needs of a client's DHCPv6 message: the first
// of each option that matters, as offsets into the message.
type v6Msg struct {
	typ            byte
	xid            []byte
	clientID       []byte // the whole option, header included
	serverID       []byte // data only
	hasServerID    bool
	hasElapsed     bool
	iana           []byte // data of the first IA_NA
	hasIANA        bool
	oro            []byte // data of the first option request
	hasORO         bool
	hasDomainList  bool
	hasFQDN        bool
	hasRapidCommit bool
	hasClientID    bool
}

// v6Option reads the option at the start of buf as OPTE's
// Option::from_bytes_with_depth: it returns the option's code, its data,
// and how far the parser moves on, which is 4 for a rapid commit option
// whatever its length (OPTE's quirk: the rest is read as further options).
// IA_NA, IA_TA and IA address options are walked recursively, at most 8
// deep; elapsed time must be 2 bytes, option request and server lists whole
// words and addresses, status messages UTF-8.
func v6Option(buf []byte, depth int) (code uint16, data []byte, adv int, ok bool) {
	if depth > v6MaxDepth || len(buf) < 4 {
		return 0, nil, 0, false
	}
	code = binary.BigEndian.Uint16(buf[0:2])
	n := int(binary.BigEndian.Uint16(buf[2:4]))
	if len(buf) < 4+n {
		return 0, nil, 0, false
	}
	data = buf[4 : 4+n]
	if code == v6OptRapidCommit {
		return code, nil, 4, true
	}
	switch code {
	case v6OptIANA:
		ok = len(data) >= 12 && v6Options(data[12:], depth+1)
	case v6OptIATA:
		ok = len(data) >= 4 && v6Options(data[4:], depth+1)
	case v6OptIAAddr:
		ok = len(data) >= 24 && v6Options(data[24:], depth+1)
	case v6OptORO:
		ok = len(data)%2 == 0
	case v6OptElapsedTime:
		ok = len(data) == 2
	case v6OptStatusCode:
		ok = len(data) >= 2 && utf8.Valid(data[2:])
	case v6OptDNSServers, v6OptSNTPServers:
		ok = len(data)%16 == 0
	default:
		ok = true
	}
	return code, data, 4 + n, ok
}

// v6Options reports whether buf is a well-formed list of options at depth.
func v6Options(buf []byte, depth int) bool {
	for len(buf) > 0 {
		_, _, adv, ok := v6Option(buf, depth)
		if !ok {
			return false
		}
		buf = buf[adv:]
	}
	return true
}

// parseDHCPv6 parses a client message as OPTE's Message::from_bytes: a type,
// a 3-byte transaction id, at least one byte more, and options every one of
// which parses.
func parseDHCPv6(p []byte) (m v6Msg, ok bool) {
	if len(p) <= 4 {
		return v6Msg{}, false
	}
	m.typ, m.xid = p[0], p[1:4]
	for buf := p[4:]; len(buf) > 0; {
		code, data, adv, ok := v6Option(buf, 0)
		if !ok {
			return v6Msg{}, false
		}
		switch {
		case code == v6OptClientID && !m.hasClientID:
			m.clientID, m.hasClientID = buf[:adv], true
		case code == v6OptServerID && !m.hasServerID:
			m.serverID, m.hasServerID = data, true
		case code == v6OptElapsedTime:
			m.hasElapsed = true
		case code == v6OptIANA && !m.hasIANA:
			m.iana, m.hasIANA = data, true
		case code == v6OptORO && !m.hasORO:
			m.oro, m.hasORO = data, true
		case code == v6OptDomainList:
			m.hasDomainList = true
		case code == v6OptFQDN:
			m.hasFQDN = true
		case code == v6OptRapidCommit:
			m.hasRapidCommit = true
		}
		buf = buf[adv:]
	}
	return m, true
}

// requests reports whether the message's (first) option request lists code.
func (m *v6Msg) requests(code uint16) bool {
	for o := m.oro; len(o) >= 2; o = o[2:] {
		if binary.BigEndian.Uint16(o) == code {
			return true
		}
	}
	return false
}

// dhcpv6Options builds the options of replies that depend on the
// configuration alone.
func (g *Gateway) dhcpv6Options() {
	// The server's DUID: link-layer address (type 3), Ethernet (1), its MAC.
	g.serverDUID = [10]byte{0, 3, 0, 1}
	copy(g.serverDUID[4:], g.cfg.GatewayMAC[:])
	d := &g.cfg.DHCP
	g.dns6Opt = appendV6Option(nil, v6OptDNSServers, nil)
	for _, a := range d.DNS6 {
		v := a.As16()
		g.dns6Opt = append(g.dns6Opt, v[:]...)
	}
	binary.BigEndian.PutUint16(g.dns6Opt[2:4], uint16(16*len(d.DNS6)))
	if len(d.Search) > 0 {
		var names []byte
		for _, n := range d.Search {
			names = append(names, n.Encoded()...)
		}
		g.searchOpt = appendV6Option(nil, v6OptDomainList, names)
	}
	if !d.Hostname.IsZero() {
		// Flags: S (the server updates AAAA records) and O (it overrides
		// the client's preference), RFC 4704 §4.1; then the name, the
		// hostname's encoding with the host domain's in place of its root
		// label (OPTE's DhcpCfg::push_fqdn).
		fq := []byte{0b0000_0011}
		fq = append(fq, d.Hostname.Encoded()...)
		if !d.HostDomain.IsZero() {
			fq = append(fq[:len(fq)-1], d.HostDomain.Encoded()...)
		}
		g.fqdnOpt = appendV6Option(nil, v6OptFQDN, fq)
	}
}

func appendV6Option(b []byte, code uint16, data []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

func putV6Option(b []byte, code uint16, n int) int {
	binary.BigEndian.PutUint16(b[0:2], code)
	binary.BigEndian.PutUint16(b[2:4], uint16(n))
	return 4
}

// dhcpv6Answer decides the reply to a client message (OPTE's
// process_client_message): its type, and whether the reply carries the
// leasing options (Solicit and Request) or a status (Confirm). ok is false
// for a message that gets no answer.
func (g *Gateway) dhcpv6Answer(m *v6Msg) (typ byte, status int, ok bool) {
	switch m.typ {
	case v6Solicit:
		if m.hasServerID || !m.hasElapsed || !m.hasClientID {
			return 0, 0, false
		}
		if m.hasRapidCommit || m.requests(v6OptRapidCommit) {
			return v6Reply, -1, true
		}
		return v6Advertise, -1, true
	case v6Request:
		if !m.hasServerID || string(m.serverID) != string(g.serverDUID[:]) ||
			!m.hasElapsed || !m.hasClientID {
			return 0, 0, false
		}
		return v6Reply, -1, true
	case v6Confirm:
		if !m.hasClientID || m.hasServerID || !m.hasElapsed || !m.hasIANA {
			return 0, 0, false
		}
		return g.confirm(m)
	}
	return 0, 0, false
}

// confirm is OPTE's process_confirm_message, quirk included: the addresses
// it checks are those of IA address options inside IA_NA options nested in
// the client's (first) IA_NA, so a Confirm laid out as RFC 8415 has it (IA
// addresses directly in the IA_NA) names no address and gets no answer.
func (g *Gateway) confirm(m *v6Msg) (byte, int, bool) {
	opts := m.iana[12:]
	if len(opts) == 0 {
		return 0, 0, false
	}
	found := false
	for ; len(opts) > 0; opts = opts[v6Adv(opts):] {
		code, data, _, _ := v6Option(opts, 1)
		if code != v6OptIANA {
			continue
		}
		for in := data[12:]; len(in) > 0; in = in[v6Adv(in):] {
			c, d, _, _ := v6Option(in, 2)
			if c != v6OptIAAddr {
				continue
			}
			found = true
			if netip.AddrFrom16([16]byte(d[:16])) != g.priv6 {
				return v6Reply, v6StatusNotOnLink, true
			}
		}
	}
	if !found {
		return 0, 0, false
	}
	return v6Reply, v6StatusSuccess, true
}

// v6Adv is how far the parser moves past the (already validated) option at
// the start of buf.
func v6Adv(buf []byte) int {
	if binary.BigEndian.Uint16(buf[0:2]) == v6OptRapidCommit {
		return 4
	}
	return 4 + int(binary.BigEndian.Uint16(buf[2:4]))
}

const (
	notOnLinkMsg = "Address(es) not on link"
	ianaReplyLen = 4 + 12 + 4 + 24 // IA_NA header and fields, one IA address
)

// dhcpv6Reply answers a DHCPv6 message to the servers (OPTE's
// Dhcpv6Action::gen_packet and generate_reply_options): the server's DUID,
// the client's identifier option as it sent it, then, on request, the DNS
// servers (all of them; an empty list if there are none), the IA_NA with
// its IAID and the private address (T1, T2 and both lifetimes infinite),
// the domain search list (when there is one) and the FQDN (when there is a
// hostname); a Solicit with rapid commit gets a Reply with the rapid commit
// option, without an Advertise. From the gateway's link-local address and
// MAC (UDP 547 to 546) to the client's address and the guest's MAC, hop
// limit 128, the UDP checksum computed. ok is false for no reply.
func (g *Gateway) dhcpv6Reply(b []byte, f *wire.Frame, out []byte) (int, bool, error) {
	m, ok := parseDHCPv6(b[f.PayloadOff:f.L4End])
	if !ok {
		return 0, false, nil
	}
	typ, status, ok := g.dhcpv6Answer(&m)
	if !ok {
		return 0, false, nil
	}
	withDNS := status < 0 && m.requests(v6OptDNSServers)
	withSearch := status < 0 && g.searchOpt != nil && (m.hasDomainList || m.requests(v6OptDomainList))
	withFQDN := status < 0 && g.fqdnOpt != nil && (m.hasFQDN || m.requests(v6OptFQDN))
	rapid := typ == v6Reply && m.typ == v6Solicit

	msgLen := 4 + 4 + len(g.serverDUID) + len(m.clientID)
	switch {
	case status == v6StatusSuccess:
		msgLen += 4 + 2
	case status == v6StatusNotOnLink:
		msgLen += 4 + 2 + len(notOnLinkMsg)
	}
	if withDNS {
		msgLen += len(g.dns6Opt)
	}
	if status < 0 && m.hasIANA {
		msgLen += ianaReplyLen
	}
	if withSearch {
		msgLen += len(g.searchOpt)
	}
	if withFQDN {
		msgLen += len(g.fqdnOpt)
	}
	if rapid {
		msgLen += 4
	}
	const hdr = wire.EthernetLen + wire.IPv6Len + wire.UDPLen
	n := hdr + msgLen
	if len(out) < n {
		return 0, true, wire.ErrShortBuffer
	}
	wire.PutEthernet(out, g.cfg.GuestMAC, g.cfg.GatewayMAC, wire.EtherTypeIPv6)
	if _, err := wire.PutIPv6(out[wire.EthernetLen:], g.gwLL, f.SrcIP, wire.ProtoUDP, wire.UDPLen+msgLen, ttl); err != nil {
		return 0, true, err
	}
	if _, err := wire.PutUDP(out[wire.EthernetLen+wire.IPv6Len:], dhcpv6ServerPort, dhcpv6ClientPort, msgLen); err != nil {
		return 0, true, err
	}
	p := out[hdr:n]
	p[0] = typ
	copy(p[1:4], m.xid)
	i := 4
	i += putV6Option(p[i:], v6OptServerID, len(g.serverDUID))
	i += copy(p[i:], g.serverDUID[:])
	i += copy(p[i:], m.clientID)
	if status >= 0 {
		msg := ""
		if status == v6StatusNotOnLink {
			msg = notOnLinkMsg
		}
		i += putV6Option(p[i:], v6OptStatusCode, 2+len(msg))
		binary.BigEndian.PutUint16(p[i:], uint16(status))
		i += 2
		i += copy(p[i:], msg)
	}
	if withDNS {
		i += copy(p[i:], g.dns6Opt)
	}
	if status < 0 && m.hasIANA {
		i += putV6Option(p[i:], v6OptIANA, ianaReplyLen-4)
		i += copy(p[i:], m.iana[0:4]) // the client's IAID
		binary.BigEndian.PutUint32(p[i:], v6Infinite)
		binary.BigEndian.PutUint32(p[i+4:], v6Infinite)
		i += 8
		i += putV6Option(p[i:], v6OptIAAddr, 24)
		a := g.priv6.As16()
		i += copy(p[i:], a[:])
		binary.BigEndian.PutUint32(p[i:], v6Infinite)
		binary.BigEndian.PutUint32(p[i+4:], v6Infinite)
		i += 8
	}
	if withSearch {
		i += copy(p[i:], g.searchOpt)
	}
	if withFQDN {
		i += copy(p[i:], g.fqdnOpt)
	}
	if rapid {
		putV6Option(p[i:], v6OptRapidCommit, 0)
	}
	udp := out[wire.EthernetLen+wire.IPv6Len : n]
	binary.BigEndian.PutUint16(udp[6:8], wire.L4Checksum(g.gwLL, f.SrcIP, wire.ProtoUDP, udp))
	return n, true, nil
}
