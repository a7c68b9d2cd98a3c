package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/snat"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// VPC.md §4.1-4.3 S6's values.
var (
	tep1   = netip.MustParseAddr("fd00:1122:3344:1::1")
	tep2   = netip.MustParseAddr("fd00:1122:3344:2::1")
	snatIP = netip.MustParseAddr("192.0.2.20")
	ephIP  = netip.MustParseAddr("192.0.2.10")
	fip1   = netip.MustParseAddr("192.0.2.30")
	fip2   = netip.MustParseAddr("192.0.2.31")
	inet   = netip.MustParseAddr("198.51.100.1")
	igwX   = uuid.MustParse("1a5e0c5e-0000-4000-8000-0000000000a1")
	igwY   = uuid.MustParse("1a5e0c5e-0000-4000-8000-0000000000a2")
	any4   = netip.MustParsePrefix("0.0.0.0/0")
)

// clock is a flow tables' clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// natSled is sled A with guest A's port: Nexus's default firewall rules,
// its subnet and 0/0 to igw (the system gateway if nil), external
// addresses ext, v2b 0/0 to the switch's tunnel endpoint (VNI 99).
func natSled(t *testing.T, ext External, igw *uuid.UUID) (*Engine, *Port, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	e, err := New(Config{Underlay: sledA, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.CreatePort(PortConfig{Name: "vnA", VNI: 7777, MAC: macA, IPv4: &IPConfig{Private: ipA, Subnet: subnet}, External: ext})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetFirewall(defaultRules(t)); err != nil {
		t.Fatal(err)
	}
	target := rules.SystemIGW()
	if igw != nil {
		target = rules.InstanceIGW(*igw)
	}
	if err := p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}, {Dest: any4, Target: target}}); err != nil {
		t.Fatal(err)
	}
	if err := e.V2B().Set(any4, mappings.TEP{Addr: tep1, VNI: wire.BoundaryServicesVNI}); err != nil {
		t.Fatal(err)
	}
	return e, p, c
}

func snatOnly(first, last uint16) External {
	return External{IPv4: &ExternalIPs{SNAT: &SNAT{IP: snatIP, First: first, Last: last}}}
}

