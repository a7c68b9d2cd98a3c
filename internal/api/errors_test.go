package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// noVMMs is a VMM manager with no VMM.
type noVMMs struct{}

func (noVMMs) Register(string, vmm.Registration) (vmm.Info, error) { return vmm.Info{}, vmm.ErrInvalid }
func (noVMMs) Get(string) (vmm.Info, error)                        { return vmm.Info{}, vmm.ErrNotFound }
func (noVMMs) List() []vmm.Info                                    { return nil }
func (noVMMs) Page(string, int) ([]vmm.Info, bool)                 { return nil, false }
func (noVMMs) RequestState(context.Context, string, vmm.Request) (vmm.Info, bool, error) {
	return vmm.Info{}, false, vmm.ErrNotFound
}
func (noVMMs) Unregister(context.Context, string) (vmm.Info, error) {
	return vmm.Info{}, vmm.ErrNotFound
}
func (noVMMs) RemoveUnknown(context.Context, string) (vmm.Info, error) {
	return vmm.Info{}, vmm.ErrNotFound
}

// dropshotError checks that an answer is upstream's Error, as dropshot
// itself (not a handler) answers it: status, JSON content type, a body the
// upstream Error schema accepts, the request's id, no error_code, and a
// message containing each of contains.
func dropshotError(t *testing.T, spec *openapitest.Spec, r response, status int, contains ...string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json (body %q)", ct, r.body)
	}
	var v any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	if err := spec.Doc().Components.Schemas["Error"].Value.VisitJSON(v); err != nil {
		t.Errorf("error body %s does not match upstream's Error: %v", r.body, err)
	}
	wantError(t, r, status, contains...)
	if _, ok := v.(map[string]any)["error_code"]; ok {
		t.Errorf("error body %s has an error_code; dropshot sets none for this error", r.body)
	}
}

// A path no route serves, and a method a path does not serve, answer
// upstream's JSON Error (404, 405), not net/http's text.
func TestUnroutedRequestsAnswerDropshotErrors(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/nope", 404, ""},
		{http.MethodGet, "/", 404, ""},
		{http.MethodGet, "/inventory/extra", 404, ""},
		{http.MethodDelete, "/inventory", 405, "GET, HEAD"},
		{http.MethodPost, "/omicron-config", 405, "PUT"},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			r := s.do(c.method, c.path, nil)
			dropshotError(t, spec, r, c.status, c.path)
			if got := r.header.Get("Allow"); got != c.allow {
				t.Errorf("Allow %q, want %q", got, c.allow)
			}
		})
	}
}

// The errors of upstream operations validate against the operations in the
// upstream document: a VMM that is not there, a config the ledger refuses,
// a bad api-version.
func TestErrorsOfUpstreamOperationsMatchTheSpec(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	withVMMs := api.New(api.Deps{Configs: s.store, Reconciler: s.rec, VMMs: noVMMs{}})
	srv := httptest.NewServer(withVMMs.Handler())
	defer srv.Close()
	// Zones without a NIC: the validator cannot check NIC names (the
	// document's Name pattern uses a look-ahead, which Go's regexp lacks).
	zones := sledconfigtest.Crucibles(2)
	gen5, _ := json.Marshal(sledconfigtest.Config(5, zones...))
	if r := s.put(gen5); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	changed, _ := json.Marshal(sledconfigtest.Config(5, zones[0]))
	older, _ := json.Marshal(sledconfigtest.Config(4, zones...))
	jsonBody := http.Header{"Content-Type": {"application/json"}}
	for _, c := range []struct {
		name         string
		method, path string
		body         []byte
		header       http.Header
		status       int
	}{
		{"unknown VMM", http.MethodGet, "/vmms/6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f/state", nil, nil, 404},
		{"same generation, other content", http.MethodPut, "/omicron-config", changed, jsonBody, 400},
		{"older generation", http.MethodPut, "/omicron-config", older, jsonBody, 400},
		{"api-version on a PUT", http.MethodPut, "/omicron-config", gen5, http.Header{"Content-Type": {"application/json"}, "Api-Version": {"048.0.0"}}, 400},
		{"empty api-version", http.MethodGet, "/inventory", nil, http.Header{"Api-Version": {""}}, 400},
		{"old api-version", http.MethodGet, "/zones", nil, http.Header{"Api-Version": {"47.0.0"}}, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.header {
				req.Header[k] = v
			}
			x, err := spec.Do(t, srv.Client(), req, c.body)
			if err != nil {
				t.Error(err)
			}
			if x.Status != c.status {
				t.Errorf("status %d, want %d: %s", x.Status, c.status, x.Body)
			}
		})
	}
}

