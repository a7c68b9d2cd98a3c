package propolisapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// A VMM service an earlier agent started serves 5.0.0 alone, and refuses
// 6.0.0 with a 400, as dropshot refuses a version newer than its own. The
// agent, upgraded, adopts its VMM: its client speaks 5.0.0 to it from then
// on rather than take the refusals for a lost service (and fail a guest
// that runs).
func TestClientSpeaksVersion5ToAnOlderService(t *testing.T) {
	var mu sync.Mutex
	var versions []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("api-version")
		mu.Lock()
		versions = append(versions, v)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if v != propolisapi.Version5 {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"request_id": "x", "message": "server serves API version 5.0.0 only, not " + v})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"instance": map[string]any{
			"properties": map[string]any{"id": "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01", "name": "vm0", "description": "",
				"metadata": map[string]any{"project_id": "11111111-2222-3333-4444-555555555555", "silo_id": "66666666-7777-8888-9999-000000000000",
					"sled_id": "7b1e3c5a-0000-4000-8000-000000000001", "sled_serial": "s", "sled_model": "m", "sled_revision": 0}},
			"state": "Running"}})
	}))
	defer srv.Close()
	c := propolisapi.NewClient(strings.TrimPrefix(srv.URL, "http://"))
	for range 2 {
		inst, err := c.Get(context.Background())
		if err != nil || inst.State != propolisapi.StateRunning {
			t.Fatalf("GET /instance of an older service: %+v, %v", inst, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{propolisapi.APIVersion, propolisapi.Version5, propolisapi.Version5}; strings.Join(versions, ",") != strings.Join(want, ",") {
		t.Errorf("versions asked: %v, want %v (6.0.0 once, then 5.0.0)", versions, want)
	}
}