// boundary checks that r is for the switch as OPTE sends it there: to the
// tunnel endpoint, Geneve VNI 99 with no option, inner destination MAC
// A8:40:25:77:77:77 from the guest's, checksums right. It returns the
// inner frame's parse.
func boundary(t *testing.T, r Result, tep netip.Addr) (wire.Frame, []byte) {
	t.Helper()
	if r.Verdict != ToUnderlay || r.Dst != tep {
		t.Fatalf("%+v (%s): want it to the tunnel endpoint %s", r, r.Reason, tep)
	}
	// The Geneve header, byte for byte: version 0, no option, not
	// critical, Ethernet, VNI 99.
	if want := []byte{0, 0, 0x65, 0x58, 0, 0, 99, 0}; !bytes.Equal(r.Data[:8], want) {
		t.Errorf("Geneve header % x, want % x", r.Data[:8], want)
	}
	var d wire.Decap
	if err := wire.DecapGeneve(r.Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.Geneve.VNI != 99 || d.Geneve.External || d.Geneve.HasMSS || d.InnerOff != wire.GeneveLen {
		t.Errorf("Geneve %+v, inner at %d: want VNI 99 and no option", d.Geneve, d.InnerOff)
	}
	inner := d.Inner(r.Data)
	var f wire.Frame
	if err := wire.Parse(inner, &f); err != nil {
		t.Fatal(err)
	}
	if f.Dst != wire.TunnelEndpointMAC || f.Src != macA {
		t.Errorf("inner MACs %s → %s, want the guest's → %s", f.Src, f.Dst, wire.TunnelEndpointMAC)
	}
	// The outer source port is the hash of the flow after NAT.
	if want := f.FlowKey().Entropy(); r.SrcPort != want {
		t.Errorf("outer source port %d, want the flow's hash %d", r.SrcPort, want)
	}
	if f.L3 == wire.L3IPv4 && !f.IPv4HeaderChecksumValid(inner) || !f.L4ChecksumValid(inner) {
		t.Errorf("checksums wrong after NAT: %+v", f)
	}
	return f, inner
}

// fromSwitch is what the switch sends sled A for a packet from the
// internet (VPC.md §2.5): Geneve VNI 7777 with the External option, the
// inner frame to the guest's MAC from MAC 0.
func fromSwitch(proto uint8, from, to netip.Addr, src16, dst16 uint16, icmpType uint8, payload string) []byte {
	buf := make([]byte, 2048)
	n := frame(buf, macA, from, to, proto, src16, dst16, wire.TCPSyn, payload)
	inner := buf[Headroom : Headroom+n]
	copy(inner[0:6], macA[:])
	copy(inner[6:12], make([]byte, 6))
	if proto == wire.ProtoICMP && icmpType != 8 {
		var f wire.Frame
		wire.Parse(inner, &f)
		inner[34] = icmpType
		f.SetChecksums(inner)
	}
	enc := wire.SwitchEncap(7777, sledA, proto)
	out := make([]byte, 2048)
	m, err := enc.EncapGeneve(out, inner)
	if err != nil {
		panic(err)
	}
	return out[:m]
}

// toGuest checks that r is delivered to the guest from the gateway's MAC,
// checksums right, and returns its parse.
func toGuest(t *testing.T, r Result, p *Port) wire.Frame {
	t.Helper()
	if r.Verdict != ToPort || r.Port != p {
		t.Fatalf("%+v (%s): want it to the guest", r, r.Reason)
	}
	var f wire.Frame
	if err := wire.Parse(r.Data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Src != GatewayMAC || f.Dst != macA || f.L3 == wire.L3IPv4 && !f.IPv4HeaderChecksumValid(r.Data) || !f.L4ChecksumValid(r.Data) {
		t.Errorf("to the guest: %+v", f)
	}
	return f
}

// S6.1: UDP from A to the internet leaves through the switch's tunnel
// endpoint from the SNAT address and a port of its range (the last first,
// as OPTE's pool hands them out); the answer is translated back to A's address and
// port.
func TestSNATOutAndBack(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "to the internet")
	r := e.Outbound(p, buf, n)
	f, inner := boundary(t, r, tep1)
	if f.SrcIP != snatIP || f.SrcPort != 32767 || f.DstIP != inet || f.DstPort != 7 || string(inner[f.PayloadOff:f.L4End]) != "to the internet" {
		t.Errorf("out: %s:%d → %s:%d, want from %s:32767", f.SrcIP, f.SrcPort, f.DstIP, f.DstPort, snatIP)
	}
	in := toGuest(t, e.Inbound(fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 32767, 0, "answer")), p)
	if in.SrcIP != inet || in.SrcPort != 7 || in.DstIP != ipA || in.DstPort != 40000 {
		t.Errorf("back: %s:%d → %s:%d, want to %s:40000", in.SrcIP, in.SrcPort, in.DstIP, in.DstPort, ipA)
	}
	// The flow's next packet takes the same port; another flow the next.
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "again")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcPort != 32767 {
		t.Errorf("the flow's second packet from port %d", f.SrcPort)
	}
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 40001, 7, 0, "another")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcPort != 32766 {
		t.Errorf("another flow from port %d, want 32766", f.SrcPort)
	}
	fl := p.NATFlows()
	if len(fl) != 2 || fl[0].Kind != "snat" || fl[0].External != netip.AddrPortFrom(snatIP, 32767) || fl[0].Hits != 2 {
		t.Errorf("NAT flows %+v", fl)
	}
	// Nothing answers a port no flow has: dropped as NAT's.
	if r := e.Inbound(fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 20000, 0, "x")); r.Reason != ReasonNAT {
		t.Errorf("to an unused SNAT port: %+v", r)
	}
}

// The Geneve payload to the switch, byte for byte, from a fixed frame:
// the Geneve header (VNI 99, no option) and the inner frame with its
// destination MAC, source address and port and checksums rewritten.
func TestBoundaryGolden(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(16384, 16384), nil)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "hi")
	udp := buf[Headroom+34 : Headroom+n]
	binary.BigEndian.PutUint16(udp[6:], wire.L4Checksum(ipA, inet, wire.ProtoUDP, udp)) // the guest's checksum
	r := e.Outbound(p, buf, n)
	want := []byte{
		0x00, 0x00, 0x65, 0x58, 0x00, 0x00, 0x63, 0x00, // Geneve: VNI 99
		0xa8, 0x40, 0x25, 0x77, 0x77, 0x77, 0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01, 0x08, 0x00, // TEP MAC ← A's
		0x45, 0x00, 0x00, 0x1e, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, // IPv4, checksum below
		192, 0, 2, 20, 198, 51, 100, 1,
		0x40, 0x00, 0x00, 0x07, 0x00, 0x0a, 0x00, 0x00, 'h', 'i', // UDP 16384 → 7, checksum below
	}
	ip := want[wire.GeneveLen+14:]
	binary.BigEndian.PutUint16(ip[10:], wire.IPv4HeaderChecksum(ip[:20]))
	binary.BigEndian.PutUint16(ip[26:], wire.L4Checksum(snatIP, inet, wire.ProtoUDP, ip[20:]))
	if r.Verdict != ToUnderlay || !bytes.Equal(r.Data, want) {
		t.Errorf("to the switch (%s):\n got % x\nwant % x", r.Reason, r.Data, want)
	}
}

