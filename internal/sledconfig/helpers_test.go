package sledconfig

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

const (
	exampleFile         = "testdata/example-sled-config-v14.json"
	upstreamExampleFile = "../../../shared/upstream-api/example-sled-config-v14.json"

	// Zones of the example config.
	crucibleID     = "01f93020-7e7d-4185-93fb-6ca234056c82"
	crucible2ID    = "072fdae8-2adf-4fd2-94ce-e9b0663b91e7"
	nexusID        = "470fbf4d-0178-45ee-a422-136fa5f4a158"
	externalDNSID  = "5c97418b-8318-4427-8f65-14f3e3362d13"
	internalNTPID  = "a700528f-f600-4908-94ac-9c06442ef6b4"
	exampleDiskID  = "10fec275-f937-40f7-9c25-616079ef3816"
	exampleDsetID  = "01f93020-7e7d-4185-93fb-6ca234056c82"
	examplePool    = "oxp_2115b084-be0f-4fba-941b-33a659798a9e"
	boundaryNTPID  = "b0000000-0000-4000-8000-000000000001"
	internalDNSID  = "b0000000-0000-4000-8000-000000000002"
	cockroachID    = "b0000000-0000-4000-8000-000000000003"
	clickhouseID   = "b0000000-0000-4000-8000-000000000004"
	keeperID       = "b0000000-0000-4000-8000-000000000005"
	chServerID     = "b0000000-0000-4000-8000-000000000006"
	pantryID       = "b0000000-0000-4000-8000-000000000007"
	oximeterID     = "b0000000-0000-4000-8000-000000000008"
	unusedZoneUUID = "c0000000-0000-4000-8000-00000000000c"
)

// extraZones are valid zones of the types the example lacks.
var extraZones = map[string]string{
	boundaryNTPID: `{"id": "` + boundaryNTPID + `", "filesystem_pool": "` + examplePool + `",
		"zone_type": {"type": "boundary_ntp", "address": "[fd00:1122:3344:103::101]:123",
			"dns_servers": ["1.1.1.1", "2001:4860:4860::8888"], "domain": null,
			"ntp_servers": ["0.pool.ntp.org", "192.0.2.10"],
			"nic": {"id": "d0000000-0000-4000-8000-000000000001",
				"kind": {"type": "service", "id": "` + boundaryNTPID + `"},
				"name": "ntp-` + boundaryNTPID + `",
				"ip_config": {"type": "dual_stack", "value": {
					"v4": {"ip": "172.30.3.5", "subnet": "172.30.3.0/24", "transit_ips": []},
					"v6": {"ip": "fdb0::5", "subnet": "fdb0::/64", "transit_ips": ["fdb1::/64"]}}},
				"mac": "A8:40:25:FF:80:10", "vni": 100, "primary": true, "slot": 0},
			"snat_cfg": {"ip": "172.20.26.9", "first_port": 0, "last_port": 16383}},
		"image_source": {"type": "install_dataset"}}`,
	internalDNSID: `{"id": "` + internalDNSID + `", "filesystem_pool": null,
		"zone_type": {"type": "internal_dns", "dataset": {"pool_name": "` + examplePool + `"},
			"http_address": "[fd00:1122:3344:1::1]:5353", "dns_address": "[fd00:1122:3344:1::1]:53",
			"gz_address": "fd00:1122:3344:1::2", "gz_address_index": 0}}`,
	cockroachID:  simpleZone(cockroachID, "cockroach_db", "[fd00:1122:3344:103::103]:32221", true),
	clickhouseID: simpleZone(clickhouseID, "clickhouse", "[fd00:1122:3344:103::104]:8123", true),
	keeperID:     simpleZone(keeperID, "clickhouse_keeper", "[fd00:1122:3344:103::105]:9181", true),
	chServerID:   simpleZone(chServerID, "clickhouse_server", "[fd00:1122:3344:103::106]:8123", true),
	pantryID:     simpleZone(pantryID, "crucible_pantry", "[fd00:1122:3344:103::107]:17000", false),
	oximeterID:   simpleZone(oximeterID, "oximeter", "[fd00:1122:3344:103::108]:12223", false),
}

func simpleZone(id, typ, addr string, dataset bool) string {
	ds := ""
	if dataset {
		ds = `, "dataset": {"pool_name": "` + examplePool + `"}`
	}
	return `{"id": "` + id + `", "zone_type": {"type": "` + typ + `", "address": "` + addr + `"` + ds + `},
		"image_source": {"type": "artifact", "hash": "` + strings.Repeat("ab", 32) + `"}}`
}

func exampleBytes(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeAny decodes JSON into maps, slices and json.Numbers.
func decodeAny(t testing.TB, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %.100s: %v", b, err)
	}
	return v
}

// exampleDoc is the example config, decoded, for tests to change.
func exampleDoc(t testing.TB) map[string]any {
	t.Helper()
	return decodeAny(t, exampleBytes(t)).(map[string]any)
}

// fullDoc is the example config with a valid zone of every type.
func fullDoc(t testing.TB) map[string]any {
	t.Helper()
	doc := exampleDoc(t)
	zones := doc["zones"].(map[string]any)
	for id, z := range extraZones {
		zones[id] = decodeAny(t, []byte(z))
	}
	return doc
}

func encode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func zoneOf(doc map[string]any, id string) map[string]any {
	return doc["zones"].(map[string]any)[id].(map[string]any)
}

func zoneTypeOf(doc map[string]any, id string) map[string]any {
	return zoneOf(doc, id)["zone_type"].(map[string]any)
}

func nicOf(doc map[string]any, id string) map[string]any {
	return zoneTypeOf(doc, id)["nic"].(map[string]any)
}

// writeReversed writes v as indented JSON with object keys in reverse order:
// the same document as json.Marshal(v), spelled differently.
func writeReversed(b *bytes.Buffer, v any, indent string) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		b.WriteString("{\n")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",\n")
			}
			kb, _ := json.Marshal(k)
			b.WriteString(indent + "  ")
			b.Write(kb)
			b.WriteString(" :  ")
			writeReversed(b, v[k], indent+"  ")
		}
		b.WriteString("\n" + indent + "}")
	case []any:
		b.WriteString("[ ")
		for i, e := range v {
			if i > 0 {
				b.WriteString(" ,\n")
			}
			writeReversed(b, e, indent+"  ")
		}
		b.WriteString(" ]")
	default:
		vb, _ := json.Marshal(v)
		b.Write(vb)
	}
}

func reversed(v any) []byte {
	var b bytes.Buffer
	writeReversed(&b, v, "")
	return b.Bytes()
}
