package engine

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// VPC.md §4.2's fixed values.
var (
	sledA  = netip.MustParseAddr("fd00:1122:3344:101::1")
	sledB  = netip.MustParseAddr("fd00:1122:3344:102::1")
	ipA    = netip.MustParseAddr("172.30.0.5")
	ipB    = netip.MustParseAddr("172.30.0.6")
	macA   = wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
	macB   = wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x02}
	macD   = wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x04}
	subnet = netip.MustParsePrefix("172.30.0.0/22")
)

const nics = `[
 {"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},"name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0},
 {"id":"b0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"b0000000-0000-4000-8000-000000000001"},"name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.6","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"A8:40:25:F0:00:02","vni":7777,"primary":true,"slot":0}]`

// defaultRules is Nexus's defaults for a new VPC (VPC.md §4.2).
func defaultRules(t testing.TB) []rules.FirewallRule {
	return firewallRules(t, `[
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_protocols":[{"type":"icmp","value":null}],"action":"allow","priority":65534}]`)
}

func firewallRules(t testing.TB, doc string) []rules.FirewallRule {
	t.Helper()
	var rs []rules.FirewallRule
	if err := json.Unmarshal([]byte(doc), &rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

// sled is one sled's engine with a port of VPC1, its system routes and the
// v2p mappings of both guests (VPC.md S1-S3).
func sled(t testing.TB, underlay netip.Addr, name string, mac wire.MAC, ip netip.Addr) (*Engine, *Port) {
	t.Helper()
	e, err := New(Config{Underlay: underlay})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.CreatePort(PortConfig{Name: name, VNI: 7777, MAC: mac, IPv4: &IPConfig{Private: ip, Subnet: subnet}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetFirewall(defaultRules(t)); err != nil {
		t.Fatal(err)
	}
	if err := p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}}); err != nil {
		t.Fatal(err)
	}
	e.V2P().Set(7777, ipA, mappings.Phys{MAC: macA, Sled: sledA})
	e.V2P().Set(7777, ipB, mappings.Phys{MAC: macB, Sled: sledB})
	return e, p
}

// frame writes at buf[Headroom:] a guest's IPv4 frame to the gateway's MAC
// with an L4 header of proto (ICMP echo request id/seq, or TCP/UDP ports
// src and dst) and payload, checksums right, and returns its length.
func frame(buf []byte, src wire.MAC, from, to netip.Addr, proto uint8, src16, dst16 uint16, tcpFlags uint8, payload string) int {
	b := buf[Headroom:]
	l4 := 8
	if proto == wire.ProtoTCP {
		l4 = 20
	}
	wire.PutEthernet(b, GatewayMAC, src, wire.EtherTypeIPv4)
	wire.PutIPv4(b[14:], from, to, proto, l4+len(payload), 64, 1, true)
	h := b[34:]
	switch proto {
	case wire.ProtoICMP:
		h[0], h[1] = 8, 0
		binary.BigEndian.PutUint16(h[4:], src16)
		binary.BigEndian.PutUint16(h[6:], dst16)
	case wire.ProtoUDP:
		wire.PutUDP(h, src16, dst16, len(payload))
	case wire.ProtoTCP:
		binary.BigEndian.PutUint16(h[0:], src16)
		binary.BigEndian.PutUint16(h[2:], dst16)
		h[12] = 5 << 4
		h[13] = tcpFlags
		binary.BigEndian.PutUint16(h[14:], 64240)
	}
	copy(h[l4:], payload)
	n := 34 + l4 + len(payload)
	var f wire.Frame
	if err := wire.Parse(b[:n], &f); err != nil {
		panic(err)
	}
	f.SetChecksums(b[:n])
	return n
}

// carry sends a guest's frame from sender's sled to the other's, as the
// data path's I/O would, and returns what each engine decided.
func carry(t *testing.T, from *Engine, p *Port, buf []byte, n int, to *Engine) (out, in Result) {
	t.Helper()
	out = from.Outbound(p, buf, n)
	if out.Verdict != ToUnderlay {
		return out, Result{}
	}
	pkt := append([]byte(nil), out.Data...) // as the other sled reads it
	return out, to.Inbound(pkt)
}

// S3: with routes and v2p, A's ICMP echo, UDP and TCP reach B across the
// underlay as OPTE sends them: Geneve VNI 7777 from A's sled to B's, the MSS
// option on TCP only, inner MACs A → B; B gets them from the gateway's MAC.
func TestAcrossSleds(t *testing.T) {
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	eb, pb := sled(t, sledB, "vnB", macB, ipB)
	buf := make([]byte, 2048)
	for _, c := range []struct {
		name     string
		proto    uint8
		src, dst uint16
		flags    uint8
		mss      bool
	}{
		{"icmp", wire.ProtoICMP, 7, 1, 0, false},
		{"udp", wire.ProtoUDP, 40000, 5000, 0, false},
		{"tcp", wire.ProtoTCP, 40001, 22, 0x02, true},
	} {
		n := frame(buf, macA, ipA, ipB, c.proto, c.src, c.dst, c.flags, "hello "+c.name)
		out, in := carry(t, ea, pa, buf, n, eb)
		if out.Verdict != ToUnderlay || out.Dst != sledB {
			t.Fatalf("%s: A's sled: %+v (%s), want it to B's sled", c.name, out, out.Reason)
		}
		var d wire.Decap
		if err := wire.DecapGeneve(out.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.Geneve.VNI != 7777 || d.Geneve.HasMSS != c.mss || d.Geneve.External {
			t.Errorf("%s: Geneve %+v: want VNI 7777, MSS option %v", c.name, d.Geneve, c.mss)
		}
		var f wire.Frame
		wire.Parse(d.Inner(out.Data), &f)
		if f.Dst != macB || f.Src != macA {
			t.Errorf("%s: inner MACs %s → %s, want A's → B's", c.name, f.Src, f.Dst)
		}
		if want := f.FlowKey().Entropy(); out.SrcPort != want || want == 0 {
			t.Errorf("%s: outer source port %d, want the flow's hash %d", c.name, out.SrcPort, want)
		}
		if in.Verdict != ToPort || in.Port != pb {
			t.Fatalf("%s: B's sled: %+v (%s), want it to B", c.name, in, in.Reason)
		}
		wire.Parse(in.Data, &f)
		if f.Src != GatewayMAC || f.Dst != macB || f.SrcIP != ipA || string(in.Data[f.PayloadOff:f.L4End]) != "hello "+c.name {
			t.Errorf("%s: B got %+v", c.name, f)
		}
	}
	if st := pb.Stats(); st.InPackets != 3 || len(st.Dropped) != 0 {
		t.Errorf("B's stats %+v", st)
	}
}

// S1, S2: no route, then no v2p mapping: A → B is dropped, for that reason.
func TestNoRouteNoMapping(t *testing.T) {
	e, err := New(Config{Underlay: sledA})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := e.CreatePort(PortConfig{Name: "vnA", VNI: 7777, MAC: macA, IPv4: &IPConfig{Private: ipA, Subnet: subnet}})
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, ipB, wire.ProtoUDP, 40000, 5000, 0, "x")
	if r := e.Outbound(p, buf, n); r.Verdict != Drop || r.Reason != ReasonNoRoute {
		t.Errorf("without routes: %+v", r)
	}
	p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}})
	n = frame(buf, macA, ipA, ipB, wire.ProtoUDP, 40000, 5000, 0, "x")
	if r := e.Outbound(p, buf, n); r.Verdict != Drop || r.Reason != ReasonNoV2P {
		t.Errorf("without v2p: %+v", r)
	}
	// The internet gateway with no external address: NAT drops it.
	p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: netip.MustParsePrefix("0.0.0.0/0"), Target: rules.SystemIGW()}})
	n = frame(buf, macA, ipA, netip.MustParseAddr("8.8.8.8"), wire.ProtoUDP, 40000, 53, 0, "x")
	if r := e.Outbound(p, buf, n); r.Reason != ReasonNAT {
		t.Errorf("to the internet: %+v", r)
	}
	if st := p.Stats(); st.Dropped["no route"] != 1 || st.Dropped["no v2p mapping"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// Anti-spoofing: a guest sends from its own MAC and address only, and gets
// only what is for them; gateway traffic is not passed on.
func TestSpoofAndGateway(t *testing.T) {
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	buf := make([]byte, 2048)
	n := frame(buf, macD, ipA, ipB, wire.ProtoUDP, 1, 2, 0, "x")
	if r := ea.Outbound(pa, buf, n); r.Reason != ReasonSpoof {
		t.Errorf("another MAC: %+v", r)
	}
	n = frame(buf, macA, ipB, ipB, wire.ProtoUDP, 1, 2, 0, "x")
	if r := ea.Outbound(pa, buf, n); r.Reason != ReasonSpoof {
		t.Errorf("another address: %+v", r)
	}
	// The gateway answers the guest's ping, and its ARP for the gateway,
	// from the gateway's MAC (internal/vpc/gateway has their bytes).
	gw := netip.MustParseAddr("172.30.0.1")
	n = frame(buf, macA, ipA, gw, wire.ProtoICMP, 1, 1, 0, "x")
	r := ea.Outbound(pa, buf, n)
	var f wire.Frame
	if r.Verdict != ToPort || r.Port != pa || wire.Parse(r.Data, &f) != nil || f.Src != GatewayMAC || f.SrcIP != gw || f.ICMPType != 0 {
		t.Errorf("ping the gateway: %+v %+v", r, f)
	}
	b := buf[Headroom:]
	wire.PutEthernet(b, wire.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA, wire.EtherTypeARP)
	wire.PutARP(b[14:], &wire.ARP{Op: wire.ARPRequest, SenderMAC: macA, SenderIP: ipA, TargetIP: gw})
	r = ea.Outbound(pa, buf, 42)
	if r.Verdict != ToPort || wire.Parse(r.Data, &f) != nil || f.L3 != wire.L3ARP || f.ARP.SenderMAC != GatewayMAC {
		t.Errorf("ARP for the gateway: %+v %+v", r, f)
	}
	// ARP for another guest is the gateway's to drop.
	wire.PutARP(b[14:], &wire.ARP{Op: wire.ARPRequest, SenderMAC: macA, SenderIP: ipA, TargetIP: ipB})
	if r = ea.Outbound(pa, buf, 42); r.Reason != ReasonGateway {
		t.Errorf("ARP for another guest: %+v", r)
	}
}

// S4: the firewall. With only allow-ssh inbound, B takes TCP 22 and its
// replies flow back (stateful), not ICMP or UDP; a deny at priority 100 beats
// an allow at 65534, and a deny wins a tie; a rule change decides flows again.
func TestFirewall(t *testing.T) {
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	eb, pb := sled(t, sledB, "vnB", macB, ipB)
	buf := make([]byte, 2048)
	ssh := firewallRules(t, `[{"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534}]`)
	pb.SetFirewall(ssh)
	pa.SetFirewall(ssh)
	n := frame(buf, macA, ipA, ipB, wire.ProtoICMP, 9, 1, 0, "ping")
	if _, in := carry(t, ea, pa, buf, n, eb); in.Verdict != Drop || in.Reason != ReasonFirewall {
		t.Errorf("ICMP in with allow-ssh alone: %+v", in)
	}
	n = frame(buf, macA, ipA, ipB, wire.ProtoTCP, 40002, 22, 0x02, "")
	if _, in := carry(t, ea, pa, buf, n, eb); in.Verdict != ToPort {
		t.Fatalf("TCP 22: %+v", in)
	}
	// B's reply is outbound (allowed by default) and A takes it: the flow
	// A began is A's, both ways.
	n = frame(buf, macB, ipB, ipA, wire.ProtoTCP, 22, 40002, 0x12, "")
	if _, in := carry(t, eb, pb, buf, n, ea); in.Verdict != ToPort || in.Port != pa {
		t.Errorf("B's reply: %+v", in)
	}
	// A reply to a port nobody opened is not a reply.
	n = frame(buf, macB, ipB, ipA, wire.ProtoTCP, 22, 40003, 0x12, "")
	if _, in := carry(t, eb, pb, buf, n, ea); in.Reason != ReasonFirewall {
		t.Errorf("an unasked TCP segment: %+v", in)
	}

	deny := `{"status":"enabled","direction":"inbound","targets":` + nics + `,"filter_hosts":[{"type":"ip","value":"172.30.0.5/32"}],"filter_protocols":[{"type":"icmp","value":null}],"action":"deny","priority":%d}`
	for _, prio := range []int{100, 65534} {
		rs := append(defaultRules(t), firewallRules(t, "["+sprintf(deny, prio)+"]")...)
		pb.SetFirewall(rs)
		n = frame(buf, macA, ipA, ipB, wire.ProtoICMP, 10, 1, 0, "ping")
		if _, in := carry(t, ea, pa, buf, n, eb); in.Reason != ReasonFirewall {
			t.Errorf("deny at %d: ICMP A → B %+v", prio, in)
		}
		n = frame(buf, macA, ipA, ipB, wire.ProtoUDP, 40004, 5000, 0, "u")
		if _, in := carry(t, ea, pa, buf, n, eb); in.Verdict != ToPort {
			t.Errorf("deny at %d: UDP A → B %+v", prio, in)
		}
	}
	// The rule change decided the open TCP flow again: B's reply to A on
	// the flow A began still passes (A's rules did not change), but B no
	// longer knows the flow as one it allowed.
	if fl := pb.Flows(); len(fl) != 1 || fl[0].Key.Proto != wire.ProtoUDP {
		t.Errorf("B's flows after the rule change and one UDP flow: %+v", fl)
	}
}

func sprintf(format string, prio int) string {
	b, _ := json.Marshal(prio)
	return replaceOnce(format, "%d", string(b))
}

func replaceOnce(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}

// S5: a VPC is its VNI: a port of VNI 8888 with B's address on A's sled
// gets nothing of VNI 7777's, and Geneve is demultiplexed by (VNI, MAC).
func TestVPCsAreIsolated(t *testing.T) {
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	pd, err := ea.CreatePort(PortConfig{Name: "vnD", VNI: 8888, MAC: macD, IPv4: &IPConfig{Private: ipB, Subnet: subnet}})
	if err != nil {
		t.Fatal(err)
	}
	pd.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}})
	ea.V2P().Set(8888, ipB, mappings.Phys{MAC: macD, Sled: sledA})
	buf := make([]byte, 2048)
	// A → .6 goes to B's sled, not to D beside it.
	n := frame(buf, macA, ipA, ipB, wire.ProtoUDP, 1, 2, 0, "x")
	if r := ea.Outbound(pa, buf, n); r.Verdict != ToUnderlay || r.Dst != sledB {
		t.Errorf("A → .6: %+v", r)
	}
	// D → .5: no mapping of .5 in VNI 8888.
	n = frame(buf, macD, ipB, ipA, wire.ProtoUDP, 1, 2, 0, "x")
	if r := ea.Outbound(pd, buf, n); r.Reason != ReasonNoV2P {
		t.Errorf("D → .5: %+v", r)
	}
	// Geneve of VNI 8888 for B's MAC finds no port.
	eb, _ := sled(t, sledB, "vnB", macB, ipB)
	n = frame(buf, macA, ipA, ipB, wire.ProtoUDP, 1, 2, 0, "x")
	copy(buf[Headroom:], macB[:])
	enc := wire.InternalEncap(8888, sledA, sledB, wire.FlowKey{})
	hl := enc.GeneveHeaderLen()
	m, _ := enc.EncapGeneve(buf[Headroom-hl:], buf[Headroom:Headroom+n])
	if r := eb.Inbound(buf[Headroom-hl : Headroom-hl+m]); r.Verdict != Drop || r.Reason != ReasonNoPort {
		t.Errorf("VNI 8888 to B's MAC: %+v", r)
	}
	if st := eb.Unmatched(); st.Dropped["no such port"] != 1 {
		t.Errorf("unmatched %+v", st)
	}
}