// OPTE's priorities: floating (one of several by the CRC32 of the flow)
// before ephemeral before SNAT; each change of the addresses is seen by
// new flows.
func TestNATPriorities(t *testing.T) {
	ext := External{IPv4: &ExternalIPs{SNAT: &SNAT{IP: snatIP, First: 16384, Last: 32767}, Ephemeral: ephIP, Floating: []netip.Addr{fip1, fip2}}}
	e, p, _ := natSled(t, ext, nil)
	buf := make([]byte, 2048)
	seen := map[netip.Addr]int{}
	for port := uint16(40000); port < 40016; port++ {
		n := frame(buf, macA, ipA, inet, wire.ProtoUDP, port, 7, 0, "x")
		key := wire.FlowKey{Proto: wire.ProtoUDP, Src: ipA, Dst: inet, SrcPort: port, DstPort: 7}
		f, _ := boundary(t, e.Outbound(p, buf, n), tep1)
		want := []netip.Addr{fip1, fip2}[key.CRC32()%2]
		if f.SrcIP != want || f.SrcPort != port {
			t.Errorf("port %d: from %s:%d, want %s:%d", port, f.SrcIP, f.SrcPort, want, port)
		}
		seen[f.SrcIP]++
	}
	if len(seen) != 2 {
		t.Errorf("floating addresses used: %v, want both", seen)
	}
	ext.IPv4.Floating = nil
	if err := p.SetExternalIPs(ext); err != nil {
		t.Fatal(err)
	}
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 41000, 7, 0, "x")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != ephIP || f.SrcPort != 41000 {
		t.Errorf("ephemeral: from %s:%d", f.SrcIP, f.SrcPort)
	}
	ext.IPv4.Ephemeral = netip.Addr{}
	if err := p.SetExternalIPs(ext); err != nil {
		t.Fatal(err)
	}
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 41001, 7, 0, "x")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != snatIP || f.SrcPort != 32767 {
		t.Errorf("SNAT: from %s:%d", f.SrcIP, f.SrcPort)
	}
	if got := p.ExternalIPs(); !got.Equal(ext) {
		t.Errorf("ExternalIPs %+v, want %+v", got, ext)
	}
}

