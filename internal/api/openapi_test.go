package api_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/api"
)

var update = flag.Bool("update", false, "rewrite the committed OpenAPI document from the code")

const openAPIPath = "../../openapi/sled-agent.json"

// TestOpenAPIDocumentIsCommitted fails when the API in the code and the
// committed OpenAPI document differ. After a deliberate API change run
//
//	go test ./internal/api -run OpenAPI -update
//
// and commit openapi/sled-agent.json with the change.
func TestOpenAPIDocumentIsCommitted(t *testing.T) {
	doc, err := json.MarshalIndent(api.Document(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	doc = append(doc, '\n')
	if *update {
		if err := os.WriteFile(openAPIPath, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	committed, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatalf("reading the committed document: %v (run with -update to create it)", err)
	}
	if !bytes.Equal(committed, doc) {
		t.Fatalf("the API differs from %s; if the change is deliberate, run `go test ./internal/api -run OpenAPI -update` and commit the document:\n%s",
			openAPIPath, cmp.Diff(string(committed), string(doc)))
	}
	// The document says what it serves.
	var v struct {
		Info  struct{ Version string }
		Paths map[string]any
	}
	if err := json.Unmarshal(committed, &v); err != nil {
		t.Fatal(err)
	}
	if v.Info.Version != api.Version {
		t.Errorf("document version %q, want %q", v.Info.Version, api.Version)
	}
	for _, p := range []string{"/omicron-config", "/inventory", "/zones", "/agent/zones/{zone}", "/debug/sim/faults",
		"/vmms/{propolis_id}", "/vmms/{propolis_id}/state", "/agent/vmms", "/metrics"} {
		if _, ok := v.Paths[p]; !ok {
			t.Errorf("document lacks %s", p)
		}
	}
}
