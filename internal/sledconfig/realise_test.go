package sledconfig

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestValidateWithSledUnderlay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sled  string
		path  string // of the one problem; "" for none
		msg   string
		build func(t testing.TB) map[string]any
	}{
		{"a zone on the sled's address", "fd00:1122:3344:103::5", zp(crucibleID) + ".zone_type.address", "underlay address fd00:1122:3344:103::5 is the sled's own underlay address", fullDoc},
		{"nexus on the sled's address", "fd00:1122:3344:103::47", zp(nexusID) + ".zone_type.internal_address", "is the sled's own underlay address", fullDoc},
		// Only the internal DNS zone: every other zone would be outside a
		// sled there (which no sled of upstream's can be: the internal DNS
		// /64s are no rack's).
		{"gz_address is the sled's address", "fd00:1122:3344:1::2", zp(internalDNSID) + ".zone_type.gz_address", "fd00:1122:3344:1::2 is the sled's own underlay address", internalDNSDoc},
		{"every zone type, another sled address", "fd00:1122:3344:103::1", "", "", fullDoc},
		{"the example, on its own sled", "fd00:1122:3344:103::1", "", "", exampleDoc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(encode(t, tc.build(t)))
			if err != nil {
				t.Fatal(err)
			}
			if err := Validate(cfg); err != nil {
				t.Fatalf("Validate without the sled's address: %v", err)
			}
			err = ValidateWith(cfg, ValidateOptions{SledUnderlay: netip.MustParseAddr(tc.sled)})
			if tc.path == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Problems) != 1 {
				t.Fatalf("ValidateWith = %v, want one problem", err)
			}
			if p := verr.Problems[0]; p.Path != tc.path || !strings.Contains(p.Message, tc.msg) {
				t.Errorf("problem %q, want %s saying %q", p, tc.path, tc.msg)
			}
			if !verr.WellFormed() {
				t.Error("WellFormed() = false for a config that is only unrealisable")
			}
		})
	}
}

// internalDNSDoc is fullDoc with its internal DNS zone alone.
func internalDNSDoc(t testing.TB) map[string]any {
	doc := fullDoc(t)
	zones := doc["zones"].(map[string]any)
	doc["zones"] = map[string]any{internalDNSID: zones[internalDNSID]}
	return doc
}

// WellFormed tells a config that only holds values no runtime can realise
// from a malformed one.
func TestWellFormed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		change     func(doc map[string]any)
		wellFormed bool
	}{
		{"loopback address", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "[::1]:32345" }, true},
		{"port 0", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "[fd00:1122:3344:103::5]:0" }, true},
		{"shared address", func(doc map[string]any) { zoneTypeOf(doc, crucible2ID)["address"] = "[fd00:1122:3344:103::5]:1" }, true},
		{"multicast MAC", func(doc map[string]any) { nicOf(doc, nexusID)["mac"] = "01:00:5E:00:00:01" }, true},
		{"gz_address taken", func(doc map[string]any) { zoneTypeOf(doc, internalDNSID)["gz_address"] = "fd00:1122:3344:103::5" }, true},
		{"generation too large", func(doc map[string]any) { doc["generation"] = json.Number("9223372036854775808") }, false},
		{"address not parseable", func(doc map[string]any) { zoneTypeOf(doc, crucibleID)["address"] = "crucible:1" }, false},
		{"both", func(doc map[string]any) {
			zoneTypeOf(doc, crucibleID)["address"] = "[::1]:32345"
			delete(zoneTypeOf(doc, nexusID), "nic")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := fullDoc(t)
			tc.change(doc)
			cfg, err := Parse(encode(t, doc))
			if err != nil {
				t.Fatal(err)
			}
			var verr *ValidationError
			if !errors.As(Validate(cfg), &verr) {
				t.Fatal("no validation error")
			}
			if got := verr.WellFormed(); got != tc.wellFormed {
				t.Errorf("WellFormed() = %v, want %v: %v", got, tc.wellFormed, verr)
			}
		})
	}
}