// Which gateway an address may leave through: a route to the system
// gateway takes addresses the gateway map does not hold; a route to an
// instance's gateway, those mapped to it; nothing usable drops the flow
// (OPTE's priority-255 deny).
func TestInternetGatewayMatching(t *testing.T) {
	buf := make([]byte, 2048)
	send := func(e *Engine, p *Port, port uint16) Result {
		n := frame(buf, macA, ipA, inet, wire.ProtoUDP, port, 7, 0, "x")
		return e.Outbound(p, buf, n)
	}
	// ig=X, the SNAT address untagged: dropped.
	e, p, _ := natSled(t, snatOnly(16384, 32767), &igwX)
	if r := send(e, p, 40000); r.Reason != ReasonNAT {
		t.Errorf("ig=X, untagged SNAT: %+v", r)
	}
	// Tagged X: out.
	ext := snatOnly(16384, 32767)
	ext.Gateways = map[netip.Addr][]uuid.UUID{snatIP: {igwX}}
	p.SetExternalIPs(ext)
	if f, _ := boundary(t, send(e, p, 40001), tep1); f.SrcIP != snatIP {
		t.Errorf("ig=X, SNAT tagged X: from %s", f.SrcIP)
	}
	// The system gateway does not take an address tagged X.
	e, p, _ = natSled(t, ext, nil)
	if r := send(e, p, 40002); r.Reason != ReasonNAT {
		t.Errorf("system, SNAT tagged X: %+v", r)
	}
	// ig=X: the ephemeral address tagged Y is passed over for SNAT
	// tagged X; a floating address tagged X wins over an untagged one.
	ext = External{IPv4: &ExternalIPs{SNAT: &SNAT{IP: snatIP, First: 16384, Last: 32767}, Ephemeral: ephIP}, Gateways: map[netip.Addr][]uuid.UUID{snatIP: {igwX}, ephIP: {igwY}}}
	e, p, _ = natSled(t, ext, &igwX)
	if f, _ := boundary(t, send(e, p, 40003), tep1); f.SrcIP != snatIP {
		t.Errorf("ig=X, ephemeral tagged Y: from %s, want the SNAT address", f.SrcIP)
	}
	ext.IPv4.Floating = []netip.Addr{fip1, fip2}
	ext.Gateways[fip2] = []uuid.UUID{igwY, igwX}
	p.SetExternalIPs(ext)
	for port := uint16(40010); port < 40020; port++ {
		if f, _ := boundary(t, send(e, p, port), tep1); f.SrcIP != fip2 {
			t.Errorf("ig=X: from %s, want the floating address tagged X", f.SrcIP)
		}
	}
	if st := p.Stats(); st.Dropped["no external address for the flow"] != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Each protocol has its own ports: when one runs dry its new flows are
// dropped and counted, the others' go on; an ICMP echo's identifier is
// its port, translated back on the reply; other ICMP does not begin an
// SNAT flow.
func TestSNATExhaustionAndEcho(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(1000, 1001), nil)
	buf := make([]byte, 2048)
	for _, c := range []struct {
		proto uint8
		flags uint8
	}{{wire.ProtoUDP, 0}, {wire.ProtoTCP, wire.TCPSyn}, {wire.ProtoICMP, 0}} {
		for i := uint16(0); i < 3; i++ {
			n := frame(buf, macA, ipA, inet, c.proto, 50000+i, 7, c.flags, "x")
			r := e.Outbound(p, buf, n)
			if i == 2 {
				if r.Reason != ReasonSNATExhausted {
					t.Errorf("proto %d, third flow: %+v, want SNAT exhausted", c.proto, r)
				}
				continue
			}
			f, _ := boundary(t, r, tep1)
			got := f.SrcPort
			if c.proto == wire.ProtoICMP {
				got = f.EchoID
				if f.EchoSeq != 7 {
					t.Errorf("echo sequence %d", f.EchoSeq)
				}
			}
			if got != 1001-i {
				t.Errorf("proto %d flow %d: port %d, want %d", c.proto, i, got, 1001-i)
			}
		}
	}
	if st := p.Stats(); st.Dropped["SNAT ports exhausted"] != 3 {
		t.Errorf("stats %+v", st)
	}
	// The echo reply to identifier 1001 is the guest's identifier 50000.
	in := toGuest(t, e.Inbound(fromSwitch(wire.ProtoICMP, inet, snatIP, 1001, 7, 0, "x")), p)
	if in.DstIP != ipA || in.ICMPType != 0 || in.EchoID != 50000 || in.EchoSeq != 7 {
		t.Errorf("echo reply to the guest: %+v", in)
	}
	// An ICMP message other than an echo request begins no flow.
	n := frame(buf, macA, ipA, inet, wire.ProtoICMP, 1, 1, 0, "x")
	buf[Headroom+34] = 13 // timestamp
	var f wire.Frame
	wire.Parse(buf[Headroom:Headroom+n], &f)
	f.SetChecksums(buf[Headroom : Headroom+n])
	if r := e.Outbound(p, buf, n); r.Reason != ReasonNAT {
		t.Errorf("ICMP timestamp through SNAT: %+v", r)
	}
	if pool := p.nat.Load().v4.pool; pool.InUse(snat.ICMP) != 2 || pool.InUse(snat.UDP) != 2 || pool.InUse(snat.TCP) != 2 {
		t.Errorf("ports in use: icmp %d udp %d tcp %d", pool.InUse(snat.ICMP), pool.InUse(snat.UDP), pool.InUse(snat.TCP))
	}
}

