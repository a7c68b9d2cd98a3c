package agent_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// wire sends requests to a real agent over loopback and validates every
// exchange, request and answer, against upstream's sled-agent document.
type wire struct {
	t    *testing.T
	spec *openapitest.Spec
	base string
}

func newWire(t *testing.T, a *agent.Agent) *wire {
	return &wire{t: t, spec: openapitest.Load(t, openapitest.SledAgent), base: "http://" + a.Addr()}
}

// do sends one request as a client generated from upstream's document
// would (api-version, JSON) and wants status; a mismatch with the document
// fails the test.
func (w *wire) do(method, path string, body []byte, status int) openapitest.Exchange {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.t.Context(), method, w.base+path, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("api-version", api.Version)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	x, err := w.spec.Do(w.t, http.DefaultClient, req, body)
	if err != nil {
		w.t.Errorf("%v\nanswer: %d %s", err, x.Status, x.Body)
	}
	if x.Status != status {
		w.t.Errorf("%s %s: %d %s, want %d", method, path, x.Status, x.Body, status)
	}
	return x
}

// upstreamEnsureBody is an InstanceEnsureBody with every member upstream
// requires, as the control plane sends it: every instance's disks are NVMe
// disks, whose has_write_cache sled-agent 48 requires.
func upstreamEnsureBody(addr string) []byte {
	return []byte(`{"instance_id":"0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e","migration_id":null,"propolis_addr":"` + addr + `",
	"vmm_runtime":{"gen":1,"state":"starting","time_updated":"2026-11-29T00:00:00Z"},
	"local_config":{"attached_subnets":[],"delegated_zvols":[],"dhcp_config":{"dns_servers":["fd00:1122:3344:1::1"],"host_domain":null,"search_domains":[]},
		"external_ips":{"v4":null,"v6":null},"firewall_rules":[],"hostname":"vm0","multicast_groups":[],"nics":[],"primary_nic_mtu":null},
	"metadata":{"project_id":"5b0a4d2e-1c3f-4e5a-8b6c-7d8e9f0a1b2c","silo_id":"6c1b5e3f-2d4a-4f6b-9c7d-8e9f0a1b2c3d"},
	"vmm_spec":{"board":{"chipset":{"type":"i440_fx","value":{"enable_pcie":false}},"cpus":2,"memory_mb":1024},"components":{
		"disk0":{"type":"nvme_disk","component":{"backend_id":"disk0-backend","has_write_cache":false,"pci_path":{"bus":0,"device":16,"function":0},
			"serial_number":[100,105,115,107,48,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}},
		"disk0-backend":{"type":"blob_storage_backend","component":{"base64":"AAAAAA==","readonly":true}}}}}`)
}

