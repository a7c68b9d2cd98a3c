package sledconfig

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseExample(t *testing.T) {
	orig := exampleBytes(t)
	cfg, err := Parse(orig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Generation != 351 || len(cfg.Zones) != 13 || len(cfg.Disks) != 10 {
		t.Errorf("generation %d, %d zones, %d disks; want 351, 13, 10", cfg.Generation, len(cfg.Zones), len(cfg.Disks))
	}
	nexus := cfg.Zones[nexusID]
	if got, want := nexus.ZoneType.NIC.MAC, "A8:40:25:FF:80:05"; got != want {
		t.Errorf("nexus NIC MAC %q, want %q", got, want)
	}
	if got := nexus.ZoneType.NIC.IPConfig.Value.Subnet; got != "172.30.2.0/24" {
		t.Errorf("nexus NIC subnet %q", got)
	}
	if nexus.ZoneType.LockstepPort == nil || *nexus.ZoneType.LockstepPort != 12232 {
		t.Errorf("nexus lockstep_port %v, want 12232", nexus.ZoneType.LockstepPort)
	}
}

// TestRoundTrip checks that a parsed config marshals back to the same
// document, unknown fields included, and that its canonical form is stable.
func TestRoundTrip(t *testing.T) {
	withUnknown := exampleDoc(t)
	withUnknown["future_top_level"] = map[string]any{"x": []any{json.Number("1"), "two", nil}}
	zoneOf(withUnknown, crucibleID)["future_zone_field"] = "kept"
	zoneTypeOf(withUnknown, nexusID)["future_variant_field"] = json.Number("1.50")
	nicOf(withUnknown, nexusID)["future_nic_field"] = true

	for _, tc := range []struct {
		name string
		doc  []byte
	}{
		{"example", exampleBytes(t)},
		{"unknown fields", encode(t, withUnknown)},
		{"reversed keys", reversed(withUnknown)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(tc.doc)
			if err != nil {
				t.Fatal(err)
			}
			out, err := json.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(decodeAny(t, tc.doc), decodeAny(t, out)); diff != "" {
				t.Errorf("marshalled config differs from the original (-orig +out):\n%s", diff)
			}
			again, err := Parse(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(cfg.Canonical(), again.Canonical()) {
				t.Errorf("canonical form changed on re-parse:\n%s\n%s", cfg.Canonical(), again.Canonical())
			}
			if !cfg.SameContent(again) {
				t.Error("SameContent is false after a round trip")
			}
			if err := Validate(cfg); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestCanonicalIgnoresSpelling(t *testing.T) {
	doc := exampleDoc(t)
	a, err := Parse(exampleBytes(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(reversed(doc))
	if err != nil {
		t.Fatal(err)
	}
	if !a.SameContent(b) {
		t.Error("the same document with other key order and white space is not SameContent")
	}
	zoneOf(doc, crucibleID)["filesystem_pool"] = nil
	c, err := Parse(encode(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	if a.SameContent(c) {
		t.Error("a changed document is SameContent")
	}
}

func TestCanonicalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{ "b": 1, "a": [ 2, {"d": null, "c": true} ] }`, `{"a":[2,{"c":true,"d":null}],"b":1}`},
		{`{"n": 1.50, "m": 1e3, "big": 123456789012345678901234567890}`, `{"big":123456789012345678901234567890,"m":1e3,"n":1.50}`},
		{`{"html": "<a&b>", "u": "\u00e9\u2028"}`, `{"html":"<a&b>","u":"é\u2028"}`},
	} {
		got, err := Canonicalize([]byte(tc.in))
		if err != nil {
			t.Errorf("Canonicalize(%s): %v", tc.in, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("Canonicalize(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCodeBuiltConfig checks configs built in code (not parsed): their
// canonical form is canonical, so it matches the parsed form of itself.
func TestCodeBuiltConfig(t *testing.T) {
	pool := examplePool
	cfg := &Config{
		Generation:   2,
		Disks:        map[string]json.RawMessage{},
		Datasets:     map[string]json.RawMessage{},
		Measurements: []json.RawMessage{},
		Zones: map[string]Zone{crucibleID: {
			ID:             crucibleID,
			FilesystemPool: &pool,
			ZoneType: ZoneType{
				Type:    "crucible",
				Address: "[fd00:1122:3344:103::5]:32345",
				Dataset: &Dataset{PoolName: pool},
			},
		}},
	}
	if err := Validate(cfg); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	parsed, err := Parse(cfg.Canonical())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(parsed.Canonical(), cfg.Canonical()) {
		t.Errorf("canonical form of a code-built config is not canonical:\n%s\n%s", cfg.Canonical(), parsed.Canonical())
	}
	if !parsed.SameContent(cfg) {
		t.Error("parsed copy of a code-built config is not SameContent")
	}
}

func TestZoneHash(t *testing.T) {
	base, err := Parse(exampleBytes(t))
	if err != nil {
		t.Fatal(err)
	}
	respelled, err := Parse(reversed(exampleDoc(t)))
	if err != nil {
		t.Fatal(err)
	}
	for id, z := range base.Zones {
		other := respelled.Zones[id]
		if z.Hash() != other.Hash() {
			t.Errorf("zone %s: hash differs for the same zone in other key order and white space", id)
		}
		if len(z.Hash()) != 64 {
			t.Errorf("zone %s: hash %q is not a SHA-256", id, z.Hash())
		}
	}
	baseHash := base.Zones[crucibleID].Hash()
	if baseHash == base.Zones[crucible2ID].Hash() {
		t.Error("two different crucible zones have the same hash")
	}

	seen := map[string]string{baseHash: "original"}
	for _, tc := range []struct {
		name   string
		change func(z, zt map[string]any)
	}{
		{"address port", func(z, zt map[string]any) { zt["address"] = "[fd00:1122:3344:103::5]:32346" }},
		{"address ip", func(z, zt map[string]any) { zt["address"] = "[fd00:1122:3344:103::55]:32345" }},
		{"dataset pool", func(z, zt map[string]any) { zt["dataset"] = map[string]any{"pool_name": examplePool} }},
		{"filesystem_pool null", func(z, zt map[string]any) { z["filesystem_pool"] = nil }},
		{"filesystem_pool absent", func(z, zt map[string]any) { delete(z, "filesystem_pool") }},
		{"image hash", func(z, zt map[string]any) {
			z["image_source"] = map[string]any{"type": "artifact", "hash": strings.Repeat("0", 64)}
		}},
		{"image install_dataset", func(z, zt map[string]any) { z["image_source"] = map[string]any{"type": "install_dataset"} }},
		{"type", func(z, zt map[string]any) { zt["type"] = "crucible_pantry" }},
	} {
		doc := exampleDoc(t)
		tc.change(zoneOf(doc, crucibleID), zoneTypeOf(doc, crucibleID))
		cfg, err := Parse(encode(t, doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		h := cfg.Zones[crucibleID].Hash()
		if prev, ok := seen[h]; ok {
			t.Errorf("%s: same hash as %s", tc.name, prev)
		}
		seen[h] = tc.name
		if cfg.Zones[crucible2ID].Hash() != base.Zones[crucible2ID].Hash() {
			t.Errorf("%s: changing one zone changed another zone's hash", tc.name)
		}
	}
}

// A member this agent does not know changes nothing it realises a zone
// from: upstream ignores it, and so the zone's hash does not count it
// (the ledger keeps it all the same). A zone without one keeps the hash of
// its canonical form, which running zones are marked with.
func TestZoneHashIgnoresUnknownMembers(t *testing.T) {
	// The example leaves image_source out; here the crucible has one, to
	// carry an unknown member too.
	withImage := func() map[string]any {
		doc := exampleDoc(t)
		zoneOf(doc, crucibleID)["image_source"] = map[string]any{"type": "install_dataset"}
		return doc
	}
	base, err := Parse(encode(t, withImage()))
	if err != nil {
		t.Fatal(err)
	}
	for id, z := range base.Zones {
		c, err := Canonicalize(encode(t, zoneOf(withImage(), id)))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(c); z.Hash() != hex.EncodeToString(sum[:]) {
			t.Errorf("zone %s: hash %.12s is not that of its canonical form", id, z.Hash())
		}
	}
	for _, tc := range []struct {
		name   string
		id     string
		change func(z, zt map[string]any)
	}{
		{"in the zone", crucibleID, func(z, zt map[string]any) { z["future"] = json.Number("1") }},
		{"in zone_type", crucibleID, func(z, zt map[string]any) { zt["future"] = map[string]any{"a": []any{"b"}} }},
		{"in image_source", crucibleID, func(z, zt map[string]any) { z["image_source"].(map[string]any)["future"] = true }},
		{"in dataset", crucibleID, func(z, zt map[string]any) { zt["dataset"].(map[string]any)["future"] = "x" }},
		{"in nic and its ip_config", nexusID, func(z, zt map[string]any) {
			nic := zt["nic"].(map[string]any)
			nic["future"] = nil
			nic["ip_config"].(map[string]any)["value"].(map[string]any)["future"] = json.Number("2")
		}},
	} {
		doc := withImage()
		tc.change(zoneOf(doc, tc.id), zoneTypeOf(doc, tc.id))
		cfg, err := Parse(encode(t, doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if cfg.Zones[tc.id].Hash() != base.Zones[tc.id].Hash() {
			t.Errorf("%s: an unknown member changed the zone's hash", tc.name)
		}
		if !bytes.Contains(cfg.Canonical(), []byte(`"future"`)) {
			t.Errorf("%s: the unknown member is not kept in the document", tc.name)
		}
		// A known member changed beside the unknown one still counts.
		zoneTypeOf(doc, tc.id)["type"] = "crucible_pantry"
		changed, err := Parse(encode(t, doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if changed.Zones[tc.id].Hash() == base.Zones[tc.id].Hash() {
			t.Errorf("%s: a changed type beside an unknown member left the hash alone", tc.name)
		}
	}
}

func TestCodeBuiltZoneHash(t *testing.T) {
	z := Zone{ID: crucibleID, ZoneType: ZoneType{Type: "crucible", Address: "[fd00::1]:1"}}
	h := z.Hash()
	if h == "" || h != z.Hash() {
		t.Fatalf("hash %q is empty or unstable", h)
	}
	z2 := z
	z2.ZoneType.Address = "[fd00::1]:2"
	if z2.Hash() == h {
		t.Error("changing a code-built zone's address left its hash alone")
	}
}

func TestParseRejects(t *testing.T) {
	valid := string(exampleBytes(t))
	deep := strings.Repeat(`{"a":`, maxNesting+1) + `1` + strings.Repeat(`}`, maxNesting+1)
	for _, tc := range []struct {
		name, doc string
		want      string // in the error
	}{
		{"empty", "", "unexpected end of input"},
		{"not JSON", "hello", "malformed JSON"},
		{"truncated", valid[:len(valid)/2], "unexpected end of input"},
		{"open brace", "{", "unexpected end of input"},
		{"open array", `{"a": [1,`, "unexpected end of input"},
		{"open string", `{"a": "b`, "unexpected end of input"},
		{"trailing document", `{} {}`, "data after the JSON document"},
		{"trailing garbage", `{"generation": 1} x`, "data after the JSON document"},
		{"trailing brace", valid + "}", "data after the JSON document"},
		{"array", `[{"generation": 1}]`, "must be a JSON object"},
		{"string", `"config"`, "must be a JSON object"},
		{"null", `null`, "must be a JSON object"},
		{"trailing comma", `{"generation": 1,}`, "malformed JSON"},
		{"generation string", `{"generation": "1"}`, "field generation: expected an integer"},
		{"generation negative", `{"generation": -1}`, "field generation"},
		{"generation fraction", `{"generation": 1.5}`, "field generation"},
		{"generation too big", `{"generation": 18446744073709551616}`, "field generation"},
		{"zones array", `{"zones": []}`, "field zones: expected an object"},
		{"disks string", `{"disks": "none"}`, "field disks: expected an object"},
		{"measurements object", `{"measurements": {}}`, "field measurements: expected an array"},
		{"zone number", `{"zones": {"z": 5}}`, `field zones["z"]: expected an object`},
		{"zone id number", `{"zones": {"z": {"id": 5}}}`, `field zones["z"].id: expected a string`},
		{"vni string", `{"zones": {"z": {"zone_type": {"nic": {"vni": "100"}}}}}`, `field zones["z"].zone_type.nic.vni: expected an integer from 0 to 4294967295`},
		{"slot too big", `{"zones": {"z": {"zone_type": {"nic": {"slot": 256}}}}}`, `field zones["z"].zone_type.nic.slot: expected an integer from 0 to 255`},
		{"first_port too big", `{"zones": {"z": {"zone_type": {"snat_cfg": {"first_port": 65536}}}}}`, `zone_type.snat_cfg.first_port`},
		{"external_tls string", `{"zones": {"z": {"zone_type": {"external_tls": "yes"}}}}`, `zone_type.external_tls: expected a boolean`},
		{"duplicate key", `{"generation": 1, "generation": 2}`, `duplicate key "generation" at the top level`},
		{"duplicate zone", `{"zones": {"z": {}, "z": {}}}`, `duplicate key "z" at zones`},
		{"duplicate nested key", `{"zones": {"z": {"zone_type": {"type": "a", "type": "b"}}}}`, `duplicate key "type" at zones["z"].zone_type`},
		{"wrong case top", `{"Generation": 1}`, `field Generation: unknown field; field names are case-sensitive (did you mean "generation"?)`},
		{"wrong case zone", `{"zones": {"z": {"Zone_Type": {}}}}`, `field zones["z"].Zone_Type: unknown field`},
		{"wrong case nic", `{"zones": {"z": {"zone_type": {"NIC": {}}}}}`, `field zones["z"].zone_type.NIC`},
		{"kelvin sign", "{\"zones\": {\"z\": {\"zone_type\": {\"nic\": {\"\u212aind\": {}}}}}}", `did you mean "kind"`},
		{"invalid UTF-8", "{\"x\": \"\xff\"}", "not valid UTF-8"},
		{"too deep", deep, "nests deeper than 128 levels"},
		{"oversized", `{"x": "` + strings.Repeat("a", MaxDocumentBytes) + `"}`, "more than the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse accepted it: %s", cfg.Canonical())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	for _, doc := range []string{
		strings.Repeat(`{"a":`, maxNesting-1) + `1` + strings.Repeat(`}`, maxNesting-1),
		`{"unknown": {"Generation": 1, "x": 1, "X": 2}}`, // unknown objects may use any keys
		`{"zones": {"z": {"zone_type": {"nic": {"future": {"KIND": 1}}}}}}`,
		"  {\"generation\": 1}\n\t ",
	} {
		if _, err := Parse([]byte(doc)); err != nil {
			t.Errorf("Parse(%.60s…): %v", doc, err)
		}
	}
}

// TestParseNamesFirstBadZone checks that of several zones that do not
// decode, the error names the first by id, every time.
func TestParseNamesFirstBadZone(t *testing.T) {
	var zones []string
	for i := range 20 {
		zones = append(zones, fmt.Sprintf(`"z%02d": {"id": %d}`, i, i))
	}
	doc := []byte(`{"zones": {` + strings.Join(zones, ",") + `}}`)
	for range 50 {
		_, err := Parse(doc)
		if err == nil || !strings.Contains(err.Error(), `field zones["z00"].id: expected a string`) {
			t.Fatalf("error %v, want one naming zones[\"z00\"].id", err)
		}
	}
}
