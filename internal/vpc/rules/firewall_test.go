package rules

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// TestFirewallAcceptanceS4 is VPC.md §4.3 S4 on B's and A's ports.
func TestFirewallAcceptanceS4(t *testing.T) {
	allowSSH := `[{"status":"enabled","direction":"inbound","targets":[` + nicA + `,` + nicB + `],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534}]`
	denyTie := `{"status":"enabled","direction":"inbound","targets":[` + nicB + `],
  "filter_hosts":[{"type":"ip","value":"172.30.0.5/32"}],"filter_protocols":[{"type":"icmp","value":null}],
  "action":"deny","priority":65534}`
	fromA := Tag(7777)
	icmpBtoA := Flow{Dir: In, Proto: ProtoICMP, Src: ipB, Dst: ipA, ICMPType: 8, VNI: fromA}
	cases := []struct {
		name   string
		rules  string
		port   Port
		flow   Flow
		want   Action
		source int // the upstream rule that decided; -1 for the default
	}{
		// Only allow-ssh: ICMP and UDP fall to the inbound default deny
		// (opte lib/oxide-vpc/src/engine/firewall.rs:138-142), TCP 22 passes.
		{"ssh only: icmp denied", allowSSH, portB, icmpIn(ipA, 8, 0, fromA), Deny, -1},
		{"ssh only: udp denied", allowSSH, portB, udpIn(ipA, 7, fromA), Deny, -1},
		{"ssh only: tcp 22 allowed", allowSSH, portB, tcpIn(ipA, 40000, 22, fromA), Allow, 0},
		{"ssh only: tcp 80 denied", allowSSH, portB, tcpIn(ipA, 40000, 80, fromA), Deny, -1},
		// Defaults plus a priority-100 deny of ICMP from A: lower priority
		// numbers come first (lib/opte/src/engine/layer.rs:1679).
		{"deny 100 beats allow 65534", joinRules(defaultRulesVPC1, denyICMPFromA), portB, icmpIn(ipA, 8, 0, fromA), Deny, 3},
		{"udp from A still allowed", joinRules(defaultRulesVPC1, denyICMPFromA), portB, udpIn(ipA, 7, fromA), Allow, 0},
		{"icmp B to A allowed on A", joinRules(defaultRulesVPC1, denyICMPFromA), portA, icmpBtoA, Allow, 2},
		// The same deny at 65534 still wins: Deny sorts before Allow at
		// equal priority (lib/opte/src/engine/layer.rs:1683-1691).
		{"deny wins a tie", joinRules(defaultRulesVPC1, denyTie), portB, icmpIn(ipA, 8, 0, fromA), Deny, 3},
		{"deny first in the list also wins", joinRules(denyTie, defaultRulesVPC1), portB, icmpIn(ipA, 8, 0, fromA), Deny, 0},
		{"restored defaults allow icmp", defaultRulesVPC1, portB, icmpIn(ipA, 8, 0, fromA), Allow, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fw := compile(t, c.rules, c.port)
			checkVerdict(t, fw, c.flow, c.want, c.source)
		})
	}
}

func checkVerdict(t *testing.T, fw *Firewall, f Flow, want Action, source int) {
	t.Helper()
	v := fw.Match(&f)
	if v != fw.matchLinear(&f) {
		t.Errorf("index %+v, linear scan %+v", v, fw.matchLinear(&f))
	}
	got := -1
	if v.Rule >= 0 {
		got = fw.Rules(f.Dir)[v.Rule].Source
	}
	if v.Action != want || got != source {
		t.Errorf("%s: got %s by rule %d, want %s by rule %d", f, v.Action, got, want, source)
	}
}

// rule builds one enabled rule with no targets from its filters.
func rule(dir, action string, prio int, filters string) string {
	s := `{"status":"enabled","direction":"` + dir + `","targets":[],"action":"` + action + `","priority":` + strconv.Itoa(prio)
	if filters != "" {
		s += "," + filters
	}
	return s + "}"
}

