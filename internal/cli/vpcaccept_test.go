package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// defaultRules are Nexus's default rules of a new VPC (allow-internal-inbound,
// allow-ssh, allow-icmp) for the guests' NICs in vni.
func defaultRules(vni int, gs ...*acceptGuest) string {
	var nics []string
	for _, g := range gs {
		nics = append(nics, g.nicJSON())
	}
	ts := strings.Join(nics, ",")
	return fmt.Sprintf(`[{"status":"enabled","direction":"inbound","targets":[%s],"filter_hosts":[{"type":"vpc","value":%d}],"action":"allow","priority":65534},`+
		`{"status":"enabled","direction":"inbound","targets":[%s],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},`+
		`{"status":"enabled","direction":"inbound","targets":[%s],"filter_protocols":[{"type":"icmp","value":null}],"action":"allow","priority":65534}]`, ts, vni, ts, ts)
}

// VPC.md S1 at agent level: two guests registered and run on two sleds as
// Nexus does; before any route, the sled lists the RouterIDs its port
// needs (no version), no v2p mapping, a datagram from A to B is dropped
// by the router layer, and the gateway answers A's ICMP echo.
func TestVPCAcceptBeforeRoutes(t *testing.T) {
	sa, sb := twoSleds(t, "--vmm-stand-in")
	n := newNexus(t)
	a, b := sledGuest("a", sa), sledGuest("b", sb)
	a.register(n, defaultRules(7777, a, b), "192.0.2.20")
	b.register(n, defaultRules(7777, a, b), "192.0.2.21")
	findGuests(t, a, b)
	debug := func() string {
		var out []string
		for _, s := range []*vpcSled{sa, sb} {
			st, _ := s.dataPath().State(t.Context())
			j, _ := json.Marshal(st)
			out = append(out, string(j))
		}
		return strings.Join(out, "\n")
	}
	var ids []string
	var got []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(n.must(sa, http.StatusOK, http.MethodGet, "/vpc-routes", "")), &got); err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if v, ok := r["version"]; ok && string(v) != "null" {
			t.Errorf("route set %s has version %s before any push", r["id"], v)
		}
		ids = append(ids, string(r["id"]))
	}
	slices.Sort(ids)
	want := []string{`{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}}`, `{"vni":7777,"kind":{"type":"system"}}`}
	if !slices.Equal(ids, want) {
		t.Errorf("GET /vpc-routes ids %v, want %v", ids, want)
	}
	if v2p := n.must(sa, http.StatusOK, http.MethodGet, "/v2p", ""); strings.TrimSpace(v2p) != "[]" {
		t.Errorf("GET /v2p = %s, want []", v2p)
	}
	newUDPEcho(t, b.ns, b.ip+":5000", "B")
	droppedProbe(t, "A to B before routes", newUDPProbe(t, a.ns, a.ip+":0", b.ip+":5000"), a, "no route", debug)
	answeredProbe(t, "A to its gateway", newICMPProbe(t, a.ns, "172.30.0.1"), debug)
}
