package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
	"github.com/sled-agent/sled-agent/internal/vpc/told/toldtest"
)

// fakeSled has one VMM, active, with $NIC_A of VPC.md §4.
type fakeSled struct{ vmms []told.VMM }

func (f fakeSled) VMMs() []told.VMM          { return f.vmms }
func (f fakeSled) ServicePorts() []told.Port { return nil }

const (
	vmmA = "a0000000-0000-4000-8000-0000000000a1"
	nicA = `{"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},
  "name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]}},
  "mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0}`
)

func vmmWithNICA(t *testing.T) told.VMM {
	t.Helper()
	v, err := told.ParseVMM(vmmA, []byte(`{"local_config":{"nics":[`+nicA+`],
	  "external_ips":{"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":null,"floating_ips":[]}},
	  "firewall_rules":[]}}`))
	if err != nil {
		t.Fatal(err)
	}
	v.Active = true
	return v
}

// Every VPC operation over the wire, each exchange checked against
// upstream's document, with what the data path is asked for each.
func TestVPCOperationsOverTheWire(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	dp := &toldtest.Recorder{}
	store, err := told.Open(told.Options{Dirs: []string{t.TempDir()}, Sled: fakeSled{vmms: []told.VMM{vmmWithNICA(t)}}, DataPath: dp})
	if err != nil {
		t.Fatal(err)
	}
	s := newSled(t, sim.Options{}, func(d *api.Deps) { d.VPC = store })
	srv := httptest.NewServer(s.server.Handler())
	defer srv.Close()
	do := func(method, path, body string, status int, says string) []byte {
		t.Helper()
		var rb []byte
		if body != "" {
			rb = []byte(body)
		}
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		x, err := spec.Do(t, srv.Client(), req, rb)
		if status == http.StatusBadRequest || strings.Contains(path, "%2F") || strings.HasPrefix(path, "/agent/") {
			// A request upstream would not send; the validator does not
			// unescape a path parameter; GET /agent/vpc is ours.
			err = nil
			if !strings.HasPrefix(path, "/agent/") {
				err = spec.CheckAnswer(x)
			}
		}
		if err != nil {
			t.Errorf("%s %s %s: %v", method, path, body, err)
		}
		if x.Status != status || !strings.Contains(string(x.Body), says) {
			t.Errorf("%s %s %s: %d %s, want %d saying %q", method, path, body, x.Status, x.Body, status, says)
		}
		return bytes.TrimSpace(x.Body)
	}
	want := func(calls ...string) {
		t.Helper()
		got := dp.Took()
		if strings.Join(got, "\n") != strings.Join(calls, "\n") {
			t.Errorf("data path calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(calls, "\n"))
		}
	}
	const port = "instance/a0000000-0000-4000-8000-0000000000c1"

	// S1: the routes the port needs, none applied; no mappings.
	if got := string(do("GET", "/vpc-routes", "", 200, "")); got != `[{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null},{"id":{"vni":7777,"kind":{"type":"system"}},"version":null}]` {
		t.Errorf("GET /vpc-routes: %s", got)
	}
	do("GET", "/v2p", "", 200, "[]")
	want()

	// S2: the gateways, then the routes; the port is made first.
	do("PUT", "/eip-gateways", `{"mappings":{"a0000000-0000-4000-8000-0000000000c1":{"192.0.2.20":["1a5e0c5e-0000-4000-8000-0000000000a1"]}}}`, 204, "")
	want("create "+port+` rules=0 system=[] custom=[] ext={"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"floating_ips":[]}} gw={"192.0.2.20":["1a5e0c5e-0000-4000-8000-0000000000a1"]} subnets=null`,
		`ext `+port+` {"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"floating_ips":[]}} gw=1`)
	routes := `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},
	  "routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}},
	            {"dest":"0.0.0.0/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"1a5e0c5e-0000-4000-8000-0000000000a1"}}}]},
	 {"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]},
	 {"id":{"vni":8888,"kind":{"type":"system"}},"version":null,"routes":[{"dest":"0.0.0.0/0","target":{"type":"drop"}}]}]`
	do("PUT", "/vpc-routes", routes, 204, "")
	want("add-route "+port+" system 0.0.0.0/0 internet_gateway", "add-route "+port+" system 172.30.0.0/22 vpc_subnet")
	if got := string(do("GET", "/vpc-routes", "", 200, "")); !strings.Contains(got, `{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3}}`) || strings.Contains(got, "8888") {
		t.Errorf("GET /vpc-routes after the push: %s", got)
	}
	// The version gate: the same sets at version 2 change nothing.
	do("PUT", "/vpc-routes", strings.Replace(strings.Replace(routes, `"version":3`, `"version":2`, 1), `"172.30.0.0/22","target"`, `"10.0.0.0/8","target"`, 1), 204, "")
	want()
	// A higher version replaces: only the difference is applied.
	do("PUT", "/vpc-routes", strings.Replace(strings.Replace(routes, `"version":3`, `"version":4`, 1), `"172.30.0.0/22","target"`, `"10.0.0.0/8","target"`, 1), 204, "")
	want("del-route "+port+" system 172.30.0.0/22 vpc_subnet", "add-route "+port+" system 10.0.0.0/8 vpc_subnet")

	// S3: mappings by (vni, virtual_ip); the same again changes nothing
	// in the record; a delete ignores MAC and host.
	m1 := `{"virtual_ip":"172.30.0.5","virtual_mac":"A8:40:25:F0:00:01","physical_host_ip":"fd00:1122:3344:101::1","vni":7777}`
	m2 := `{"virtual_ip":"172.30.0.6","virtual_mac":"a8:40:25:f0:00:02","physical_host_ip":"fd00:1122:3344:102::1","vni":7777}`
	do("PUT", "/v2p", m1, 204, "")
	do("PUT", "/v2p", m2, 204, "")
	do("PUT", "/v2p", m2, 204, "")
	want("set-v2p 7777 172.30.0.5 A8:40:25:F0:00:01 fd00:1122:3344:101::1", "set-v2p 7777 172.30.0.6 A8:40:25:F0:00:02 fd00:1122:3344:102::1",
		"set-v2p 7777 172.30.0.6 A8:40:25:F0:00:02 fd00:1122:3344:102::1")
	if got := string(do("GET", "/v2p", "", 200, "")); got != "["+m1+","+`{"virtual_ip":"172.30.0.6","virtual_mac":"A8:40:25:F0:00:02","physical_host_ip":"fd00:1122:3344:102::1","vni":7777}]` {
		t.Errorf("GET /v2p: %s", got)
	}
	do("DELETE", "/v2p", strings.Replace(m2, "a8:40:25:f0:00:02", "A8:40:25:F0:00:09", 1), 204, "")
	do("DELETE", "/v2p", m2, 204, "")
	want("clear-v2p 7777 172.30.0.6", "clear-v2p 7777 172.30.0.6")
	if got := string(do("GET", "/v2p", "", 200, "")); strings.Contains(got, "172.30.0.6") {
		t.Errorf("GET /v2p after the delete: %s", got)
	}

	// Firewall rules: the VNI's ports; none in the VNI is a 204 all the same.
	do("PUT", "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":[{"status":"enabled","direction":"inbound","targets":[`+nicA+`],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},
	  {"status":"enabled","direction":"inbound","targets":[],"filter_hosts":[{"type":"vpc","value":7777}],"filter_protocols":null,"action":"allow","priority":65534}]}`, 204, "")
	want("fw " + port + " 2")
	do("PUT", "/vpc/001de000-074c-4000-8000-000000000000/firewall/rules", `{"vni":100,"rules":[]}`, 204, "")
	want()

	// External IPs: the same ephemeral again, another (500), floating.
	eph := `{"type":"ephemeral","value":"192.0.2.10"}`
	do("PUT", "/vmms/"+vmmA+"/external-ip", eph, 204, "")
	do("PUT", "/vmms/"+vmmA+"/external-ip", eph, 204, "")
	want(`ext `+port+` {"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":"192.0.2.10","floating_ips":[]}} gw=1`,
		`ext `+port+` {"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":"192.0.2.10","floating_ips":[]}} gw=1`)
	do("PUT", "/vmms/"+vmmA+"/external-ip", `{"type":"ephemeral","value":"192.0.2.11"}`, 500, "192.0.2.10 is attached")
	want()
	do("PUT", "/vmms/"+vmmA+"/external-ip", `{"type":"floating","value":"192.0.2.12"}`, 204, "")
	do("DELETE", "/vmms/"+vmmA+"/external-ip", eph, 204, "")
	want(`ext `+port+` {"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":"192.0.2.10","floating_ips":["192.0.2.12"]}} gw=1`,
		`ext `+port+` {"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"floating_ips":["192.0.2.12"]}} gw=1`)
	unknown := "d0000000-0000-4000-8000-0000000000ff"
	do("PUT", "/vmms/"+unknown+"/external-ip", eph, 404, api.NoSuchInstance)
	do("DELETE", "/vmms/"+unknown+"/external-ip", eph, 404, api.NoSuchInstance)
	do("PUT", "/vmms/"+unknown+"/attached-subnets", `{"subnets":[]}`, 404, api.NoSuchInstance)

	// Attached subnets.
	do("PUT", "/vmms/"+vmmA+"/attached-subnets", `{"subnets":[{"subnet":"10.1.0.0/24","kind":"external"},{"subnet":"10.2.0.0/24","kind":"vpc"}]}`, 204, "")
	want("attach "+port+" 10.1.0.0/24", "attach "+port+" 10.2.0.0/24")
	do("POST", "/vmms/"+vmmA+"/attached-subnets", `{"subnet":"10.1.0.0/24","kind":"external"}`, 409, api.SubnetAlreadyAttached)
	do("POST", "/vmms/"+vmmA+"/attached-subnets", `{"subnet":"10.3.0.0/24","kind":"external"}`, 204, "")
	want("attach " + port + " 10.3.0.0/24")
	do("PUT", "/vmms/"+vmmA+"/attached-subnets", `{"subnets":[{"subnet":"10.3.0.0/24","kind":"external"}]}`, 204, "")
	want("detach "+port+" 10.1.0.0/24", "detach "+port+" 10.2.0.0/24", "attach "+port+" 10.3.0.0/24")
	do("DELETE", "/vmms/"+vmmA+"/attached-subnets/10.3.0.0%2F24", "", 204, "")
	do("DELETE", "/vmms/"+vmmA+"/attached-subnets/10.3.0.0%2F24", "", 204, "")
	want("detach " + port + " 10.3.0.0/24")
	do("POST", "/vmms/"+vmmA+"/attached-subnets", `{"subnet":"10.4.0.0/24","kind":"vpc"}`, 204, "")
	do("DELETE", "/vmms/"+vmmA+"/attached-subnets", "", 204, "")
	want("attach "+port+" 10.4.0.0/24", "detach "+port+" 10.4.0.0/24")

	// Probes: a port each, its routes listed; replaced as a whole.
	probe := `{"probes":[{"id":"f0000000-0000-4000-8000-000000000001","external_ips":[{"ip":"192.0.2.40","first_port":0,"last_port":16383,"kind":"snat"}],
	  "interface":{"id":"f0000000-0000-4000-8000-0000000000c1","kind":{"type":"probe","id":"f0000000-0000-4000-8000-000000000001"},"name":"probe0",
	  "ip_config":{"type":"v4","value":{"ip":"172.31.0.5","subnet":"172.31.0.0/24"}},"mac":"A8:40:25:F0:00:09","vni":9999,"primary":true,"slot":0}}]}`
	do("PUT", "/probes", probe, 204, "")
	want(`create probe/f0000000-0000-4000-8000-0000000000c1 rules=1 system=[] custom=[] ext={"v4":{"source_nat":{"ip":"192.0.2.40","first_port":0,"last_port":16383},"floating_ips":[]}} gw=null subnets=null`)
	if got := string(do("GET", "/vpc-routes", "", 200, "")); !strings.Contains(got, `{"id":{"vni":9999,"kind":{"type":"system"}},"version":null}`) {
		t.Errorf("GET /vpc-routes with a probe: %s", got)
	}
	do("PUT", "/probes", `{"probes":[]}`, 204, "")
	want("delete probe/f0000000-0000-4000-8000-0000000000c1")

	// A data path failure is a 500 (upstream's OPTE errors are).
	dp.Fail(errors.New("port on fire"))
	do("PUT", "/v2p", m2, 500, "port on fire")
	dp.Fail(nil)
	dp.Took()

	// Bad input: a 400 naming it, nothing asked of the data path.
	do("PUT", "/v2p", `{"virtual_ip":"172.30.0.7","virtual_mac":"A8:40:25:F0:00:07","physical_host_ip":"10.0.0.1","vni":7777}`, 400, "physical_host_ip")
	do("PUT", "/vpc-routes", `[{"id":{"vni":7777,"kind":{"type":"custom","subnet":"nope"}},"routes":[]}]`, 400, "subnet")
	do("PUT", "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":[{"status":"enabled","direction":"sideways","targets":[],"action":"allow","priority":1}]}`, 400, "direction")
	do("PUT", "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":[{"status":"enabled","direction":"inbound","targets":[`+strings.Replace(nicA, "A8:40:25:F0:00:01", "A8:40:25", 1)+`],"action":"allow","priority":1}]}`, 400, "rules[0].targets[0].mac")
	do("PUT", "/vmms/"+vmmA+"/external-ip", `{"type":"ephemeral","value":"nope"}`, 400, "value")
	do("POST", "/vmms/"+vmmA+"/attached-subnets", `{"subnet":"10.5.0.0/24","kind":"moon"}`, 400, "kind")
	do("DELETE", "/vmms/"+vmmA+"/attached-subnets/nope", "", 400, "subnet")
	do("PUT", "/probes", `{"probes":[{"id":"x"}]}`, 400, "id")
	want()

	// Our view.
	var v told.View
	if err := json.Unmarshal(do("GET", "/agent/vpc", "", 200, ""), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Ports) != 1 || len(v.V2P) != 2 || len(v.Firewall) != 1 || v.Generation == 0 || len(v.Copies) != 1 {
		t.Errorf("GET /agent/vpc: %+v", v)
	}
}

// boundedVPC is a record of no VMM, kept in a test directory.
func boundedVPC(t *testing.T) *told.Store {
	t.Helper()
	store, err := told.Open(told.Options{Dirs: []string{t.TempDir()}, Sled: fakeSled{}})
	if err != nil {
		t.Fatal(err)
	}
	return store
}
