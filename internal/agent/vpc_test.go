package agent_test

import (
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// vpcNICA is VPC.md §4.2's $NIC_A.
const vpcNICA = `{"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},
  "name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]}},
  "mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0}`

// vpcVMMBody is an upstream InstanceEnsureBody whose local_config has
// $NIC_A and its source NAT.
func vpcVMMBody() []byte {
	b := string(upstreamEnsureBody(okAddr))
	b = strings.Replace(b, `"nics":[]`, `"nics":[`+vpcNICA+`]`, 1)
	b = strings.Replace(b, `"external_ips":{"v4":null,"v6":null}`, `"external_ips":{"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":null,"floating_ips":[]},"v6":null}`, 1)
	return []byte(b)
}

func routeIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var got []told.RouteState
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("GET /vpc-routes: %s: %v", body, err)
	}
	var out []string
	for _, r := range got {
		b, _ := json.Marshal(r)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// VPC.md §4's S1–S3 on one sled (sim runtime), every exchange checked
// against upstream's document: a running VMM's port needs its VPC's
// system router and its subnet's; the routes applied show their version,
// an older version changes nothing; the mappings are listed as put. A
// restarted agent has all it was told: mappings, routes, firewall rules,
// the VMM's external IPs and attached subnets.
func TestVPCToldSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	first := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, first)
	w := newWire(t, first)

	// Before the VMM runs nothing needs routes.
	if got := w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK); strings.TrimSpace(string(got.Body)) != "[]" {
		t.Errorf("GET /vpc-routes with no port: %s", got.Body)
	}
	w.do(http.MethodPut, "/vmms/"+testVMM, vpcVMMBody(), http.StatusOK)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusOK)
	waitVMM(t, first, "running")

	// S1.
	s1 := []string{`{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null}`,
		`{"id":{"vni":7777,"kind":{"type":"system"}},"version":null}`}
	if got := routeIDs(t, w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK).Body); !slices.Equal(got, s1) {
		t.Errorf("S1 GET /vpc-routes: %q, want %q", got, s1)
	}
	if got := w.do(http.MethodGet, "/v2p", nil, http.StatusOK); strings.TrimSpace(string(got.Body)) != "[]" {
		t.Errorf("S1 GET /v2p: %s", got.Body)
	}

	// S2.
	w.do(http.MethodPut, "/eip-gateways", []byte(`{"mappings":{"a0000000-0000-4000-8000-0000000000c1":{"192.0.2.20":["1a5e0c5e-0000-4000-8000-0000000000a1"]}}}`), http.StatusNoContent)
	routes := `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},
  "routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}},
            {"dest":"0.0.0.0/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"1a5e0c5e-0000-4000-8000-0000000000a1"}}},
            {"dest":"::/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"1a5e0c5e-0000-4000-8000-0000000000a1"}}}]},
 {"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`
	w.do(http.MethodPut, "/vpc-routes", []byte(routes), http.StatusNoContent)
	s2 := []string{s1[0], `{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3}}`}
	if got := routeIDs(t, w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK).Body); !slices.Equal(got, s2) {
		t.Errorf("S2 GET /vpc-routes: %q, want %q", got, s2)
	}
	before := first.VPC().View().Routes
	older := strings.Replace(strings.Replace(routes, `"version":3`, `"version":2`, 1), `"dest":"0.0.0.0/0"`, `"dest":"10.0.0.0/8"`, 1)
	w.do(http.MethodPut, "/vpc-routes", []byte(older), http.StatusNoContent)
	if after := first.VPC().View().Routes; !jsonEqual(t, before, after) {
		t.Errorf("an older version changed the routes: %+v → %+v", before, after)
	}

	// S3.
	m := []string{`{"virtual_ip":"172.30.0.5","virtual_mac":"A8:40:25:F0:00:01","physical_host_ip":"fd00:1122:3344:101::1","vni":7777}`,
		`{"virtual_ip":"172.30.0.6","virtual_mac":"A8:40:25:F0:00:02","physical_host_ip":"fd00:1122:3344:102::1","vni":7777}`}
	for _, b := range m {
		w.do(http.MethodPut, "/v2p", []byte(b), http.StatusNoContent)
	}
	w.do(http.MethodPut, "/v2p", []byte(m[1]), http.StatusNoContent)
	v2p := strings.TrimSpace(string(w.do(http.MethodGet, "/v2p", nil, http.StatusOK).Body))
	if v2p != "["+m[0]+","+m[1]+"]" {
		t.Errorf("S3 GET /v2p: %s", v2p)
	}

	// What Nexus would not send again.
	w.do(http.MethodPut, "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", []byte(`{"vni":7777,"rules":[
	  {"status":"enabled","direction":"inbound","targets":[`+vpcNICA+`],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534}]}`), http.StatusNoContent)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.10"}`), http.StatusNoContent)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.10"}`), http.StatusNoContent)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.11"}`), http.StatusInternalServerError)
	w.do(http.MethodPost, "/vmms/"+testVMM+"/attached-subnets", []byte(`{"subnet":"203.0.113.0/28","kind":"external"}`), http.StatusNoContent)
	w.do(http.MethodPost, "/vmms/"+testVMM+"/attached-subnets", []byte(`{"subnet":"203.0.113.0/28","kind":"external"}`), http.StatusConflict)
	w.do(http.MethodPut, "/vmms/2b2b2b2b-0000-4000-8000-000000000001/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.10"}`), http.StatusNotFound)
	w.do(http.MethodPut, "/vpc/001de000-074c-4000-8000-000000000000/firewall/rules", []byte(`{"vni":100,"rules":[]}`), http.StatusNoContent)
	view := first.VPC().View()
	if len(view.Firewall) != 1 || len(view.VMMs) != 1 || view.VMMs[0].External == nil || *view.VMMs[0].External.V4.EphemeralIP != "192.0.2.10" || len(view.VMMs[0].Subnets) != 1 {
		t.Errorf("told: %+v", view)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	second := newAgent(t, agent.Config{DataDir: dir})
	run(t, second)
	waitVMM(t, second, "running")
	w = newWire(t, second)
	if got := strings.TrimSpace(string(w.do(http.MethodGet, "/v2p", nil, http.StatusOK).Body)); got != v2p {
		t.Errorf("GET /v2p after a restart: %s, want %s", got, v2p)
	}
	if got := routeIDs(t, w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK).Body); !slices.Equal(got, s2) {
		t.Errorf("GET /vpc-routes after a restart: %q, want %q", got, s2)
	}
	again := second.VPC().View()
	for name, pair := range map[string][2]any{
		"routes": {view.Routes, again.Routes}, "firewall": {view.Firewall, again.Firewall}, "vmms": {view.VMMs, again.VMMs},
		"eip_gateways": {view.EIPGateways, again.EIPGateways}, "ports": {view.Ports, again.Ports},
	} {
		if !jsonEqual(t, pair[0], pair[1]) {
			t.Errorf("%s after a restart: %+v, before %+v", name, pair[1], pair[0])
		}
	}
	// The same ephemeral IP is still attached: the same again is a no-op,
	// another still refused.
	w.do(http.MethodPut, "/vmms/"+testVMM+"/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.10"}`), http.StatusNoContent)
	w.do(http.MethodPut, "/vmms/"+testVMM+"/external-ip", []byte(`{"type":"ephemeral","value":"192.0.2.11"}`), http.StatusInternalServerError)
}