// Every operation of upstream's that the agent serves, but GET /inventory
// and GET /sled-identifiers, with what a client generated from upstream's
// document sends and what the agent answers, both checked against that
// document: PUT /omicron-config with the example config and the test
// configs, refused ones, GET /zones, and the /vmms family.
func TestWireSledAgentIsUpstreams(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	w := newWire(t, a)

	if x := w.do(http.MethodGet, "/zones", nil, http.StatusOK); strings.TrimSpace(string(x.Body)) != "[]" {
		t.Errorf("GET /zones before any config: %s, want []", x.Body)
	}

	// The example, on a sled of its own: its zones are in another /64 than
	// the test configs'.
	exampleAgent, _ := start(t, agent.Config{DataDir: t.TempDir(), UnderlayIP: exampleSled})
	we := newWire(t, exampleAgent)
	exampleDoc, err := os.ReadFile(openapitest.UpstreamPath(t, "example-sled-config-v14.json"))
	if err != nil {
		t.Fatal(err)
	}
	we.do(http.MethodPut, "/omicron-config", exampleDoc, http.StatusNoContent)
	we.do(http.MethodPut, "/omicron-config", exampleDoc, http.StatusNoContent) // same generation, same content
	exampleGen := example(t).Generation
	waitFor(t, "the example's zones running", func() (bool, string) {
		x := we.do(http.MethodGet, "/zones", nil, http.StatusOK)
		var names []string
		json.Unmarshal(x.Body, &names)
		return len(names) == len(example(t).Zones), string(x.Body)
	})

	// Refused: an older generation, and the same generation with other
	// content. Both requests are upstream's shape; the answers are Errors.
	for _, doc := range [][]byte{withGeneration(t, exampleDoc, exampleGen-1), withGeneration(t, []byte(configDoc(t, exampleGen)), exampleGen)} {
		x := we.do(http.MethodPut, "/omicron-config", doc, http.StatusBadRequest)
		if !strings.Contains(string(x.Body), `"message"`) {
			t.Errorf("a refused config: %s", x.Body)
		}
	}

	// The test configs.
	gen := exampleGen
	for _, zones := range [][]sledconfig.Zone{
		sledconfigtest.Crucibles(3),
		{sledconfigtest.Nexus(1, "[fd00:1122:3344:101::11]:12221"), sledconfigtest.InternalDNS(2), sledconfigtest.Crucible(3)},
		nil,
	} {
		gen++
		w.do(http.MethodPut, "/omicron-config", []byte(configDoc(t, gen, zones...)), http.StatusNoContent)
	}
	waitFor(t, "no zone running", func() (bool, string) {
		x := w.do(http.MethodGet, "/zones", nil, http.StatusOK)
		return strings.TrimSpace(string(x.Body)) == "[]", string(x.Body)
	})

	// The /vmms family.
	vmmPath := "/vmms/" + testVMM
	w.do(http.MethodGet, vmmPath+"/state", nil, http.StatusNotFound)
	w.do(http.MethodPut, vmmPath+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusNotFound)
	w.do(http.MethodDelete, vmmPath, nil, http.StatusNotFound)
	body := upstreamEnsureBody("[fd00:1122:3344:101::1:5]:12400")
	w.do(http.MethodPut, vmmPath, body, http.StatusOK)
	w.do(http.MethodPut, vmmPath, body, http.StatusOK) // again: its state
	w.do(http.MethodPut, vmmPath, upstreamEnsureBody("[fd00:1122:3344:101::1:6]:12400"), http.StatusConflict)
	w.do(http.MethodGet, vmmPath+"/state", nil, http.StatusOK)
	w.do(http.MethodPut, vmmPath+"/state", []byte(`{"state":{"type":"migration_target","value":{"src_propolis_addr":"[fd00:1122:3344:102::1:5]:12400"}}}`), http.StatusBadRequest)
	w.do(http.MethodPut, vmmPath+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusOK)
	waitFor(t, "the VMM running", func() (bool, string) {
		x := w.do(http.MethodGet, vmmPath+"/state", nil, http.StatusOK)
		return strings.Contains(string(x.Body), `"state":"running"`), string(x.Body)
	})
	x := w.do(http.MethodPut, vmmPath+"/state", []byte(`{"state":{"type":"running"}}`), http.StatusOK)
	if !strings.Contains(string(x.Body), `"updated_runtime":null`) {
		t.Errorf("asking a running VMM to run: %s, want updated_runtime null", x.Body)
	}
	w.do(http.MethodPut, vmmPath+"/state", []byte(`{"state":{"type":"stopped"}}`), http.StatusOK)
	waitFor(t, "the VMM destroyed", func() (bool, string) {
		x := w.do(http.MethodGet, vmmPath+"/state", nil, http.StatusOK)
		return strings.Contains(string(x.Body), `"state":"destroyed"`), string(x.Body)
	})
	w.do(http.MethodDelete, vmmPath, nil, http.StatusOK)
	w.do(http.MethodGet, vmmPath+"/state", nil, http.StatusNotFound)
}
