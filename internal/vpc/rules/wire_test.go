package rules

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/openapitest"
)

// validate checks a value we encode against a schema of upstream's
// sled-agent 48.0.0 document.
func validate(t *testing.T, spec *openapitest.Spec, schema string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var decoded any
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	ref := spec.Doc().Components.Schemas[schema]
	if ref == nil {
		t.Fatalf("no schema %s", schema)
	}
	if err := spec.ValidateValue(ref.Value, decoded); err != nil {
		t.Errorf("%s does not validate as %s: %v", b, schema, err)
	}
}

// TestFirewallRuleShape: the acceptance rules decode with filters absent
// or null, and encode back to upstream's shape.
func TestFirewallRuleShape(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	withNulls := `[{"status":"enabled","direction":"inbound","targets":[],"filter_hosts":null,"filter_ports":null,"filter_protocols":null,"action":"allow","priority":65534}]`
	all := joinRules(defaultRulesVPC1, denyICMPFromA, withNulls,
		rule("outbound", "deny", 0, `"filter_hosts":[{"type":"ip","value":"fd00::/64"}],"filter_protocols":[{"type":"icmp6","value":{"icmp_type":1,"code":"0-6"}},{"type":"udp"}],"filter_ports":["53","1000-2000"]`))
	rs := decodeRules(t, all)
	if len(rs) != 6 {
		t.Fatalf("decoded %d rules", len(rs))
	}
	// Absent and null are both None.
	if rs[4].Hosts != nil || rs[4].Ports != nil || rs[4].Protocols != nil || rs[0].Ports != nil {
		t.Errorf("absent or null filters decoded as %+v", rs[4])
	}
	if rs[0].Targets[1].MAC != portB.MAC || rs[0].Targets[1].VNI != 7777 {
		t.Errorf("target decoded as %+v", rs[0].Targets[1])
	}
	if p := rs[5].Protocols[0]; p.Proto != ProtoICMPv6 || p.ICMP == nil || p.ICMP.Type != 1 || *p.ICMP.Code != (CodeRange{0, 6}) {
		t.Errorf("icmp6 filter decoded as %+v", p)
	}
	if p := rs[5].Ports; len(p) != 2 || p[1] != (PortRange{1000, 2000}) {
		t.Errorf("ports decoded as %v", p)
	}
	for _, r := range rs {
		validate(t, spec, "ResolvedVpcFirewallRule", r)
	}
	validate(t, spec, "ResolvedVpcFirewallRule", FirewallRule{Status: Enabled, Direction: Outbound, Action: RuleDeny,
		Hosts: []HostFilter{VPCHost(9)}, Protocols: []ProtocolFilter{{Proto: ProtoICMP, ICMP: &ICMPFilter{Type: 3, Code: &CodeRange{3, 4}}}}})
	// Re-encoding keeps what came in.
	b, err := json.Marshal(rs[:3])
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	_ = json.Unmarshal(b, &got)
	_ = json.Unmarshal([]byte(defaultRulesVPC1), &want)
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("re-encoded\n%s\nwant\n%s", gb, wb)
	}
}

func TestFirewallRuleRefused(t *testing.T) {
	cases := []struct{ name, rule, field string }{
		{"port 0", rule("inbound", "allow", 1, `"filter_ports":["0"]`), "filter_ports"},
		{"port too large", rule("inbound", "allow", 1, `"filter_ports":["65536"]`), "filter_ports"},
		{"range without start", rule("inbound", "allow", 1, `"filter_ports":["-5"]`), "filter_ports"},
		{"range without end", rule("inbound", "allow", 1, `"filter_ports":["5-"]`), "filter_ports"},
		{"port not a number", rule("inbound", "allow", 1, `"filter_ports":["ssh"]`), "filter_ports"},
		{"icmp code too large", rule("inbound", "allow", 1, `"filter_protocols":[{"type":"icmp","value":{"icmp_type":3,"code":"256"}}]`), "code"},
		{"icmp without type", rule("inbound", "allow", 1, `"filter_protocols":[{"type":"icmp","value":{"code":"3"}}]`), "filter_protocols.value.icmp_type"},
		{"unknown protocol", rule("inbound", "allow", 1, `"filter_protocols":[{"type":"gre"}]`), "filter_protocols.type"},
		{"unknown host kind", rule("inbound", "allow", 1, `"filter_hosts":[{"type":"subnet","value":"10.0.0.0/8"}]`), "filter_hosts.type"},
		{"host not a network", rule("inbound", "allow", 1, `"filter_hosts":[{"type":"ip","value":"10.0.0.1"}]`), "filter_hosts.value"},
		{"vni beyond 24 bits", rule("inbound", "allow", 1, `"filter_hosts":[{"type":"vpc","value":16777216}]`), "vni"},
		{"status", `{"status":"on","direction":"inbound","targets":[],"action":"allow","priority":1}`, "status"},
		{"direction", `{"status":"enabled","direction":"in","targets":[],"action":"allow","priority":1}`, "direction"},
		{"action", `{"status":"enabled","direction":"inbound","targets":[],"action":"drop","priority":1}`, "action"},
		{"no priority", `{"status":"enabled","direction":"inbound","targets":[],"action":"allow"}`, "rule.priority"},
		{"no targets", `{"status":"enabled","direction":"inbound","action":"allow","priority":1}`, "rule.targets"},
		{"target without mac", `{"status":"enabled","direction":"inbound","targets":[` + strings.Replace(nicA, `"mac":"A8:40:25:F0:00:01",`, "", 1) + `],"action":"allow","priority":1}`, "target.mac"},
		{"target bad mac", `{"status":"enabled","direction":"inbound","targets":[` + strings.Replace(nicA, `A8:40:25:F0:00:01`, "A8:40:25:F0:00", 1) + `],"action":"allow","priority":1}`, "mac"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r FirewallRule
			err := json.Unmarshal([]byte(c.rule), &r)
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("decoding %s: error %v, want an InvalidError", c.rule, err)
			}
			if ie.Field != c.field {
				t.Errorf("error %q names %q, want %q", err, ie.Field, c.field)
			}
		})
	}
	// Priority out of range is refused by the decoder itself.
	var r FirewallRule
	if err := json.Unmarshal([]byte(`{"status":"enabled","direction":"inbound","targets":[],"action":"allow","priority":65536}`), &r); err == nil {
		t.Error("priority 65536 accepted")
	}
}