func jsonEqual(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(x) == string(y)
}

// The sled config's service zones have ports (VPC.md S7): with the
// example config (a nexus and an external DNS zone), GET /vpc-routes lists
// the services VPC's system router and each zone's subnet's, before Nexus
// pushed anything; the services' firewall rules are kept while they have
// ports, and a config without those zones drops them.
func TestVPCServicePorts(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), UnderlayIP: exampleSled})
	w := newWire(t, a)
	doc, err := os.ReadFile(openapitest.UpstreamPath(t, "example-sled-config-v14.json"))
	if err != nil {
		t.Fatal(err)
	}
	w.do(http.MethodPut, "/omicron-config", doc, http.StatusNoContent)
	want := []string{`{"id":{"vni":100,"kind":{"type":"custom","subnet":"172.30.1.0/24"}},"version":null}`,
		`{"id":{"vni":100,"kind":{"type":"custom","subnet":"172.30.2.0/24"}},"version":null}`,
		`{"id":{"vni":100,"kind":{"type":"system"}},"version":null}`}
	if got := routeIDs(t, w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK).Body); !slices.Equal(got, want) {
		t.Errorf("GET /vpc-routes: %q, want %q", got, want)
	}
	w.do(http.MethodPut, "/vpc/001de000-074c-4000-8000-000000000000/firewall/rules", []byte(`{"vni":100,"rules":[
	  {"status":"enabled","direction":"inbound","targets":[],"filter_protocols":[{"type":"udp"}],"filter_ports":["53"],"action":"allow","priority":65534}]}`), http.StatusNoContent)
	v := a.VPC().View()
	if len(v.Ports) != 2 || len(v.Firewall) != 1 || v.Firewall[0].VNI != 100 {
		t.Errorf("GET /agent/vpc: ports %+v, firewall %+v", v.Ports, v.Firewall)
	}
	for _, p := range v.Ports {
		if p.Kind != "service" || p.External.V4 == nil || len(p.External.V4.FloatingIPs) != 1 {
			t.Errorf("a service port: %+v, want its zone's external IP floating", p)
		}
	}

	// The next generation without them: no port, nothing routed, and at
	// the next change the rules are dropped.
	var cfg map[string]any
	if err := json.Unmarshal(doc, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["generation"] = cfg["generation"].(float64) + 1
	zones := cfg["zones"].(map[string]any)
	for id, z := range zones {
		if typ := z.(map[string]any)["zone_type"].(map[string]any)["type"]; typ == "nexus" || typ == "external_dns" {
			delete(zones, id)
		}
	}
	w.do(http.MethodPut, "/omicron-config", mustJSON(t, cfg), http.StatusNoContent)
	if got := strings.TrimSpace(string(w.do(http.MethodGet, "/vpc-routes", nil, http.StatusOK).Body)); got != "[]" {
		t.Errorf("GET /vpc-routes without service zones: %s", got)
	}
	w.do(http.MethodPut, "/v2p", []byte(`{"virtual_ip":"172.30.0.6","virtual_mac":"A8:40:25:F0:00:02","physical_host_ip":"fd00:1122:3344:102::1","vni":7777}`), http.StatusNoContent)
	if v := a.VPC().View(); len(v.Ports) != 0 || len(v.Firewall) != 0 || len(v.V2P) != 1 {
		t.Errorf("GET /agent/vpc without service zones: %+v", v)
	}
}