// A NAT flow lives while either direction is used, both keys together;
// idle 60 s it goes and gives its port back, and an answer after that
// finds nothing.
func TestNATExpiryReleasesPorts(t *testing.T) {
	e, p, clk := natSled(t, snatOnly(1000, 1000), nil)
	pool := p.nat.Load().v4.pool
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "x")
	boundary(t, e.Outbound(p, buf, n), tep1)
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 40001, 7, 0, "x")
	if r := e.Outbound(p, buf, n); r.Reason != ReasonSNATExhausted {
		t.Fatalf("a second flow on one port: %+v", r)
	}
	// Answers alone keep the flow: 50 s on, one comes; at 70 s the
	// flow is still there.
	clk.add(50 * time.Second)
	toGuest(t, e.Inbound(fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 1000, 0, "a")), p)
	clk.add(20 * time.Second)
	e.Expire()
	if pool.InUse(snat.UDP) != 1 || len(p.NATFlows()) != 1 {
		t.Fatalf("at 70 s, 20 s after an answer: %d ports in use, flows %+v", pool.InUse(snat.UDP), p.NATFlows())
	}
	clk.add(40 * time.Second)
	if got := e.Expire(); got < 1 {
		t.Errorf("Expire: %d flows", got)
	}
	if pool.InUse(snat.UDP) != 0 || len(p.NATFlows()) != 0 || p.natFlows.Len() != 0 {
		t.Fatalf("60 s idle: %d ports in use, %d entries", pool.InUse(snat.UDP), p.natFlows.Len())
	}
	if r := e.Inbound(fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 1000, 0, "late")); r.Reason != ReasonNAT {
		t.Errorf("an answer after the flow went: %+v", r)
	}
	// The port is free again: the other flow gets it.
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcPort != 1000 {
		t.Errorf("after expiry: port %d", f.SrcPort)
	}
}

// S6.2: with an ephemeral address the internet reaches the guest where
// the firewall allows (TCP 22, ICMP; no VNI tag on what the switch sends),
// not elsewhere (UDP 5000); the guest's answers and its own flows leave
// from the ephemeral address.
func TestEphemeralInbound(t *testing.T) {
	ext := snatOnly(16384, 32767)
	ext.IPv4.Ephemeral = ephIP
	e, p, _ := natSled(t, ext, nil)
	in := toGuest(t, e.Inbound(fromSwitch(wire.ProtoTCP, inet, ephIP, 55555, 22, 0, "syn")), p)
	if in.SrcIP != inet || in.DstIP != ipA || in.DstPort != 22 || in.SrcPort != 55555 {
		t.Errorf("TCP 22 to the ephemeral address: %+v", in)
	}
	in = toGuest(t, e.Inbound(fromSwitch(wire.ProtoICMP, inet, ephIP, 9, 1, 8, "ping")), p)
	if in.DstIP != ipA || in.EchoID != 9 {
		t.Errorf("ping to the ephemeral address: %+v", in)
	}
	if r := e.Inbound(fromSwitch(wire.ProtoUDP, inet, ephIP, 55555, 5000, 0, "x")); r.Reason != ReasonFirewall {
		t.Errorf("UDP 5000 to the ephemeral address: %+v", r)
	}
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoTCP, 22, 55555, wire.TCPSyn|wire.TCPAck, "")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != ephIP || f.SrcPort != 22 {
		t.Errorf("the answer leaves from %s:%d", f.SrcIP, f.SrcPort)
	}
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "x")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != ephIP || f.SrcPort != 40000 {
		t.Errorf("a new flow leaves from %s:%d", f.SrcIP, f.SrcPort)
	}
	// The ephemeral address's flow never goes into the VPC: a peer of
	// the subnet that reached it through the switch is not answered
	// over the underlay.
	peer := netip.MustParseAddr("172.30.1.9")
	toGuest(t, e.Inbound(fromSwitch(wire.ProtoTCP, peer, ephIP, 44444, 22, 0, "syn")), p)
	n = frame(buf, macA, ipA, peer, wire.ProtoTCP, 22, 44444, wire.TCPSyn|wire.TCPAck, "")
	if r := e.Outbound(p, buf, n); r.Reason != ReasonExternalToVPC {
		t.Errorf("an answer from the ephemeral address into the VPC: %+v", r)
	}
}

