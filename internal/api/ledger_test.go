package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
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
	copies := s.agentInventory()["ledger"].(map[string]any)["copies"].([]any)
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

// A config no runtime could realise gets a 400 naming the zone and the
// field, and the ledger stays as it was.
func TestUnrealisableConfigIsRefused(t *testing.T) {
	s := newSled(t, sim.Options{})
	good, _ := json.Marshal(sledconfigtest.Config(1, sledconfigtest.Crucible(0), sledconfigtest.InternalDNS(0)))
	if r := s.put(good); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	crucible, dns := sledconfigtest.ZoneID(0), sledconfigtest.ZoneID(100)
	for _, c := range []struct {
		name   string
		change func(crucible, dns *sledconfig.Zone)
		zone   string
		field  string
	}{
		{"loopback", func(c, _ *sledconfig.Zone) { c.ZoneType.Address = "[::1]:32345" }, crucible, "zone_type.address"},
		{"port 0", func(c, _ *sledconfig.Zone) { c.ZoneType.Address = "[fd00:1122:3344:101::10]:0" }, crucible, "zone_type.address"},
		{"gz_address of another zone", func(_, d *sledconfig.Zone) { d.ZoneType.GZAddress = "fd00:1122:3344:101::10" }, dns, "zone_type.gz_address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			z, d := sledconfigtest.Crucible(0), sledconfigtest.InternalDNS(0)
			c.change(&z, &d)
			doc, _ := json.Marshal(sledconfigtest.Config(2, z, d))
			wantError(t, s.put(doc), http.StatusBadRequest, `zones["`+c.zone+`"].`+c.field+": ")
		})
	}
	t.Run("generation", func(t *testing.T) {
		doc, _ := json.Marshal(sledconfigtest.Config(1<<63, sledconfigtest.Crucible(0)))
		wantError(t, s.put(doc), http.StatusBadRequest, "generation: 9223372036854775808 is larger than the largest generation")
	})
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("a refused config changed the ledger:\n%s", diff)
	}
	if g := s.store.Current().Generation; g != 1 {
		t.Fatalf("current generation %d, want 1", g)
	}
	for _, cp := range s.agentInventory()["ledger"].(map[string]any)["copies"].([]any) {
		if cp := cp.(map[string]any); cp["generation"] != 1.0 {
			t.Errorf("ledger copy %v, want generation 1", cp)
		}
	}
}
