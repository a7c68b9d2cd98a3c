package dpdsim_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// Every operation the simulator serves, driven by our dpd client through a
// proxy that validates each request and answer against dpd 12.0.0: the
// client's requests and the simulator's answers, success and error.
func TestWireIsUpstreams(t *testing.T) {
	s, _ := start(t)
	proxy := openapitest.Load(t, openapitest.DPD).Proxy(t, s.URL())
	c, err := dpd.NewClient(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	ctx := t.Context()

	if _, err := c.SwitchIdentifiers(ctx); err != nil {
		t.Fatal(err)
	}
	// Enough entries on one address for more than one page.
	var want []dpd.NatEntry
	for i := range 70 {
		want = append(want, entry("192.0.2.10", uint16(i*10), uint16(i*10+9), target))
	}
	want = append(want, entry("192.0.2.11", 0, 65535, other), entry("2001:db8::10", 1024, 2047, target))
	for _, e := range want {
		for range 2 { // the same entry again is a no-op
			if err := c.CreateNAT(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.CreateNAT(ctx, entry("192.0.2.10", 5, 15, other)); !errors.Is(err, dpd.ErrConflict) {
		t.Fatalf("an overlapping entry: %v", err)
	}
	if got, err := c.GetNAT(ctx, netip.MustParseAddr("192.0.2.10"), 15); err != nil || got != target {
		t.Fatalf("GetNAT: %v, %v", got, err)
	}
	if got, err := c.GetNAT(ctx, netip.MustParseAddr("2001:db8::10"), 1500); err != nil || got != target {
		t.Fatalf("GetNAT v6: %v, %v", got, err)
	}
	if _, err := c.GetNAT(ctx, netip.MustParseAddr("192.0.2.12"), 0); !errors.Is(err, dpd.ErrNotFound) {
		t.Fatalf("GetNAT of nothing: %v", err)
	}
	for _, v6 := range []bool{false, true} {
		if _, err := c.NATAddresses(ctx, v6); err != nil {
			t.Fatal(err)
		}
	}
	all, err := c.AllNAT(ctx)
	if err != nil || len(all) != len(want) {
		t.Fatalf("AllNAT: %d entries, %v; want %d", len(all), err, len(want))
	}
	if _, err := c.NATEntries(ctx, netip.MustParseAddr("2001:db8::10")); err != nil {
		t.Fatal(err)
	}
	for _, e := range []dpd.NatEntry{want[0], want[len(want)-1], want[0]} { // the last one matches nothing
		if err := c.DeleteNAT(ctx, e.External, e.Low); err != nil {
			t.Fatal(err)
		}
	}

	// Errors: a fault (500), and requests our client never sends.
	if err := s.SetFault(simhttp.FaultError); err != nil {
		t.Fatal(err)
	}
	var apiErr *dpd.APIError
	if _, err := c.SwitchIdentifiers(ctx); !errors.As(err, &apiErr) || !apiErr.ServerError() {
		t.Fatalf("SwitchIdentifiers under an error fault: %v", err)
	}
	if err := s.SetFault(simhttp.FaultNone); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		method, path, version, body string
		status                      int
	}{
		{http.MethodGet, "/nat/ipv4", "", "", 400},
		{http.MethodGet, "/nat/ipv4", "13.0.0", "", 400},
		{http.MethodPut, "/nat/ipv4/192.0.2.20/10/5", dpd.APIVersion, targetJSON, 400},
		{http.MethodPut, "/nat/ipv4/192.0.2.20/1/5", dpd.APIVersion, `{"internal_ip":"fd00::1"}`, 400},
		{http.MethodGet, "/nat/ipv4/192.0.2.10/70000", dpd.APIVersion, "", 400},
		{http.MethodGet, "/nat/ipv4?limit=0", dpd.APIVersion, "", 400},
	} {
		req, err := http.NewRequestWithContext(ctx, r.method, proxy.URL+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if r.version != "" {
			req.Header.Set("api-version", r.version)
		}
		if r.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set(openapitest.InvalidRequest, "yes")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != r.status {
			t.Errorf("%s %s (api-version %q, body %s): %d, want %d", r.method, r.path, r.version, r.body, resp.StatusCode, r.status)
		}
	}
	var seen []string
	for _, fam := range []string{"ipv4", "ipv6"} {
		seen = append(seen, fmt.Sprintf("PUT /nat/%s/{%s}/{low}/{high} 204", fam, fam), fmt.Sprintf("GET /nat/%s/{%s}/{low} 200", fam, fam),
			fmt.Sprintf("GET /nat/%s 200", fam), fmt.Sprintf("GET /nat/%s/{%s} 200", fam, fam), fmt.Sprintf("DELETE /nat/%s/{%s}/{low} 204", fam, fam))
	}
	proxy.WantSeen(append(seen, "PUT /nat/ipv4/{ipv4}/{low}/{high} 409", "PUT /nat/ipv4/{ipv4}/{low}/{high} 400",
		"GET /nat/ipv4/{ipv4}/{low} 404", "GET /switch/identifiers 200", "GET /switch/identifiers 500", "GET /nat/ipv4 400")...)
}
