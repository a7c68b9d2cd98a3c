package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// optePlace is OPTE's RuleTable::find_pos, written from its description
// (opte lib/opte/src/engine/layer.rs:1677-1693): a new rule goes before the
// first rule of higher priority number, or of equal priority when the new
// rule is a Deny or the existing one is not.
func optePlace(table []Rule, r Rule) []Rule {
	for i, e := range table {
		if r.Priority < e.Priority || (r.Priority == e.Priority && (r.Action == Deny || e.Action != Deny)) {
			return slices.Insert(table, i, r)
		}
	}
	return append(table, r)
}

// TestOrderIsOPTEInsertion checks the sort against OPTE's insertion, rule
// by rule in the order set_rules adds them (layer.rs:1801-1806).
func TestOrderIsOPTEInsertion(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + rng.IntN(40)
		var added []Rule
		var table []Rule
		for i := range n {
			a := Allow
			if rng.IntN(2) == 0 {
				a = Deny
			}
			r := Rule{Source: i, Priority: uint16(rng.IntN(4)), Action: a, seq: i}
			added = append(added, r)
			table = optePlace(table, r)
		}
		got := order(slices.Clone(added))
		if !slices.EqualFunc(got, table, func(a, b Rule) bool { return a.seq == b.seq }) {
			t.Fatalf("round %d: sorted %v, OPTE's insertion %v", round, seqs(got), seqs(table))
		}
	}
}

func seqs(rs []Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%d:%d%s", r.seq, r.Priority, r.Action))
	}
	return out
}

// TestExpansionOrder: protocols × hosts, protocols outermost, each
// direction in OPTE's order; the last of equal rules first
// (omicron illumos-utils/src/opte/firewall_rules.rs:155-188).
func TestExpansionOrder(t *testing.T) {
	rules := joinRules(
		rule("inbound", "allow", 7, `"filter_hosts":[{"type":"ip","value":"10.0.0.1/32"},{"type":"vpc","value":5}],"filter_protocols":[{"type":"tcp"},{"type":"icmp","value":null}],"filter_ports":["22","23"]`),
		rule("outbound", "deny", 7, ""),
		rule("inbound", "deny", 7, `"filter_ports":["80"]`),
	)
	fw := compile(t, rules, portB)
	var got []string
	for _, r := range fw.Rules(In) {
		got = append(got, fmt.Sprintf("%d %s", r.Source, r))
	}
	want := []string{
		"2 in priority 7 deny",
		"0 in priority 7 allow host vpc=5 proto icmp",
		"0 in priority 7 allow host ip=10.0.0.1/32 proto icmp",
		"0 in priority 7 allow host vpc=5 proto tcp ports [22-23]",
		"0 in priority 7 allow host ip=10.0.0.1/32 proto tcp ports [22-23]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("inbound rules:\n got %q\nwant %q", got, want)
	}
	if out := fw.Rules(Out); len(out) != 1 || out[0].Source != 1 || out[0].Action != Deny {
		t.Errorf("outbound rules: %v", out)
	}
}

