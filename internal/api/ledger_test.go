package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// A PUT with one ledger directory unwritable (a regular file in its place:
// root writes through any permission) answers 204, and inventory says which
// copy is degraded and why.
func TestPutWithOneLedgerCopyUnwritable(t *testing.T) {
	s := newSled(t, sim.Options{})
	if err := os.RemoveAll(s.dirs[1]); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.dirs[1], []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(sledconfigtest.Config(3, sledconfigtest.Crucible(0)))
	if r := s.put(doc); r.status != http.StatusNoContent {
		t.Fatalf("PUT with one copy writable: %d %s", r.status, r.body)
	}
	copies := s.inventory()["ledger"].(map[string]any)["copies"].([]any)
	if len(copies) != 2 {
		t.Fatalf("copies %v", copies)
	}
	good, bad := copies[0].(map[string]any), copies[1].(map[string]any)
	if good["state"] != "ok" || good["generation"] != 3.0 {
		t.Errorf("written copy %v", good)
	}
	if bad["state"] != "write_failed" || bad["error"] == nil || bad["error"] == "" {
		t.Errorf("degraded copy %v, want write_failed with an error", bad)
	}
}
