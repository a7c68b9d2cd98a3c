package sledconfig

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"slices"
	"strings"
	"testing"
)

// FuzzParse checks that Parse and Validate never panic and that the
// canonical form is a fixed point: parsing what a config marshals to gives
// the same canonical bytes.
func FuzzParse(f *testing.F) {
	// The fuzzer minimizes every new interesting input, one execution per
	// attempt; on the 30 KB example that takes minutes and stalls a short
	// fuzzing run. So fuzzing starts from small configs, one per zone type
	// (the example's own zones where it has the type), and the full-size
	// documents are seeds only when the seeds run as tests.
	seeds := smallDocs(f)
	if !fuzzing() {
		seeds = append(seeds, exampleBytes(f), encode(f, fullDoc(f)), reversed(exampleDoc(f)))
	}
	for _, doc := range seeds {
		f.Add(doc)
		f.Add(doc[:len(doc)/2])
		for _, m := range []struct{ old, new string }{
			{`"nexus"`, `"nexus_v2"`},
			{`"mac"`, `"MAC"`},
			{`"generation"`, `"generation": 1, "generation"`},
			{`"vni":`, `"vni": "100", "x":`},
			{`"172.30.2.9"`, `"fd00::9"`},
			{`"crucible"`, `"nexus"`},
			{crucibleID, strings.ToUpper(crucibleID)},
		} {
			f.Add(bytes.ReplaceAll(doc, []byte(m.old), []byte(m.new)))
		}
	}
	f.Add([]byte(`{"zones": {"z": {"zone_type": {"type": "internal_dns", "dns_address": "[::ffff:1.2.3.4]:1"}}}}`))
	f.Add([]byte(`{"x": 1.50e+3, "y": "\u2028<\ud800>", "z": [[], {}, null, true]}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`[]`))

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			return
		}
		_ = Validate(cfg)
		for _, z := range cfg.Zones {
			_ = z.Name()
			_ = z.UnderlayAddrs()
			_, _ = z.ServiceAddr()
			if len(z.Hash()) != 64 {
				t.Fatalf("zone %q: hash %q", z.ID, z.Hash())
			}
		}
		out, err := cfg.MarshalJSON()
		if err != nil {
			t.Fatalf("MarshalJSON: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(MarshalJSON(cfg)): %v\n%s", err, out)
		}
		if !bytes.Equal(cfg.Canonical(), again.Canonical()) {
			t.Fatalf("canonical form is not a fixed point:\n%s\n%s", cfg.Canonical(), again.Canonical())
		}
		for id, z := range cfg.Zones {
			z2 := again.Zones[id]
			if z.Hash() != z2.Hash() {
				t.Fatalf("zone %q: hash changed on re-parse", id)
			}
		}
		// A typed copy built in code (no remembered document) marshals to a
		// document that parses too.
		typed := *cfg
		typed.canonical = nil
		if _, err := Parse(typed.Canonical()); err != nil {
			t.Fatalf("Parse of the typed fields' canonical form: %v\n%s", err, typed.Canonical())
		}
	})
}

// fuzzing reports whether the test binary is fuzzing (not running the seeds).
func fuzzing() bool {
	fl := flag.Lookup("test.fuzz")
	return fl != nil && fl.Value.String() != ""
}

// smallDocs are configs of one zone each, one for each zone type. The nexus
// one keeps a disk and a dataset of the example.
func smallDocs(t testing.TB) [][]byte {
	full := fullDoc(t)
	var docs [][]byte
	for _, id := range slices.Sorted(maps.Keys(full["zones"].(map[string]any))) {
		typ := zoneTypeOf(full, id)["type"]
		if typ == "crucible" && id != crucibleID {
			continue
		}
		doc := map[string]any{
			"generation":   json.Number("2"),
			"disks":        map[string]any{},
			"datasets":     map[string]any{},
			"measurements": []any{},
			"zones":        map[string]any{id: zoneOf(full, id)},
		}
		if typ == "nexus" {
			doc["disks"] = map[string]any{exampleDiskID: full["disks"].(map[string]any)[exampleDiskID]}
			doc["datasets"] = map[string]any{exampleDsetID: full["datasets"].(map[string]any)[exampleDsetID]}
			doc["remove_mupdate_override"] = nil
		}
		docs = append(docs, encode(t, doc))
	}
	return docs
}