func TestMergePorts(t *testing.T) {
	// As OPTE's port predicate simplification
	// (opte lib/oxide-vpc/src/engine/firewall.rs:286-324).
	cases := []struct{ in, want []PortRange }{
		{[]PortRange{{1000, 1000}, {1001, 1001}, {1002, 1004}}, []PortRange{{1000, 1004}}},
		{[]PortRange{{60000, 60000}, {1000, 1004}, {443, 443}, {80, 80}}, []PortRange{{80, 80}, {443, 443}, {1000, 1004}, {60000, 60000}}},
		{[]PortRange{{1, 3}, {2, 2}, {6, 7}, {5, 5}}, []PortRange{{1, 3}, {5, 7}}},
		{[]PortRange{{1024, 65535}, {65535, 65535}}, []PortRange{{1024, 65535}}},
		{[]PortRange{{2000, 1000}}, []PortRange{}},
	}
	for _, c := range cases {
		if got := mergePorts(c.in); !slices.Equal(got, c.want) {
			t.Errorf("mergePorts(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestIndexAgreesWithLinearScan: on random rule sets and flows, the
// indexed Match gives exactly the first rule a scan of every rule finds.
func TestIndexAgreesWithLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 60 {
		n := 1 + rng.IntN(1500)
		if round < 20 {
			n = 1 + rng.IntN(30)
		}
		rs := randomRules(rng, n)
		fw, err := CompileFirewall(rs, portB)
		if err != nil {
			t.Fatal(err)
		}
		for range 2000 {
			f := randomFlow(rng)
			if got, want := fw.Match(&f), fw.matchLinear(&f); got != want {
				t.Fatalf("round %d (%d rules): %s: index %+v, scan %+v (rule %v)", round, n, f, got, want, fw.Rules(f.Dir)[max(want.Rule, 0)])
			}
		}
	}
}

var (
	testNets = []netip.Prefix{
		netip.MustParsePrefix("172.30.0.5/32"), netip.MustParsePrefix("172.30.0.0/22"), netip.MustParsePrefix("172.30.0.0/24"),
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("198.51.100.1/32"),
		netip.MustParsePrefix("fd00::5/128"), netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("::/0"),
	}
	testAddrs = []netip.Addr{
		netip.MustParseAddr("172.30.0.5"), netip.MustParseAddr("172.30.0.6"), netip.MustParseAddr("172.30.1.9"),
		netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("8.8.8.8"),
		netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fd00::9"), netip.MustParseAddr("2001:db8::1"),
	}
	testProtos = []Proto{ProtoTCP, ProtoUDP, ProtoICMP, ProtoICMPv6, 47}
)

func randomRules(rng *rand.Rand, n int) []FirewallRule {
	rs := make([]FirewallRule, n)
	for i := range rs {
		r := FirewallRule{Status: Enabled, Direction: Inbound, Action: RuleAllow, Priority: uint16(rng.IntN(8)), Targets: []NIC{}}
		if rng.IntN(2) == 0 {
			r.Direction = Outbound
		}
		if rng.IntN(2) == 0 {
			r.Action = RuleDeny
		}
		if rng.IntN(20) == 0 {
			r.Status = Disabled
		}
		for range rng.IntN(3) {
			if rng.IntN(3) == 0 {
				r.Hosts = append(r.Hosts, VPCHost(uint32(7777+rng.IntN(2))))
			} else {
				r.Hosts = append(r.Hosts, IPHost(testNets[rng.IntN(len(testNets))]))
			}
		}
		for range rng.IntN(3) {
			p := ProtocolFilter{Proto: testProtos[rng.IntN(4)]}
			if (p.Proto == ProtoICMP || p.Proto == ProtoICMPv6) && rng.IntN(2) == 0 {
				p.ICMP = &ICMPFilter{Type: uint8(rng.IntN(4))}
				if rng.IntN(2) == 0 {
					lo := uint8(rng.IntN(4))
					p.ICMP.Code = &CodeRange{First: lo, Last: lo + uint8(rng.IntN(3)) - 1}
				}
			}
			r.Protocols = append(r.Protocols, p)
		}
		for range rng.IntN(3) {
			lo := uint16(1 + rng.IntN(100))
			hi := lo + uint16(rng.IntN(10))
			if rng.IntN(10) == 0 {
				lo, hi = hi, lo
			}
			if rng.IntN(10) == 0 {
				hi = 65535
			}
			r.Ports = append(r.Ports, PortRange{First: lo, Last: hi})
		}
		rs[i] = r
	}
	return rs
}

func randomFlow(rng *rand.Rand) Flow {
	f := Flow{
		Dir:      Dir(rng.IntN(2)),
		Proto:    testProtos[rng.IntN(len(testProtos))],
		Src:      testAddrs[rng.IntN(len(testAddrs))],
		Dst:      testAddrs[rng.IntN(len(testAddrs))],
		SrcPort:  uint16(rng.IntN(120)),
		DstPort:  uint16(rng.IntN(120)),
		ICMPType: uint8(rng.IntN(4)),
		ICMPCode: uint8(rng.IntN(5)),
	}
	if rng.IntN(10) == 0 {
		f.DstPort = 65535
	}
	if rng.IntN(3) > 0 {
		f.VNI = Tag(uint32(7777 + rng.IntN(2)))
	}
	return f
}
