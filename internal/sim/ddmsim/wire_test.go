package ddmsim_test

import (
	"bytes"
	"errors"
	"net/http"
	"testing"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// Every operation the simulator serves, driven by our DDM client through a
// proxy that validates each request and answer against ddm-admin 2.0.0:
// the client's requests and the simulator's answers, success and error.
func TestWireIsUpstreams(t *testing.T) {
	s, _ := start(t)
	spec := openapitest.Load(t, openapitest.DDM)
	proxy := spec.Proxy(t, s.URL())
	c, err := ddm.NewClient(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	ctx := t.Context()

	if _, err := c.Originated(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Advertise(ctx, prefixes("fd00:1122:3344:101::/64", "fd00:1122:3344:1::/64")); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Originated(ctx); err != nil || len(got) != 2 {
		t.Fatalf("Originated: %v, %v", got, err)
	}
	if err := c.Withdraw(ctx, prefixes("fd00:1122:3344:1::/64", "fd00:9::/64")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Peers(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prefixes(ctx); err != nil {
		t.Fatal(err)
	}
	origins := []ddm.TunnelOrigin{boundary("0.0.0.0/0", "fd00:99::1", 0), boundary("::/0", "fd00:99::1", 5), boundary("0.0.0.0/0", "fd00:99::1", 0)}
	if err := c.AdvertiseTunnelEndpoints(ctx, origins); err != nil {
		t.Fatal(err)
	}
	if got, err := c.OriginatedTunnelEndpoints(ctx); err != nil || len(got) != 2 {
		t.Fatalf("OriginatedTunnelEndpoints: %v, %v", got, err)
	}
	if got, err := c.TunnelEndpoints(ctx); err != nil || len(got) != 2 {
		t.Fatalf("TunnelEndpoints: %v, %v", got, err)
	}
	if err := c.WithdrawTunnelEndpoints(ctx, origins[:1]); err != nil {
		t.Fatal(err)
	}

	// Errors: a fault (500), and requests our client never sends (no
	// api-version, a newer one, a body that is no array of nets).
	if err := s.SetFault(simhttp.FaultError); err != nil {
		t.Fatal(err)
	}
	var apiErr *ddm.APIError
	if _, err := c.Originated(ctx); !errors.As(err, &apiErr) || !apiErr.ServerError() {
		t.Fatalf("Originated under an error fault: %v", err)
	}
	if err := s.SetFault(simhttp.FaultNone); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		method, path, version, body string
	}{
		{http.MethodGet, "/originated", "", ""},
		{http.MethodGet, "/originated", "99.0.0", ""},
		{http.MethodPut, "/prefix", ddm.APIVersion, `{"prefix":"fd00::/64"}`},
		{http.MethodPut, "/tunnel_endpoint", ddm.APIVersion, `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"192.0.2.1","vni":99}]`},
		{http.MethodDelete, "/tunnel_endpoint", ddm.APIVersion, `[{"overlay_prefix":"0.0.0.0/0","vni":99}]`},
	} {
		req, err := http.NewRequestWithContext(ctx, r.method, proxy.URL+r.path, bytes.NewReader([]byte(r.body)))
		if err != nil {
			t.Fatal(err)
		}
		if r.version != "" {
			req.Header.Set("api-version", r.version)
		}
		req.Header.Set(openapitest.InvalidRequest, "yes")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s (api-version %q, body %s): %d, want 400", r.method, r.path, r.version, r.body, resp.StatusCode)
		}
	}
	// A VNI over 24 bits is a valid request by the document, refused (as
	// ddmd does not) with a valid answer.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, proxy.URL+"/tunnel_endpoint",
		bytes.NewReader([]byte(`[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":16777216}]`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("api-version", ddm.APIVersion)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("PUT /tunnel_endpoint with a VNI over 24 bits: %d, want 400", resp.StatusCode)
	}
	proxy.WantSeen("GET /originated 200", "GET /originated 500", "GET /originated 400", "PUT /prefix 204",
		"DELETE /prefix 204", "GET /peers 200", "GET /prefixes 200",
		"PUT /tunnel_endpoint 204", "PUT /tunnel_endpoint 400", "DELETE /tunnel_endpoint 204", "DELETE /tunnel_endpoint 400",
		"GET /originated_tunnel_endpoints 200", "GET /tunnel_endpoints 200")
}
