package rules

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// The acceptance topology's values (VPC.md §4.2).
const (
	nicA = `{"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},
  "name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]}},
  "mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0}`
	nicB = `{"id":"b0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"b0000000-0000-4000-8000-000000000001"},
  "name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.6","subnet":"172.30.0.0/22","transit_ips":[]}},
  "mac":"A8:40:25:F0:00:02","vni":7777,"primary":true,"slot":0}`

	// $DEFAULT_RULES_VPC1: allow-internal-inbound, allow-ssh, allow-icmp
	// (omicron nexus/defaults/src/lib.rs:37-95), as Nexus sends them:
	// filters that are None are absent.
	defaultRulesVPC1 = `[
 {"status":"enabled","direction":"inbound","targets":[` + nicA + `,` + nicB + `],"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":[` + nicA + `,` + nicB + `],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":[` + nicA + `,` + nicB + `],"filter_protocols":[{"type":"icmp","value":null}],"action":"allow","priority":65534}]`

	// S4's deny: ICMP from A to B, priority 100.
	denyICMPFromA = `{"status":"enabled","direction":"inbound","targets":[` + nicB + `],
  "filter_hosts":[{"type":"ip","value":"172.30.0.5/32"}],"filter_protocols":[{"type":"icmp","value":null}],
  "action":"deny","priority":100}`
)

var (
	portA = Port{VNI: 7777, MAC: MustMAC("A8:40:25:F0:00:01")}
	portB = Port{VNI: 7777, MAC: MustMAC("A8:40:25:F0:00:02")}
	ipA   = netip.MustParseAddr("172.30.0.5")
	ipB   = netip.MustParseAddr("172.30.0.6")
)

func decodeRules(t testing.TB, s string) []FirewallRule {
	t.Helper()
	var rs []FirewallRule
	if err := json.Unmarshal([]byte(s), &rs); err != nil {
		t.Fatalf("decoding rules: %v\n%s", err, s)
	}
	return rs
}

func compile(t testing.TB, s string, p Port) *Firewall {
	t.Helper()
	fw, err := CompileFirewall(decodeRules(t, s), p)
	if err != nil {
		t.Fatal(err)
	}
	return fw
}

// joinRules joins JSON rule lists and single rules into one list.
func joinRules(parts ...string) string {
	var items []string
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if strings.HasPrefix(p, "[") {
			p = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(p, "["), "]"))
		}
		if p != "" {
			items = append(items, p)
		}
	}
	return "[" + strings.Join(items, ",") + "]"
}

// flows for the tables.
func tcpIn(src netip.Addr, sport, dport uint16, tag VNITag) Flow {
	return Flow{Dir: In, Proto: ProtoTCP, Src: src, Dst: ipB, SrcPort: sport, DstPort: dport, VNI: tag}
}

func udpIn(src netip.Addr, dport uint16, tag VNITag) Flow {
	return Flow{Dir: In, Proto: ProtoUDP, Src: src, Dst: ipB, SrcPort: 40000, DstPort: dport, VNI: tag}
}

func icmpIn(src netip.Addr, typ, code uint8, tag VNITag) Flow {
	return Flow{Dir: In, Proto: ProtoICMP, Src: src, Dst: ipB, ICMPType: typ, ICMPCode: code, VNI: tag}
}
