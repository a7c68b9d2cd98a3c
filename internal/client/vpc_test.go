package client

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
)

// Nexus's pushes go to upstream's paths with their bodies as given, and an
// agent's refusal is an APIError with its status.
func TestVPCPushes(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.EscapedPath()+" "+string(b))
		mu.Unlock()
		if r.Header.Get("api-version") != api.Version || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "wrong headers", http.StatusBadRequest)
			return
		}
		if string(b) == "refused" {
			http.Error(w, `{"message":"no"}`, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		c.SetVPCFirewallRules(t.Context(), "9b5e0c5e-0000-4000-8000-000000000001", []byte(`{"vni":7777,"rules":[]}`)),
		c.SetVPCRoutes(t.Context(), []byte(`[]`)),
		c.SetV2P(t.Context(), []byte(`{"vni":7777}`)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`PUT /vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules {"vni":7777,"rules":[]}`,
		`PUT /vpc-routes []`,
		`PUT /v2p {"vni":7777}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
	var e *APIError
	if err := c.SetV2P(t.Context(), []byte("refused")); !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Body.Message != "no" {
		t.Errorf("a refused push: %v, want the agent's 400 and its message", err)
	}
}
