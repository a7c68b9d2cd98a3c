package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

const sledID = "1c3c0b4f-6c8a-4d4e-9a7e-2f1b5a9d0e11"

// sled is the API over a real ledger, config store and reconciler with the
// sim runtime. Requests go straight to the handler, so tests can run inside a
// synctest bubble.
type sled struct {
	t      testing.TB
	dirs   []string
	store  *configstore.Store
	rec    *reconciler.Reconciler
	rt     *sim.Runtime
	server *api.Server
}

func newSled(t testing.TB, simOpts sim.Options, with ...func(*api.Deps)) *sled {
	t.Helper()
	return newSledWith(t, simOpts, reconciler.Options{}, with...)
}

// newSledWith is newSled with a reconciler set up by recOpts (its start
// deadline always an hour).
func newSledWith(t testing.TB, simOpts sim.Options, recOpts reconciler.Options, with ...func(*api.Deps)) *sled {
	t.Helper()
	base := t.TempDir()
	s := &sled{t: t, dirs: []string{filepath.Join(base, "a"), filepath.Join(base, "b")}}
	l, err := ledger.Open(s.dirs, "omicron-sled-config.json", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.rt = sim.New(simOpts)
	recOpts.StartTimeout = time.Hour
	s.rec = reconciler.New(s.rt, nil, recOpts)
	s.rt.SetNotify(s.rec.Poke)
	s.store = configstore.Open(l, nil, s.rec.Update, configstore.Options{})
	deps := api.Deps{
		Identity:   api.Identity{SledID: sledID, Address: "[::1]:12345", Role: "gimlet"},
		Configs:    s.store,
		Reconciler: s.rec,
		Faults:     s.rt,
	}
	for _, f := range with {
		f(&deps)
	}
	s.server = api.New(deps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.rec.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

type response struct {
	status int
	body   []byte
	header http.Header
}

func (s *sled) do(method, path string, body []byte, header ...string) response {
	s.t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	s.server.Handler().ServeHTTP(w, req)
	return response{status: w.Code, body: w.Body.Bytes(), header: w.Header()}
}

func (s *sled) put(doc []byte) response { return s.do(http.MethodPut, "/omicron-config", doc) }

func (s *sled) inventory() map[string]any { return s.getObject("/inventory") }

// agentInventory is our own view, GET /agent/inventory.
func (s *sled) agentInventory() map[string]any { return s.getObject("/agent/inventory") }

func (s *sled) getObject(path string) map[string]any {
	s.t.Helper()
	r := s.do(http.MethodGet, path, nil)
	if r.status != http.StatusOK {
		s.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var inv map[string]any
	if err := json.Unmarshal(r.body, &inv); err != nil {
		s.t.Fatal(err)
	}
	return inv
}

// ledgerFiles snapshots every file in the ledger dirs.
func (s *sled) ledgerFiles() map[string]string {
	s.t.Helper()
	out := map[string]string{}
	for _, d := range s.dirs {
		filepath.WalkDir(d, func(path string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				b, _ := os.ReadFile(path)
				out[path] = string(b)
			}
			return nil
		})
	}
	return out
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

func wantError(t *testing.T, r response, status int, contains ...string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	var e struct {
		RequestID string `json:"request_id"`
		Message   string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %s: %v", r.body, err)
	}
	if e.RequestID == "" || e.RequestID != r.header.Get("x-request-id") {
		t.Errorf("request_id %q, header %q", e.RequestID, r.header.Get("x-request-id"))
	}
	for _, c := range contains {
		if !strings.Contains(e.Message, c) {
			t.Errorf("message %q does not contain %q", e.Message, c)
		}
	}
}

func TestExampleConfigAcceptedUnchangedAndReported(t *testing.T) {
	s := newSled(t, sim.Options{})
	doc := sledconfig.Example()
	if r := s.put(doc); r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("PUT example: %d %s", r.status, r.body)
	}
	inv := s.inventory()
	if diff := cmp.Diff(decode(t, doc), inv["ledgered_sled_config"]); diff != "" {
		t.Fatalf("ledgered_sled_config differs from what was put (-put +inventory):\n%s", diff)
	}
	if inv["sled_id"] != sledID || inv["sled_role"] != "gimlet" || inv["sled_agent_address"] != "[::1]:12345" {
		t.Errorf("identity fields: %v %v %v", inv["sled_id"], inv["sled_role"], inv["sled_agent_address"])
	}
	// Converged: idle, every zone ok, and the last reconciled config is the one put.
	deadline := time.Now().Add(20 * time.Second)
	for s.rec.Status().Phase != reconciler.PhaseIdle {
		if time.Now().After(deadline) {
			t.Fatal("reconciler never went idle")
		}
		time.Sleep(5 * time.Millisecond)
	}
	inv = s.inventory()
	if st := inv["reconciler_status"].(map[string]any); st["status"] != "idle" || st["ran_for"] == nil || st["completed_at"] == nil {
		t.Errorf("reconciler_status %v", st)
	}
	last := inv["last_reconciliation"].(map[string]any)
	if diff := cmp.Diff(decode(t, doc), last["last_reconciled_config"]); diff != "" {
		t.Errorf("last_reconciled_config differs:\n%s", diff)
	}
	zones := last["zones"].(map[string]any)
	if len(zones) != 13 {
		t.Fatalf("%d zone results, want 13", len(zones))
	}
	for id, res := range zones {
		if diff := cmp.Diff(map[string]any{"result": "ok"}, res); diff != "" {
			t.Errorf("zone %s: %s", id, diff)
		}
	}
	var names []string
	r := s.do(http.MethodGet, "/zones", nil)
	if err := json.Unmarshal(r.body, &names); err != nil || len(names) != 13 || !slices.IsSorted(names) {
		t.Fatalf("GET /zones: %s (%v)", r.body, err)
	}
	if !slices.Contains(names, "oxz_ntp_a700528f-f600-4908-94ac-9c06442ef6b4") || !slices.Contains(names, "oxz_nexus_470fbf4d-0178-45ee-a422-136fa5f4a158") {
		t.Errorf("zone names %v", names)
	}
}

func TestGenerationRules(t *testing.T) {
	s := newSled(t, sim.Options{})
	z := sledconfigtest.Crucibles(2)
	gen5, _ := json.Marshal(sledconfigtest.Config(5, z...))
	if r := s.put(gen5); r.status != http.StatusNoContent {
		t.Fatalf("PUT gen 5: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	// Same generation, same content (other key order, white space): no-op 204.
	var v any
	json.Unmarshal(gen5, &v)
	same, _ := json.MarshalIndent(v, "", "   ")
	if r := s.put(same); r.status != http.StatusNoContent {
		t.Fatalf("PUT same gen same content: %d %s", r.status, r.body)
	}
	other, _ := json.Marshal(sledconfigtest.Config(5, z[0]))
	wantError(t, s.put(other), http.StatusBadRequest, "generation 5", "different content")
	older, _ := json.Marshal(sledconfigtest.Config(4, z...))
	wantError(t, s.put(older), http.StatusBadRequest, "generation 4", "older", "5")
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("a rejected or no-op PUT changed the ledger:\n%s", diff)
	}
	if g := s.store.Current().Generation; g != 5 {
		t.Fatalf("current generation %d", g)
	}
	newer, _ := json.Marshal(sledconfigtest.Config(6, z[0]))
	if r := s.put(newer); r.status != http.StatusNoContent {
		t.Fatalf("PUT gen 6: %d %s", r.status, r.body)
	}
	if g := s.store.Current().Generation; g != 6 {
		t.Fatalf("current generation %d after gen 6", g)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	s := newSled(t, sim.Options{})
	good, _ := json.Marshal(sledconfigtest.Config(1, sledconfigtest.Crucible(0)))
	if r := s.put(good); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	example := sledconfig.Example()
	badMAC := bytes.Replace(example, []byte(`"A8:40:25:FF:80:05"`), []byte(`"A8:40:25:FF:80"`), 1)
	badMAC = bytes.Replace(badMAC, []byte(`"generation": 351`), []byte(`"generation": 400`), 1)
	dupAddr := bytes.Replace(example, []byte(`[fd00:1122:3344:103::45]:123`), []byte(`[fd00:1122:3344:103::47]:123`), 1)
	cases := []struct {
		name     string
		body     []byte
		status   int
		contains []string
	}{
		{"not json", []byte("{"), 400, []string{"invalid sled config"}},
		{"array", []byte("[]"), 400, []string{"JSON object"}},
		{"empty", nil, 400, nil},
		{"wrong type", []byte(`{"generation":"x","disks":{},"datasets":{},"zones":{},"measurements":[]}`), 400, []string{"generation"}},
		{"bad mac", badMAC, 400, []string{"470fbf4d-0178-45ee-a422-136fa5f4a158", "mac"}},
		{"shared address", dupAddr, 400, []string{"a700528f-f600-4908-94ac-9c06442ef6b4", "470fbf4d-0178-45ee-a422-136fa5f4a158"}},
		{"too large", append([]byte(`{"generation":9,"x":"`), append(bytes.Repeat([]byte("a"), api.MaxConfigBytes), '"', '}')...), 413, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, s.put(c.body), c.status, c.contains...)
		})
	}
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("bad input changed the ledger:\n%s", diff)
	}
	if g := s.store.Current().Generation; g != 1 {
		t.Fatalf("bad input changed the current config: generation %d", g)
	}
}

func TestHangingZoneDelaysNeitherPutsNorReads(t *testing.T) {
	// Inside a bubble, a request that waited on the hanging start would
	// leave every goroutine blocked, and synctest would fail the test.
	synctest.Test(t, func(t *testing.T) {
		s := newSled(t, sim.Options{StartDelay: func(zone.Spec) time.Duration { return time.Second }})
		zones := sledconfigtest.Crucibles(5)
		if r := s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{"`+zones[0].ID+`":{"start":"hang"}}}`)); r.status != http.StatusNoContent {
			t.Fatalf("faults: %d %s", r.status, r.body)
		}
		for gen := uint64(1); gen <= 5; gen++ {
			doc, _ := json.Marshal(sledconfigtest.Config(gen, zones[:gen]...))
			if r := s.put(doc); r.status != http.StatusNoContent {
				t.Fatalf("PUT gen %d: %d %s", gen, r.status, r.body)
			}
			s.inventory()
			time.Sleep(2 * time.Second)
		}
		synctest.Wait()
		inv := s.inventory()
		if st := inv["reconciler_status"].(map[string]any); st["status"] != "running" {
			t.Fatalf("reconciler_status %v while a start hangs", st)
		}
		states := map[string]string{}
		for _, z := range s.agentInventory()["zone_states"].([]any) {
			z := z.(map[string]any)
			states[z["id"].(string)] = z["state"].(string)
		}
		for i, z := range zones {
			want := "running"
			if i == 0 {
				want = "starting"
			}
			if states[z.ID] != want {
				t.Errorf("zone %d: %q, want %q", i, states[z.ID], want)
			}
		}
	})
}

func TestZoneStatusEndpoints(t *testing.T) {
	s := newSled(t, sim.Options{})
	z := sledconfigtest.Crucible(3)
	s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{"`+z.ID+`":{"start":"fail"}}}`))
	doc, _ := json.Marshal(sledconfigtest.Config(1, z))
	s.put(doc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		zs, _ := s.rec.Zone(z.ID)
		if zs.State == reconciler.StateFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone never failed: %+v", zs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, key := range []string{z.ID, z.Name()} {
		r := s.do(http.MethodGet, "/agent/zones/"+key, nil)
		var d api.ZoneDetail
		if err := json.Unmarshal(r.body, &d); err != nil || r.status != 200 {
			t.Fatalf("GET zone %s: %d %s", key, r.status, r.body)
		}
		if d.Name != z.Name() || d.State != "failed" || d.NextRetry == nil || !strings.Contains(d.LastError, "injected") || len(d.History) < 2 {
			t.Errorf("zone detail %+v", d)
		}
	}
	wantError(t, s.do(http.MethodGet, "/agent/zones/nope", nil), 404, "nope")
	inv := s.inventory()
	res := inv["last_reconciliation"].(map[string]any)["zones"].(map[string]any)[z.ID].(map[string]any)
	if res["result"] != "err" || !strings.Contains(res["message"].(string), "injected") {
		t.Errorf("last reconciliation result %v", res)
	}
}

func TestSimFaultsEndpoint(t *testing.T) {
	s := newSled(t, sim.Options{})
	id := sledconfigtest.ZoneID(1)
	if r := s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{"`+id+`":{"start":"250ms","vanish_after":"1m"}}}`)); r.status != 204 {
		t.Fatalf("valid fault map: %d %s", r.status, r.body)
	}
	wantError(t, s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{"`+id+`":{"start":"sometimes"}}}`)), 400, id, "start")
	wantError(t, s.do(http.MethodPut, "/debug/sim/faults", []byte(`{"zones":{"not-a-uuid":{}}}`)), 400, "not-a-uuid")

	// Without the sim runtime there is no such endpoint.
	noSim := api.New(api.Deps{Configs: s.store, Reconciler: s.rec})
	w := httptest.NewRecorder()
	noSim.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/debug/sim/faults", strings.NewReader(`{"zones":{}}`)))
	if w.Code != http.StatusNotFound && w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("faults endpoint without sim: %d", w.Code)
	}
}

func TestMetrics(t *testing.T) {
	s := newSled(t, sim.Options{})
	s.do(http.MethodGet, "/zones", nil)
	r := s.do(http.MethodGet, "/metrics", nil)
	for _, m := range []string{`sled_agent_http_requests_total{code="200",route="GET /zones"} 1`} {
		if !strings.Contains(string(r.body), m) {
			t.Errorf("metrics lack %q:\n%s", m, r.body)
		}
	}
}