// The boundary path: no v2b entry for the destination drops; with two
// tunnel endpoints a flow goes to the one its hash after NAT picks.
func TestBoundaryTunnelEndpoints(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	e.V2B().Remove(any4, mappings.TEP{Addr: tep1})
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "x")
	if r := e.Outbound(p, buf, n); r.Reason != ReasonNoV2B {
		t.Fatalf("without v2b: %+v", r)
	}
	e.V2B().Set(any4, mappings.TEP{Addr: tep2, VNI: 99}, mappings.TEP{Addr: tep1, VNI: 99})
	seen := map[netip.Addr]bool{}
	for port := uint16(40001); port < 40017; port++ {
		n := frame(buf, macA, ipA, inet, wire.ProtoUDP, port, 7, 0, "x")
		r := e.Outbound(p, buf, n)
		var d wire.Decap
		wire.DecapGeneve(r.Data, &d)
		var f wire.Frame
		wire.Parse(d.Inner(r.Data), &f)
		want := []netip.Addr{tep1, tep2}[f.FlowKey().CRC32()%2] // ordered by address
		boundary(t, r, want)
		seen[r.Dst] = true
	}
	if len(seen) != 2 {
		t.Errorf("endpoints used: %v", seen)
	}
}

// SetExternalIPs: OPTE refuses addresses of a family the port lacks; a
// flow whose address stays goes on (an SNAT flow on its port), one whose
// address went is decided again.
func TestSetExternalIPs(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	bad := []External{
		{IPv6: &ExternalIPs{Ephemeral: netip.MustParseAddr("2001:db8::1")}},
		{IPv4: &ExternalIPs{Ephemeral: netip.MustParseAddr("2001:db8::1")}},
		{IPv4: &ExternalIPs{SNAT: &SNAT{IP: snatIP, First: 2, Last: 1}}},
		{IPv4: &ExternalIPs{Floating: []netip.Addr{{}}}},
	}
	for _, b := range bad {
		if err := p.SetExternalIPs(b); !errors.Is(err, ErrExternalIPs) {
			t.Errorf("%+v: %v", b, err)
		}
	}
	if !p.ExternalIPs().Equal(snatOnly(16384, 32767)) {
		t.Errorf("a refused change changed %+v", p.ExternalIPs())
	}
	buf := make([]byte, 2048)
	send := func(port uint16) wire.Frame {
		n := frame(buf, macA, ipA, inet, wire.ProtoUDP, port, 7, 0, "x")
		f, _ := boundary(t, e.Outbound(p, buf, n), tep1)
		return f
	}
	send(40000)
	send(40001)
	// The same SNAT again, with an ephemeral address: SNAT flows keep
	// their ports (and answers reach them); new flows use the ephemeral.
	ext := snatOnly(16384, 32767)
	ext.IPv4.Ephemeral = ephIP
	p.SetExternalIPs(ext)
	toGuest(t, e.Inbound(fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 32767, 0, "a")), p)
	if f := send(40001); f.SrcIP != snatIP || f.SrcPort != 32766 {
		t.Errorf("an SNAT flow after the change: %s:%d", f.SrcIP, f.SrcPort)
	}
	if f := send(40002); f.SrcIP != ephIP {
		t.Errorf("a new flow: from %s", f.SrcIP)
	}
	// Another SNAT address: the old flows go, their ports given back.
	old := p.nat.Load().v4.pool
	ext.IPv4.SNAT.IP = netip.MustParseAddr("192.0.2.21")
	ext.IPv4.Ephemeral = netip.Addr{}
	p.SetExternalIPs(ext)
	if f := send(40000); f.SrcIP != ext.IPv4.SNAT.IP || f.SrcPort != 32767 {
		t.Errorf("after the SNAT address changed: %s:%d", f.SrcIP, f.SrcPort)
	}
	if f := send(40002); f.SrcIP != ext.IPv4.SNAT.IP {
		t.Errorf("the ephemeral flow after its address went: from %s", f.SrcIP)
	}
	if old.InUse(snat.UDP) != 1 { // 40001's, not used since
		t.Errorf("old pool: %d ports in use", old.InUse(snat.UDP))
	}
	if r := e.Inbound(fromSwitch(wire.ProtoUDP, inet, ephIP, 7, 40002, 0, "a")); r.Verdict != Drop {
		t.Errorf("to the former ephemeral address: %+v", r)
	}
}

// An established SNAT flow's packets to the switch and its answers back.
func BenchmarkSNATOutboundEstablished(b *testing.B) {
	t := &testing.T{}
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, string(make([]byte, 1400)))
	keep := append([]byte(nil), buf[Headroom:Headroom+n]...)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		copy(buf[Headroom:], keep)
		if r := e.Outbound(p, buf, n); r.Verdict != ToUnderlay {
			b.Fatal(r.Reason)
		}
	}
}