func TestFirewallSemantics(t *testing.T) {
	v6 := netip.MustParseAddr("fd00::5")
	ext := netip.MustParseAddr("198.51.100.1")
	none := VNITag{}
	cases := []struct {
		name   string
		rules  string
		flow   Flow
		want   Action
		source int
	}{
		// Defaults: inbound Deny, outbound StatefulAllow
		// (opte lib/oxide-vpc/src/engine/firewall.rs:138-142).
		{"no rules: inbound denied", `[]`, udpIn(ipA, 53, none), Deny, -1},
		{"no rules: outbound allowed", `[]`, Flow{Dir: Out, Proto: ProtoUDP, Src: ipB, Dst: ext, DstPort: 53}, Allow, -1},
		// Disabled rules are dropped (omicron illumos-utils/src/opte/firewall_rules.rs:51-56,140).
		{"disabled rule dropped", `[{"status":"disabled","direction":"inbound","targets":[],"action":"allow","priority":1}]`, udpIn(ipA, 53, none), Deny, -1},
		// Targets: empty applies everywhere; else the port's (VNI, MAC)
		// (firewall_rules.rs:141-147).
		{"empty targets apply", joinRules(rule("inbound", "allow", 5, "")), udpIn(ipA, 53, none), Allow, 0},
		{"targets without the port", `[{"status":"enabled","direction":"inbound","targets":[` + nicA + `],"action":"allow","priority":5}]`, udpIn(ipA, 53, none), Deny, -1},
		{"same MAC in another VNI", `[{"status":"enabled","direction":"inbound","targets":[` + replaceVNI(nicB, 8888) + `],"action":"allow","priority":5}]`, udpIn(ipA, 53, none), Deny, -1},
		// Priority: lower first, whatever the list order (layer.rs:1679).
		{"lower priority number first", joinRules(rule("inbound", "allow", 200, ""), rule("inbound", "deny", 100, "")), udpIn(ipA, 53, none), Deny, 1},
		{"allow at 10 beats deny at 11", joinRules(rule("inbound", "deny", 11, ""), rule("inbound", "allow", 10, "")), udpIn(ipA, 53, none), Allow, 1},
		// Direction: an outbound rule says nothing of inbound packets.
		{"outbound rule ignores inbound", joinRules(rule("outbound", "allow", 1, "")), udpIn(ipA, 53, none), Deny, -1},
		{"outbound deny", joinRules(rule("outbound", "deny", 1, `"filter_ports":["53"],"filter_protocols":[{"type":"udp"}]`)),
			Flow{Dir: Out, Proto: ProtoUDP, Src: ipB, Dst: ext, SrcPort: 40000, DstPort: 53}, Deny, 0},
		// Ports are destination ports only, in both directions
		// (opte lib/opte/src/engine/predicate.rs InnerDstPort; firewall.rs:105).
		{"tcp dst 22 matches", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"]`)), tcpIn(ipA, 40000, 22, none), Allow, 0},
		{"tcp src 22 does not", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"]`)), tcpIn(ipA, 22, 40000, none), Deny, -1},
		{"outbound src 53 does not", joinRules(rule("outbound", "deny", 5, `"filter_protocols":[{"type":"udp"}],"filter_ports":["53"]`)),
			Flow{Dir: Out, Proto: ProtoUDP, Src: ipB, Dst: ext, SrcPort: 53, DstPort: 40000}, Allow, -1},
		{"range 1000-2000 holds 1500", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"udp"}],"filter_ports":["1000-2000"]`)), udpIn(ipA, 1500, none), Allow, 0},
		{"range 1000-2000 not 2001", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"udp"}],"filter_ports":["1000-2000"]`)), udpIn(ipA, 2001, none), Deny, -1},
		{"several ranges", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"udp"}],"filter_ports":["80","443","6000-6010"]`)), udpIn(ipA, 6005, none), Allow, 0},
		// A reversed range parses (omicron common/src/api/external/mod.rs:1827-1851
		// has no start ≤ end check) and expands to no port: the port
		// predicate is an empty list, which matches nothing.
		{"reversed range matches nothing", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"tcp"}],"filter_ports":["2000-1000"]`)), tcpIn(ipA, 40000, 1500, none), Deny, -1},
		// Quirk: ports without protocols are ignored
		// (omicron illumos-utils/src/opte/firewall_rules.rs:167-174).
		{"ports without protocol: udp 53", joinRules(rule("inbound", "allow", 5, `"filter_ports":["22"]`)), udpIn(ipA, 53, none), Allow, 0},
		{"ports without protocol: icmp", joinRules(rule("inbound", "allow", 5, `"filter_ports":["22"]`)), icmpIn(ipA, 8, 0, none), Allow, 0},
		{"ports apply to tcp only in [tcp, icmp]", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"tcp"},{"type":"icmp","value":null}],"filter_ports":["22"]`)), tcpIn(ipA, 40000, 80, none), Deny, -1},
		{"icmp of [tcp, icmp] ignores ports", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"tcp"},{"type":"icmp","value":null}],"filter_ports":["22"]`)), icmpIn(ipA, 8, 0, none), Allow, 0},
		// Hosts: /32 exact, other nets by prefix, on the remote side
		// (opte lib/oxide-vpc/src/engine/firewall.rs:201-242).
		{"ip host is the inbound source", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"172.30.0.5/32"}]`)), udpIn(ipA, 53, none), Allow, 0},
		{"ip host is not the inbound destination", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"172.30.0.6/32"}]`)), udpIn(ipA, 53, none), Deny, -1},
		{"ip host is the outbound destination", joinRules(rule("outbound", "deny", 5, `"filter_hosts":[{"type":"ip","value":"198.51.100.1/32"}]`)),
			Flow{Dir: Out, Proto: ProtoTCP, Src: ipB, Dst: ext, SrcPort: 40000, DstPort: 443}, Deny, 0},
		{"network by prefix", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"172.30.0.0/22"}]`)), udpIn(netip.MustParseAddr("172.30.3.200"), 53, none), Allow, 0},
		{"network with host bits", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"172.30.0.9/22"}]`)), udpIn(netip.MustParseAddr("172.30.3.200"), 53, none), Allow, 0},
		{"outside the network", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"172.30.0.0/22"}]`)), udpIn(netip.MustParseAddr("172.30.4.1"), 53, none), Deny, -1},
		{"v4 network, v6 packet", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"0.0.0.0/0"}]`)), udpIn(v6, 53, none), Deny, -1},
		{"v6 network", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"fd00::/64"}]`)), udpIn(v6, 53, none), Allow, 0},
		// vpc hosts match the VNI tag, absent on External packets
		// (firewall.rs:238-240; VPC.md §2.2).
		{"vpc host, tagged", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"vpc","value":7777}]`)), udpIn(ipA, 53, Tag(7777)), Allow, 0},
		{"vpc host, other vni", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"vpc","value":7777}]`)), udpIn(ipA, 53, Tag(8888)), Deny, -1},
		{"vpc host, external packet", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"vpc","value":7777}]`)), udpIn(ext, 53, none), Deny, -1},
		{"outbound vpc host", joinRules(rule("outbound", "deny", 5, `"filter_hosts":[{"type":"vpc","value":8888}]`)),
			Flow{Dir: Out, Proto: ProtoUDP, Src: ipB, Dst: ipA, DstPort: 53, VNI: Tag(8888)}, Deny, 0},
		// ICMP filters (firewall.rs:148-198; predicate.rs IcmpMsgType/Code).
		{"icmp any", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":null}]`)), icmpIn(ipA, 3, 4, none), Allow, 0},
		{"icmp absent value is any", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp"}]`)), icmpIn(ipA, 11, 0, none), Allow, 0},
		{"icmp is not icmp6", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":null}]`)),
			Flow{Dir: In, Proto: ProtoICMPv6, Src: v6, Dst: netip.MustParseAddr("fd00::6"), ICMPType: 128}, Deny, -1},
		{"icmp6 any", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp6","value":null}]`)),
			Flow{Dir: In, Proto: ProtoICMPv6, Src: v6, Dst: netip.MustParseAddr("fd00::6"), ICMPType: 128}, Allow, 0},
		{"icmp6 is not icmp", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp6","value":null}]`)), icmpIn(ipA, 8, 0, none), Deny, -1},
		{"icmp type 8, any code", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":8}}]`)), icmpIn(ipA, 8, 7, none), Allow, 0},
		{"icmp type 8, not 0", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":8,"code":null}}]`)), icmpIn(ipA, 0, 0, none), Deny, -1},
		{"icmp 3 code 3-4 holds 4", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":3,"code":"3-4"}}]`)), icmpIn(ipA, 3, 4, none), Allow, 0},
		{"icmp 3 code 3-4 not 5", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":3,"code":"3-4"}}]`)), icmpIn(ipA, 3, 5, none), Deny, -1},
		{"icmp code 4 exact", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":3,"code":"4"}}]`)), icmpIn(ipA, 3, 3, none), Deny, -1},
		{"icmp reversed codes hold nothing", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":3,"code":"4-3"}}]`)), icmpIn(ipA, 3, 3, none), Deny, -1},
		{"icmp6 type 1 code 0-6", joinRules(rule("inbound", "allow", 5, `"filter_protocols":[{"type":"icmp6","value":{"icmp_type":1,"code":"0-6"}}]`)),
			Flow{Dir: In, Proto: ProtoICMPv6, Src: v6, Dst: netip.MustParseAddr("fd00::6"), ICMPType: 1, ICMPCode: 6}, Allow, 0},
		// Another protocol (GRE, 47) matches only rules without protocols.
		{"other protocol, proto-less rule", joinRules(rule("inbound", "deny", 4, `"filter_protocols":[{"type":"tcp"},{"type":"udp"}]`), rule("inbound", "allow", 5, "")),
			Flow{Dir: In, Proto: 47, Src: ipA, Dst: ipB}, Allow, 1},
		// Expansion hosts × protocols: any pair matches.
		{"expansion: second host, second proto", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[{"type":"ip","value":"10.0.0.1/32"},{"type":"ip","value":"172.30.0.5/32"}],"filter_protocols":[{"type":"tcp"},{"type":"udp"}],"filter_ports":["53"]`)),
			udpIn(ipA, 53, none), Allow, 0},
		{"expansion: empty lists are any", joinRules(rule("inbound", "allow", 5, `"filter_hosts":[],"filter_protocols":[],"filter_ports":[]`)), icmpIn(ext, 0, 0, none), Allow, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fw := compile(t, c.rules, portB)
			checkVerdict(t, fw, c.flow, c.want, c.source)
		})
	}
}

func replaceVNI(nic string, vni int) string {
	return strings.ReplaceAll(nic, `"vni":7777`, `"vni":`+strconv.Itoa(vni))
}
