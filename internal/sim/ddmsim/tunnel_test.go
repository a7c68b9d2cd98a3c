package ddmsim_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

var netipEq = cmp.Options{
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
}

// boundary is a switch's boundary services origin (as mgd makes them).
func boundary(prefix, addr string, metric uint64) ddm.TunnelOrigin {
	return ddm.TunnelOrigin{OverlayPrefix: netip.MustParsePrefix(prefix), BoundaryAddr: netip.MustParseAddr(addr), VNI: 99, Metric: metric}
}

func routes(origins ...ddm.TunnelOrigin) []ddm.TunnelRoute {
	out := make([]ddm.TunnelRoute, len(origins))
	for i, o := range origins {
		out[i] = ddm.TunnelRoute{Nexthop: ddmsim.Peer, Origin: o}
	}
	return out
}

// What is PUT is originated, and learned through the simulator's one peer;
// origins are keyed by every field, host bits kept; both calls are
// idempotent; answers are sorted, in upstream's field names.
func TestTunnelEndpointsAreOriginatedAndLearned(t *testing.T) {
	s, _ := start(t)
	do := func(method, path, body string) simhttptest.Answer {
		t.Helper()
		return simhttptest.Do(t, method, s.URL()+path, ddmsim.APIVersion, "application/json", body)
	}
	for _, path := range []string{"/originated_tunnel_endpoints", "/tunnel_endpoints"} {
		if a := do("GET", path, ""); a.Status != 200 || a.Body != "[]" {
			t.Errorf("GET %s empty: %d %s, want 200 []", path, a.Status, a.Body)
		}
	}
	put := `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99},
		{"overlay_prefix":"::/0","boundary_addr":"fd00:99::1","vni":99,"metric":0,"future_field":true},
		{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":5},
		{"overlay_prefix":"10.1.2.3/8","boundary_addr":"fd00:99::1","vni":99}]`
	for range 2 {
		if a := do("PUT", "/tunnel_endpoint", put); a.Status != 204 || a.Body != "" {
			t.Fatalf("PUT: %d %s, want 204", a.Status, a.Body)
		}
	}
	want := []ddm.TunnelOrigin{
		boundary("0.0.0.0/0", "fd00:99::1", 0), boundary("0.0.0.0/0", "fd00:99::1", 5),
		boundary("10.1.2.3/8", "fd00:99::1", 0), boundary("::/0", "fd00:99::1", 0),
	}
	if diff := cmp.Diff(want, s.TunnelOrigins(), netipEq); diff != "" {
		t.Errorf("TunnelOrigins (-want +got):\n%s", diff)
	}
	wantOriginated := `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":0},` +
		`{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":5},` +
		`{"overlay_prefix":"10.1.2.3/8","boundary_addr":"fd00:99::1","vni":99,"metric":0},` +
		`{"overlay_prefix":"::/0","boundary_addr":"fd00:99::1","vni":99,"metric":0}]`
	if a := do("GET", "/originated_tunnel_endpoints", ""); a.Status != 200 || a.Body != wantOriginated {
		t.Errorf("GET /originated_tunnel_endpoints = %d %s\nwant 200 %s", a.Status, a.Body, wantOriginated)
	}
	a := do("GET", "/tunnel_endpoints", "")
	wantLearned := `[{"nexthop":"fe80::aa:1","origin":{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":0}},`
	if a.Status != 200 || !strings.HasPrefix(a.Body, wantLearned) || strings.Count(a.Body, `"nexthop":"fe80::aa:1"`) != 4 {
		t.Errorf("GET /tunnel_endpoints = %d %s\nwant 200, four routes through fe80::aa:1, starting %s", a.Status, a.Body, wantLearned)
	}

	// Withdrawal matches every field: the metric-0 default route goes,
	// its metric-5 twin and the host-bits prefix's masked twin (never
	// originated) change nothing; withdrawing twice is fine.
	del := `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99},
		{"overlay_prefix":"10.0.0.0/8","boundary_addr":"fd00:99::1","vni":99}]`
	for range 2 {
		if a := do("DELETE", "/tunnel_endpoint", del); a.Status != 204 {
			t.Fatalf("DELETE: %d %s, want 204", a.Status, a.Body)
		}
	}
	want = []ddm.TunnelOrigin{boundary("0.0.0.0/0", "fd00:99::1", 5), boundary("10.1.2.3/8", "fd00:99::1", 0), boundary("::/0", "fd00:99::1", 0)}
	if diff := cmp.Diff(routes(want...), s.TunnelRoutes(), netipEq); diff != "" {
		t.Errorf("TunnelRoutes after the withdrawal (-want +got):\n%s", diff)
	}
	wantReq := map[string]int{"PUT /tunnel_endpoint": 2, "DELETE /tunnel_endpoint": 2, "GET /originated_tunnel_endpoints": 2, "GET /tunnel_endpoints": 2}
	if diff := cmp.Diff(wantReq, s.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}

func TestBadTunnelBodiesChangeNothing(t *testing.T) {
	s, _ := start(t)
	kept := `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99}]`
	if a := simhttptest.Do(t, "PUT", s.URL()+"/tunnel_endpoint", ddmsim.APIVersion, "application/json", kept); a.Status != 204 {
		t.Fatalf("PUT: %d %s", a.Status, a.Body)
	}
	const good = `"overlay_prefix":"10.0.0.0/8","boundary_addr":"fd00:99::2"`
	for _, tt := range []struct{ name, contentType, body, says string }{
		{"empty", "application/json", "", "array"},
		{"null", "application/json", "null", "array"},
		{"object", "application/json", `{` + good + `,"vni":99}`, "array"},
		{"array of strings", "application/json", `["10.0.0.0/8"]`, "object"},
		{"no overlay_prefix", "application/json", `[{"boundary_addr":"fd00:99::2","vni":99}]`, "overlay_prefix"},
		{"no boundary_addr", "application/json", `[{"overlay_prefix":"10.0.0.0/8","vni":99}]`, "boundary_addr"},
		{"no vni", "application/json", `[{` + good + `}]`, "vni"},
		{"vni null", "application/json", `[{` + good + `,"vni":null}]`, "vni"},
		{"vni negative", "application/json", `[{` + good + `,"vni":-1}]`, "vni"},
		{"vni fraction", "application/json", `[{` + good + `,"vni":9.5}]`, "vni"},
		{"vni string", "application/json", `[{` + good + `,"vni":"99"}]`, "vni"},
		{"vni over 24 bits", "application/json", `[{` + good + `,"vni":16777216}]`, "24 bits"},
		{"vni over 32 bits", "application/json", `[{` + good + `,"vni":4294967296}]`, "vni"},
		{"metric negative", "application/json", `[{` + good + `,"vni":99,"metric":-1}]`, "metric"},
		{"metric null", "application/json", `[{` + good + `,"vni":99,"metric":null}]`, "metric"},
		{"prefix garbage", "application/json", `[{"overlay_prefix":"nope","boundary_addr":"fd00:99::2","vni":99}]`, "overlay_prefix"},
		{"prefix without width", "application/json", `[{"overlay_prefix":"10.0.0.0","boundary_addr":"fd00:99::2","vni":99}]`, "overlay_prefix"},
		{"prefix too wide", "application/json", `[{"overlay_prefix":"10.0.0.0/33","boundary_addr":"fd00:99::2","vni":99}]`, "overlay_prefix"},
		{"boundary IPv4", "application/json", `[{"overlay_prefix":"10.0.0.0/8","boundary_addr":"192.0.2.1","vni":99}]`, "boundary_addr"},
		{"boundary with zone", "application/json", `[{"overlay_prefix":"10.0.0.0/8","boundary_addr":"fe80::1%eth0","vni":99}]`, "boundary_addr"},
		{"boundary a net", "application/json", `[{"overlay_prefix":"10.0.0.0/8","boundary_addr":"fd00::/64","vni":99}]`, "boundary_addr"},
		{"one good one bad", "application/json", `[{` + good + `,"vni":99},{` + good + `}]`, "origin 1"},
		{"trailing data", "application/json", `[{` + good + `,"vni":99}] x`, "invalid character"},
		{"wrong content type", "text/plain", `[{` + good + `,"vni":99}]`, "content"},
	} {
		for _, method := range []string{"PUT", "DELETE"} {
			a := simhttptest.Do(t, method, s.URL()+"/tunnel_endpoint", ddmsim.APIVersion, tt.contentType, tt.body)
			if a.Status != 400 {
				t.Errorf("%s %s: %d %s, want 400", method, tt.name, a.Status, a.Body)
				continue
			}
			simhttptest.CheckErrorBody(t, a)
			if !strings.Contains(strings.ToLower(a.Body), strings.ToLower(tt.says)) {
				t.Errorf("%s %s: %s, want it to name %q", method, tt.name, a.Body, tt.says)
			}
		}
	}
	if diff := cmp.Diff([]ddm.TunnelOrigin{boundary("0.0.0.0/0", "fd00:99::1", 0)}, s.TunnelOrigins(), netipEq); diff != "" {
		t.Errorf("state changed (-want +got):\n%s", diff)
	}
}

// A restart loses the tunnel endpoints as it loses the prefixes; the
// control state shows them.
func TestTunnelEndpointsInStateAndLostOnRestart(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.AdvertiseTunnelEndpoints(ctx, []ddm.TunnelOrigin{boundary("0.0.0.0/0", "fd00:99::1", 0)}); err != nil {
		t.Fatal(err)
	}
	a := simhttptest.Do(t, "GET", s.URL()+"/__sim/state", "", "", "")
	var st struct {
		TunnelOriginated []ddm.TunnelOrigin `json:"tunnel_originated"`
	}
	if err := json.Unmarshal([]byte(a.Body), &st); err != nil || a.Status != 200 {
		t.Fatalf("state: %d %s: %v", a.Status, a.Body, err)
	}
	if diff := cmp.Diff([]ddm.TunnelOrigin{boundary("0.0.0.0/0", "fd00:99::1", 0)}, st.TunnelOriginated, netipEq); diff != "" {
		t.Errorf("state's tunnel_originated (-want +got):\n%s", diff)
	}
	s.RestartEmpty()
	for _, get := range []func() (int, error){
		func() (int, error) { o, err := c.OriginatedTunnelEndpoints(ctx); return len(o), err },
		func() (int, error) { r, err := c.TunnelEndpoints(ctx); return len(r), err },
	} {
		if n, err := get(); err != nil || n != 0 {
			t.Errorf("after restart: %d endpoints, %v; want none", n, err)
		}
	}
	if a := simhttptest.Do(t, "GET", s.URL()+"/__sim/state", "", "", ""); !strings.Contains(a.Body, `"tunnel_originated":[]`) {
		t.Errorf("state after restart = %s, want an empty tunnel_originated array", a.Body)
	}
}
