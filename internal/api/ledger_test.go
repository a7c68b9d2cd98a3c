package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/openapitest"
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

// A config of the ledgered generation that means the same (members left
// out that upstream reads as null or as their default, measurements in
// another order, other letter case) is a no-op 204: the ledger keeps its
// bytes. One that means something else is a 400, and changes nothing either.
func TestSameGenerationSameMeaning(t *testing.T) {
	s := newSled(t, sim.Options{})
	const nexus = "470fbf4d-0178-45ee-a422-136fa5f4a158"
	ledgered := func(d map[string]any) {
		d["measurements"] = []any{map[string]any{"hash": hashA}, map[string]any{"hash": hashB}}
	}
	if r := s.put(exampleWith(t, ledgered)); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	current := s.store.Current()
	nexusType := func(d map[string]any) map[string]any {
		return d["zones"].(map[string]any)[nexus].(map[string]any)["zone_type"].(map[string]any)
	}
	for _, c := range []struct {
		name string
		edit func(d map[string]any)
		same bool
	}{
		{"nulls left out", stripNulls, true},
		{"lockstep_port left out", func(d map[string]any) { delete(nexusType(d), "lockstep_port") }, true},
		{"measurements reordered", func(d map[string]any) {
			d["measurements"] = []any{map[string]any{"hash": hashB}, map[string]any{"hash": strings.ToUpper(hashA)}}
		}, true},
		{"MAC in lower case", func(d map[string]any) { nexusType(d)["nic"].(map[string]any)["mac"] = "a8:40:25:ff:80:05" }, true},
		{"another lockstep_port", func(d map[string]any) { nexusType(d)["lockstep_port"] = 12233 }, false},
		{"host_phase_2 left out", func(d map[string]any) { delete(d, "host_phase_2") }, false},
		{"a measurement fewer", func(d map[string]any) { d["measurements"] = []any{map[string]any{"hash": hashA}} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := exampleWith(t, func(d map[string]any) { ledgered(d); c.edit(d) })
			r := s.put(doc)
			if c.same {
				if r.status != http.StatusNoContent {
					t.Fatalf("PUT: %d %s, want 204", r.status, r.body)
				}
			} else {
				wantError(t, r, http.StatusBadRequest, "generation 351", "different content")
			}
		})
	}
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("a same-generation PUT rewrote the ledger:\n%s", diff)
	}
	if s.store.Current() != current {
		t.Fatal("a same-generation PUT replaced the current config")
	}
}

// The example config re-sent with every null member left out, as a
// generated client sends it, is the config ledgered.
func TestExampleWithoutNullsIsTheLedgeredConfig(t *testing.T) {
	s := newSled(t, sim.Options{})
	raw, err := os.ReadFile(openapitest.UpstreamPath(t, "example-sled-config-v14.json"))
	if err != nil {
		t.Fatal(err)
	}
	if r := s.put(raw); r.status != http.StatusNoContent {
		t.Fatalf("PUT example: %d %s", r.status, r.body)
	}
	before := s.ledgerFiles()
	stripped := exampleWith(t, stripNulls)
	if bytes.Contains(stripped, []byte("null")) {
		t.Fatal("nulls left in")
	}
	if r := s.put(stripped); r.status != http.StatusNoContent {
		t.Fatalf("PUT example without nulls: %d %s", r.status, r.body)
	}
	if diff := cmp.Diff(before, s.ledgerFiles()); diff != "" {
		t.Fatalf("the ledger was rewritten:\n%s", diff)
	}
}

const (
	hashA = "8234c10964ef7f62880772caaf96f449234bad8428b2a6a09e623d383550bfdf"
	hashB = "1ae3b88364f311ce588ac802cb8177c4806b76da0ce42e39aab0b0d8bb04c197"
)

// exampleWith is the example config with an edit.
func exampleWith(t *testing.T, edit func(map[string]any)) []byte {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(sledconfig.Example(), &d); err != nil {
		t.Fatal(err)
	}
	edit(d)
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stripNulls removes every member whose value is null, at every depth.
func stripNulls(v map[string]any) {
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if x == nil {
					delete(v, k)
				} else {
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
}