// Two guests of one sled talk without leaving it.
func TestSameSled(t *testing.T) {
	e, pa := sled(t, sledA, "vnA", macA, ipA)
	pb, err := e.CreatePort(PortConfig{Name: "vnB", VNI: 7777, MAC: macB, IPv4: &IPConfig{Private: ipB, Subnet: subnet}})
	if err != nil {
		t.Fatal(err)
	}
	pb.SetFirewall(defaultRules(t))
	e.V2P().Set(7777, ipB, mappings.Phys{MAC: macB, Sled: sledA})
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, ipB, wire.ProtoICMP, 3, 1, 0, "ping")
	r := e.Outbound(pa, buf, n)
	if r.Verdict != ToPort || r.Port != pb {
		t.Fatalf("A → B on one sled: %+v", r)
	}
	var f wire.Frame
	wire.Parse(r.Data, &f)
	if f.Dst != macB || f.Src != GatewayMAC {
		t.Errorf("B got %s → %s", f.Src, f.Dst)
	}
	if _, err := e.CreatePort(PortConfig{Name: "vnB2", VNI: 7777, MAC: macB, IPv4: &IPConfig{Private: ipB, Subnet: subnet}}); err == nil {
		t.Error("a second port of one VNI and MAC was made")
	}
}

func BenchmarkOutboundEstablished(b *testing.B) {
	t := b
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, ipB, wire.ProtoUDP, 40000, 5000, 0, string(make([]byte, 1400)))
	keep := append([]byte(nil), buf[Headroom:Headroom+n]...)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		copy(buf[Headroom:], keep)
		if r := ea.Outbound(pa, buf, n); r.Verdict != ToUnderlay {
			b.Fatal(r.Reason)
		}
	}
}