// S2's route sets and S1's expected GET /vpc-routes (VPC.md §4.3).
const s2Routes = `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},
  "routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}},
            {"dest":"0.0.0.0/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"1a5e0c5e-0000-4000-8000-0000000000a1"}}},
            {"dest":"::/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"1a5e0c5e-0000-4000-8000-0000000000a1"}}}]},
 {"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`

func TestRouteShapes(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	var sets []RouteSet
	if err := json.Unmarshal([]byte(s2Routes), &sets); err != nil {
		t.Fatal(err)
	}
	if len(sets) != 2 || !sets[0].ID.IsSystem() || sets[1].ID.IsSystem() || sets[1].ID.Subnet.String() != "172.30.0.0/22" {
		t.Fatalf("ids decoded as %+v", sets)
	}
	if v := sets[0].Version; v == nil || v.Version != 3 || v.RouterID.String() != "5e5e0c5e-0000-4000-8000-000000000001" {
		t.Errorf("version decoded as %+v", v)
	}
	if r := sets[0].Routes[1]; r.Target.Kind != TargetInternetGateway || !r.Target.IGWInstance || r.Target.IGW.String() != "1a5e0c5e-0000-4000-8000-0000000000a1" {
		t.Errorf("igw route decoded as %+v", r)
	}
	for _, s := range sets {
		validate(t, spec, "ResolvedVpcRouteSet", s)
	}
	more := []Route{
		{Dest: sets[0].Routes[0].Dest, Target: DropTarget()},
		{Dest: sets[0].Routes[0].Dest, Target: IPTarget(ipA)},
		{Dest: sets[0].Routes[0].Dest, Target: SystemIGW()},
	}
	for _, r := range more {
		validate(t, spec, "ResolvedVpcRoute", r)
		var back Route
		b, _ := json.Marshal(r)
		if err := json.Unmarshal(b, &back); err != nil || back != r {
			t.Errorf("%s came back as %+v, %v", b, back, err)
		}
	}
	validate(t, spec, "ResolvedVpcRouteSet", RouteSet{ID: SystemRouter(5)})
	for _, st := range []RouteState{{ID: sets[0].ID, Version: sets[0].Version}, {ID: sets[1].ID}} {
		validate(t, spec, "ResolvedVpcRouteState", st)
	}

	bad := []struct{ name, set, field string }{
		{"unknown kind", `{"id":{"vni":1,"kind":{"type":"vpc"}},"routes":[]}`, "id.kind.type"},
		{"custom without subnet", `{"id":{"vni":1,"kind":{"type":"custom"}},"routes":[]}`, "id.kind.subnet"},
		{"no routes", `{"id":{"vni":1,"kind":{"type":"system"}}}`, "route set.routes"},
		{"bad dest", `{"id":{"vni":1,"kind":{"type":"system"}},"routes":[{"dest":"10.0.0.0","target":{"type":"drop"}}]}`, "route.dest"},
		{"unknown target", `{"id":{"vni":1,"kind":{"type":"system"}},"routes":[{"dest":"10.0.0.0/8","target":{"type":"nat"}}]}`, "target.type"},
		{"ip target without value", `{"id":{"vni":1,"kind":{"type":"system"}},"routes":[{"dest":"10.0.0.0/8","target":{"type":"ip"}}]}`, "target.value"},
		{"igw with bad uuid", `{"id":{"vni":1,"kind":{"type":"system"}},"routes":[{"dest":"10.0.0.0/8","target":{"type":"internet_gateway","value":{"type":"instance","value":"x"}}}]}`, "target.value.value"},
		{"version without router", `{"id":{"vni":1,"kind":{"type":"system"}},"version":{"version":2},"routes":[]}`, "version.router_id"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			var s RouteSet
			err := json.Unmarshal([]byte(c.set), &s)
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Field != c.field {
				t.Errorf("error %v, want an InvalidError naming %s", err, c.field)
			}
		})
	}
}