func BenchmarkSNATInboundEstablished(b *testing.B) {
	t := &testing.T{}
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "x")
	e.Outbound(p, buf, n)
	pkt := fromSwitch(wire.ProtoUDP, inet, snatIP, 7, 32767, 0, string(make([]byte, 1400)))
	work := make([]byte, len(pkt))
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		copy(work, pkt)
		if r := e.Inbound(work); r.Verdict != ToPort {
			b.Fatal(r.Reason)
		}
	}
}

// frame6 writes at buf[Headroom:] an IPv6 frame: an ICMPv6 echo (type
// typ, identifier id) or a UDP datagram, checksums right.
func frame6(buf []byte, dst, src wire.MAC, from, to netip.Addr, proto uint8, typ uint8, a, b uint16) int {
	f := buf[Headroom:]
	wire.PutEthernet(f, dst, src, wire.EtherTypeIPv6)
	wire.PutIPv6(f[14:], from, to, proto, 8+4, 64)
	h := f[54:]
	if proto == wire.ProtoUDP {
		wire.PutUDP(h, a, b, 4)
	} else {
		h[0], h[1] = typ, 0
		binary.BigEndian.PutUint16(h[4:], a)
		binary.BigEndian.PutUint16(h[6:], b)
	}
	copy(h[8:], "ping")
	n := 54 + 12
	var p wire.Frame
	if err := wire.Parse(f[:n], &p); err != nil {
		panic(err)
	}
	binary.BigEndian.PutUint16(h[wire.L4ChecksumOffset(proto):], wire.L4Checksum(from, to, proto, h[:12]))
	return n
}

// Each family has its own addresses: on a dual-stack port an IPv6 flow
// takes the IPv6 SNAT address and an ICMPv6 echo identifier of its pool,
// translated back on the reply, while IPv4 flows use the IPv4 ephemeral
// address.
func TestNATPerFamily(t *testing.T) {
	priv6, sub6 := netip.MustParseAddr("fd00:7777::5"), netip.MustParsePrefix("fd00:7777::/64")
	snat6, inet6 := netip.MustParseAddr("2001:db8::20"), netip.MustParseAddr("2001:db8:1::1")
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	e, _ := New(Config{Underlay: sledA, Now: c.Now})
	ext := External{
		IPv4: &ExternalIPs{Ephemeral: ephIP},
		IPv6: &ExternalIPs{SNAT: &SNAT{IP: snat6, First: 100, Last: 200}},
	}
	p, err := e.CreatePort(PortConfig{Name: "vnA", VNI: 7777, MAC: macA, IPv4: &IPConfig{Private: ipA, Subnet: subnet},
		IPv6: &IPConfig{Private: priv6, Subnet: sub6}, External: ext})
	if err != nil {
		t.Fatal(err)
	}
	p.SetFirewall(defaultRules(t))
	p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: any4, Target: rules.SystemIGW()}, {Dest: netip.MustParsePrefix("::/0"), Target: rules.SystemIGW()}})
	e.V2B().Set(any4, mappings.TEP{Addr: tep1, VNI: 99})
	e.V2B().Set(netip.MustParsePrefix("::/0"), mappings.TEP{Addr: tep2, VNI: 99})

	buf := make([]byte, 2048)
	n := frame6(buf, GatewayMAC, macA, priv6, inet6, wire.ProtoICMPv6, wire.ICMPv6EchoRequest, 4242, 1)
	f, _ := boundary(t, e.Outbound(p, buf, n), tep2)
	if f.SrcIP != snat6 || !f.IsEcho || f.EchoID != 200 {
		t.Errorf("ICMPv6 echo out: from %s id %d, want %s id 200", f.SrcIP, f.EchoID, snat6)
	}
	// The reply, as the switch sends it.
	n = frame6(buf, macA, wire.MAC{}, inet6, snat6, wire.ProtoICMPv6, wire.ICMPv6EchoReply, 200, 1)
	pkt := make([]byte, 256)
	enc := wire.SwitchEncap(7777, sledA, wire.ProtoICMPv6)
	m, _ := enc.EncapGeneve(pkt, buf[Headroom:Headroom+n])
	in := toGuest(t, e.Inbound(pkt[:m]), p)
	if in.DstIP != priv6 || in.EchoID != 4242 || in.ICMPType != wire.ICMPv6EchoReply {
		t.Errorf("ICMPv6 echo reply: %+v", in)
	}
	n = frame(buf, macA, ipA, inet, wire.ProtoUDP, 40000, 7, 0, "x")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != ephIP || f.SrcPort != 40000 {
		t.Errorf("IPv4: from %s:%d, want the ephemeral address", f.SrcIP, f.SrcPort)
	}
	// UDP over IPv6 takes a UDP port of the IPv6 pool.
	n = frame6(buf, GatewayMAC, macA, priv6, inet6, wire.ProtoUDP, 0, 5353, 53)
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep2); f.SrcIP != snat6 || f.SrcPort != 200 {
		t.Errorf("UDP over IPv6: from [%s]:%d", f.SrcIP, f.SrcPort)
	}
}