// A body that is not JSON by its content type is refused with 400, as
// dropshot refuses it, and changes nothing; a missing Content-Type is read
// as JSON, as dropshot reads it, and charset parameters do not count.
func TestNonJSONBodiesAreRefused(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	if r := s.put(sledconfig.Example()); r.status != http.StatusNoContent {
		t.Fatalf("PUT example: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	next := exampleWith(t, func(d map[string]any) { d["generation"] = 352 })
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/cbor", "application/json-seq", "not a media type/"} {
		t.Run(ct, func(t *testing.T) {
			dropshotError(t, spec, s.do(http.MethodPut, "/omicron-config", next, "Content-Type", ct), 400, "content type")
			dropshotError(t, spec, s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{}}`), "Content-Type", ct), 400, "content type")
		})
	}
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("a refused body changed the ledger:\n%s", diff)
	}
	if g := s.store.Current().Generation; g != 351 {
		t.Fatalf("generation %d, want 351", g)
	}
	if r := s.do(http.MethodPut, "/omicron-config", next, "Content-Type", "Application/JSON; charset=utf-8"); r.status != http.StatusNoContent {
		t.Fatalf("PUT with a charset: %d %s", r.status, r.body)
	}
	if r := s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{}}`)); r.status != http.StatusNoContent {
		t.Fatalf("PUT without a Content-Type: %d %s", r.status, r.body)
	}
}

// An oversized body is refused with upstream's Error (413).
func TestOversizedBodyIsADropshotError(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	body := append([]byte(`{"generation":9,"x":"`), append(bytes.Repeat([]byte("a"), api.MaxConfigBytes), '"', '}')...)
	for _, ct := range []string{"", "application/json"} {
		var r response
		if ct == "" {
			r = s.do(http.MethodPut, "/omicron-config", body)
		} else {
			r = s.do(http.MethodPut, "/omicron-config", body, "Content-Type", ct)
		}
		if r.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		var v any
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatalf("body %q: %v", r.body, err)
		}
		if err := spec.Doc().Components.Schemas["Error"].Value.VisitJSON(v); err != nil {
			t.Errorf("body %s: %v", r.body, err)
		}
	}
}

// api-version: a missing header is served (curl); anything else must be
// 48.0.0 as semver writes it. Every refusal names 48.0.0.
func TestAPIVersionHeader(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	if r := s.do(http.MethodGet, "/zones", nil); r.status != http.StatusOK {
		t.Errorf("no api-version: %d %s", r.status, r.body)
	}
	for _, v := range []string{"48.0.0", "48.0.0+build.5"} {
		if r := s.do(http.MethodGet, "/zones", nil, "api-version", v); r.status != http.StatusOK {
			t.Errorf("api-version %q: %d %s", v, r.status, r.body)
		}
	}
	for v, want := range map[string]string{
		"":             "not a semantic version",
		" 48.0.0":      "not a semantic version",
		"banana":       "not a semantic version",
		"48.0":         "not a semantic version",
		"048.0.0":      "leading zero",
		"48.00.0":      "leading zero",
		"48.0.0-":      "not a semantic version",
		"48.0.0-rc.01": "leading zero",
		"48.0.0+":      "not a semantic version",
		"1.0.0":        "older",
		"47.9.3":       "older",
		"48.0.0-rc.1":  "older",
		"48.0.1":       "newer",
		"49.0.0":       "newer",
	} {
		t.Run(v, func(t *testing.T) {
			r := s.do(http.MethodGet, "/zones", nil, "api-version", v)
			dropshotError(t, spec, r, http.StatusBadRequest, want, "48.0.0")
		})
	}
	// Two headers are no one version.
	req := httptest.NewRequest(http.MethodGet, "/zones", nil)
	req.Header.Add("api-version", "48.0.0")
	req.Header.Add("api-version", "48.0.0")
	w := httptest.NewRecorder()
	s.server.Handler().ServeHTTP(w, req)
	body, _ := io.ReadAll(w.Result().Body)
	dropshotError(t, spec, response{status: w.Code, body: body, header: w.Header()}, http.StatusBadRequest, "48.0.0")
}

// fullVMMs is a VMM manager that holds as many VMMs as the sled takes.
type fullVMMs struct{ noVMMs }

func (fullVMMs) Register(string, vmm.Registration) (vmm.Info, error) {
	return vmm.Info{}, fmt.Errorf("%w: it holds 512 VMMs, the most it takes; unregister one first", vmm.ErrCapacity)
}

// A VMM beyond what the sled takes is refused as upstream refuses what it
// has no capacity for: 507, InsufficientCapacity, saying why.
func TestVMMBeyondCapacityIs507(t *testing.T) {
	s := newSled(t, sim.Options{})
	full := api.New(api.Deps{Configs: s.store, Reconciler: s.rec, VMMs: fullVMMs{}})
	req := httptest.NewRequest(http.MethodPut, "/vmms/6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01",
		strings.NewReader(string(vmmtest.Body("0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", "[fd00:1122:3344:101::1:5]:12400", nil, nil))))
	w := httptest.NewRecorder()
	full.Handler().ServeHTTP(w, req)
	r := response{status: w.Code, body: w.Body.Bytes(), header: w.Header()}
	wantError(t, r, http.StatusInsufficientStorage, "512 VMMs")
	if !strings.Contains(string(r.body), `"error_code":"InsufficientCapacity"`) {
		t.Errorf("error body %s", r.body)
	}
}