func BenchmarkInboundEstablished(b *testing.B) {
	t := b
	ea, pa := sled(t, sledA, "vnA", macA, ipA)
	eb, _ := sled(t, sledB, "vnB", macB, ipB)
	buf := make([]byte, 2048)
	n := frame(buf, macA, ipA, ipB, wire.ProtoUDP, 40000, 5000, 0, string(make([]byte, 1400)))
	out := ea.Outbound(pa, buf, n)
	pkt := append([]byte(nil), out.Data...)
	work := make([]byte, len(pkt))
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		copy(work, pkt)
		if r := eb.Inbound(work); r.Verdict != ToPort {
			b.Fatal(r.Reason)
		}
	}
}

// BenchmarkNewFlow is the cost of the first packet of a flow (every packet
// a new source port: the firewall decides, the flow is kept), with the
// port holding n firewall rules and the sled n v2p mappings.
func BenchmarkNewFlow(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(map[int]string{1: "1", 1000: "1k", 10000: "10k"}[n], func(b *testing.B) {
			ea, pa := sled(b, sledA, "vnA", macA, ipA)
			rs := make([]rules.FirewallRule, 0, n)
			for i := range n {
				rs = append(rs, firewallRules(b, fmt.Sprintf(`[{"status":"enabled","direction":"outbound","targets":[],"filter_hosts":[{"type":"ip","value":"10.%d.%d.0/24"}],"filter_protocols":[{"type":"tcp"}],"filter_ports":["%d"],"action":"deny","priority":%d}]`, i>>8&0xff, i&0xff, 1+i%60000, 1+i%60000))...)
			}
			if err := pa.SetFirewall(rs); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				ea.V2P().Set(7777, netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}), mappings.Phys{MAC: macB, Sled: sledB})
			}
			buf := make([]byte, 2048)
			n := frame(buf, macA, ipA, ipB, wire.ProtoUDP, 1, 5000, 0, string(make([]byte, 64)))
			keep := append([]byte(nil), buf[Headroom:Headroom+n]...)
			var f wire.Frame
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				copy(buf[Headroom:], keep)
				wire.Parse(buf[Headroom:Headroom+n], &f)
				f.SetSrcPort(buf[Headroom:Headroom+n], uint16(1024+i%60000))
				i++
				if r := ea.Outbound(pa, buf, n); r.Verdict != ToUnderlay {
					b.Fatal(r.Reason)
				}
				if i%4096 == 0 {
					pa.fwFlows.Clear() // the table stays small, as flows expire
				}
			}
		})
	}
}

// BenchmarkCreatePort is how fast ports are made and removed.
func BenchmarkCreatePort(b *testing.B) {
	e, err := New(Config{Underlay: sledA})
	if err != nil {
		b.Fatal(err)
	}
	rs := defaultRules(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		mac := wire.MAC{0xa8, 0x40, 0x25, 0xf0, byte(i >> 8), byte(i)}
		p, err := e.CreatePort(PortConfig{Name: "p", VNI: 7777, MAC: mac, IPv4: &IPConfig{Private: ipA, Subnet: subnet}})
		if err != nil {
			b.Fatal(err)
		}
		p.SetFirewall(rs)
		p.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}})
		e.DeletePort("p")
		i++
	}
}