// icmpError writes at buf[Headroom:] an ICMP destination unreachable (code
// code) from `from` to `to`, quoting the IPv4 header of a UDP packet
// qsrc → qdst and its first 8 bytes, checksums right; MACs dst ← src.
func icmpError(buf []byte, dst, src wire.MAC, from, to netip.Addr, code uint8, qsrc, qdst netip.Addr) int {
	b := buf[Headroom:]
	wire.PutEthernet(b, dst, src, wire.EtherTypeIPv4)
	wire.PutIPv4(b[14:], from, to, wire.ProtoICMP, 8+28, 64, 1, false)
	h := b[34:]
	h[0], h[1] = 3, code
	clear(h[2:8])
	q := h[8:]
	wire.PutIPv4(q, qsrc, qdst, wire.ProtoUDP, 8, 64, 2, true)
	binary.BigEndian.PutUint16(q[10:], wire.IPv4HeaderChecksum(q[:20]))
	wire.PutUDP(q[20:], 40000, 7, 0)
	n := 34 + 8 + 28
	var f wire.Frame
	wire.Parse(b[:n], &f)
	f.SetChecksums(b[:n])
	return n
}

// quoted checks an ICMP error's quoted IPv4 header: its addresses and its
// checksum.
func quoted(t *testing.T, b []byte, f wire.Frame, src, dst netip.Addr) {
	t.Helper()
	q := b[f.PayloadOff:]
	if got, want := netip.AddrFrom4([4]byte(q[12:16])), src; got != want {
		t.Errorf("quoted source %s, want %s", got, want)
	}
	if got, want := netip.AddrFrom4([4]byte(q[16:20])), dst; got != want {
		t.Errorf("quoted destination %s, want %s", got, want)
	}
	if wire.Fold(wire.Sum(q[:20], 0)) != 0 {
		t.Error("quoted header checksum wrong")
	}
}

// The packet an ICMP error quotes is translated with a 1:1 flow, as
// OPTE's body transform does: a router's "fragmentation needed" about the
// guest's packet from its ephemeral address reaches the guest quoting its
// private address, and the guest's "port unreachable" leaves quoting the
// ephemeral one; checksums right.
func TestICMPErrorsQuoteTranslated(t *testing.T) {
	ext := snatOnly(16384, 32767)
	ext.IPv4.Ephemeral = ephIP
	e, p, _ := natSled(t, ext, nil)
	router := netip.MustParseAddr("203.0.113.1")
	buf := make([]byte, 2048)
	n := icmpError(buf, macA, wire.MAC{}, router, ephIP, 4, ephIP, inet)
	pkt := make([]byte, 256)
	enc := wire.SwitchEncap(7777, sledA, wire.ProtoICMP)
	m, _ := enc.EncapGeneve(pkt, buf[Headroom:Headroom+n])
	r := e.Inbound(pkt[:m])
	in := toGuest(t, r, p)
	if in.DstIP != ipA || in.ICMPType != 3 || in.ICMPCode != 4 {
		t.Errorf("to the guest: %+v", in)
	}
	quoted(t, r.Data, in, ipA, inet)

	n = icmpError(buf, GatewayMAC, macA, ipA, inet, 3, inet, ipA)
	r = e.Outbound(p, buf, n)
	f, inner := boundary(t, r, tep1)
	if f.SrcIP != ephIP || f.ICMPType != 3 {
		t.Errorf("out: %+v", f)
	}
	quoted(t, inner, f, inet, ephIP)
}
