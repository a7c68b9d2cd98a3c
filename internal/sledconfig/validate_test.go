package sledconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

func zp(id string) string { return `zones["` + id + `"]` }

func TestValidateUpstreamExample(t *testing.T) {
	upstream, err := os.ReadFile(upstreamExampleFile)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s is not here; the testdata copy is checked below", upstreamExampleFile)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(cfg); err != nil {
		t.Errorf("Validate(upstream example) = %v", err)
	}
	if !bytes.Equal(upstream, exampleBytes(t)) {
		t.Errorf("%s differs from %s; copy it again", exampleFile, upstreamExampleFile)
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(doc map[string]any)
	}{
		{"example", nil},
		{"every zone type", func(doc map[string]any) {}},
		{"generation 0", func(doc map[string]any) { doc["generation"] = json.Number("0") }},
		{"upstream's largest generation", func(doc map[string]any) { doc["generation"] = json.Number("9223372036854775807") }},
		{"no image_source", func(doc map[string]any) { delete(zoneOf(doc, nexusID), "image_source") }},
		{"no filesystem_pool", func(doc map[string]any) { delete(zoneOf(doc, nexusID), "filesystem_pool") }},
		{"internal pool", func(doc map[string]any) {
			zoneOf(doc, nexusID)["filesystem_pool"] = "oxi_2115b084-be0f-4fba-941b-33a659798a9e"
		}},
		{"upper-case artifact hash", func(doc map[string]any) {
			zoneOf(doc, nexusID)["image_source"] = map[string]any{"type": "artifact", "hash": strings.Repeat("AB", 32)}
		}},
		{"upper-case zone id", func(doc map[string]any) {
			zones := doc["zones"].(map[string]any)
			z := zones[crucibleID].(map[string]any)
			delete(zones, crucibleID)
			z["id"] = strings.ToUpper(crucibleID)
			zones[strings.ToUpper(crucibleID)] = z
		}},
		{"nexus without lockstep_port", func(doc map[string]any) { delete(zoneTypeOf(doc, nexusID), "lockstep_port") }},
		{"external DNS on IPv6", func(doc map[string]any) { zoneTypeOf(doc, externalDNSID)["dns_address"] = "[2001:db8::53]:53" }},
		{"nexus v6 NIC", func(doc map[string]any) {
			nicOf(doc, nexusID)["ip_config"] = map[string]any{"type": "v6", "value": map[string]any{
				"ip": "fdb0::9", "subnet": "fdb0::/64", "transit_ips": []any{}}}
		}},
		{"v4 NIC without transit_ips", func(doc map[string]any) {
			delete(nicOf(doc, nexusID)["ip_config"].(map[string]any)["value"].(map[string]any), "transit_ips")
		}},
		{"NIC kinds", func(doc map[string]any) {
			nicOf(doc, nexusID)["kind"] = map[string]any{"type": "instance", "id": unusedZoneUUID}
			nicOf(doc, externalDNSID)["kind"] = map[string]any{"type": "probe", "id": unusedZoneUUID}
		}},
		{"largest VNI", func(doc map[string]any) { nicOf(doc, nexusID)["vni"] = json.Number("16777215") }},
		{"boundary NTP without DNS servers", func(doc map[string]any) { zoneTypeOf(doc, boundaryNTPID)["dns_servers"] = []any{} }},
		{"one-port SNAT", func(doc map[string]any) {
			zoneTypeOf(doc, boundaryNTPID)["snat_cfg"] = map[string]any{"ip": "2001:db8::1", "first_port": json.Number("80"), "last_port": json.Number("80")}
		}},
		{"unknown fields", func(doc map[string]any) {
			doc["future"] = "x"
			zoneTypeOf(doc, crucibleID)["future"] = "x"
			nicOf(doc, nexusID)["future"] = "x"
		}},
		{"no zones", func(doc map[string]any) { doc["zones"] = map[string]any{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := exampleDoc(t)
			if tc.change != nil {
				doc = fullDoc(t)
				tc.change(doc)
			}
			cfg, err := Parse(encode(t, doc))
			if err != nil {
				t.Fatal(err)
			}
			if err := Validate(cfg); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestValidationErrorLists(t *testing.T) {
	doc := exampleDoc(t)
	nicOf(doc, nexusID)["mac"] = "zz:40:25:FF:80:05"
	zoneTypeOf(doc, crucibleID)["address"] = "192.0.2.1:32345"
	cfg, err := Parse(encode(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	err = Validate(cfg)
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Validate = %v, want a *ValidationError", err)
	}
	want := []Problem{
		{zp(crucibleID) + ".zone_type.address", `"192.0.2.1:32345" is not an IPv6 socket address like "[fd00:1122:3344:101::5]:32345"`},
		{zp(nexusID) + ".zone_type.nic.mac", `"zz:40:25:FF:80:05" is not an EUI-48 MAC address like "A8:40:25:FF:80:05"`},
	}
	if len(verr.Problems) != len(want) {
		t.Fatalf("problems %q, want %q", verr.Problems, want)
	}
	for i := range want {
		if verr.Problems[i] != want[i] {
			t.Errorf("problem %d = %q, want %q", i, verr.Problems[i], want[i])
		}
	}
	wantMsg := "invalid sled config: 2 problems: " + want[0].String() + "; " + want[1].String()
	if err.Error() != wantMsg {
		t.Errorf("Error() =\n%s\nwant\n%s", err, wantMsg)
	}

	one := &ValidationError{Problems: want[:1]}
	if got := one.Error(); got != "invalid sled config: 1 problem: "+want[0].String() {
		t.Errorf("Error() of one problem = %q", got)
	}
	many := &ValidationError{Problems: make([]Problem, maxProblemsInMessage+3)}
	if got := many.Error(); !strings.HasSuffix(got, "; and 3 more") || !strings.HasPrefix(got, "invalid sled config: 53 problems: ") {
		t.Errorf("Error() of many problems = %q", got)
	}
	if err := Validate(nil); err == nil {
		t.Error("Validate(nil) = nil")
	}
}

// addZone adds an oximeter zone under key with the given id and address.
func addZone(t *testing.T, doc map[string]any, key, id, addr string) {
	doc["zones"].(map[string]any)[key] = decodeAny(t, []byte(simpleZone(id, "oximeter", addr, false)))
}

func setIPConfig(doc map[string]any, zone string, typ string, value map[string]any) {
	nicOf(doc, zone)["ip_config"] = map[string]any{"type": typ, "value": value}
}

func ipValue(doc map[string]any, zone string) map[string]any {
	return nicOf(doc, zone)["ip_config"].(map[string]any)["value"].(map[string]any)
}

func TestValidateRejects(t *testing.T) {
	type change = func(t *testing.T, doc map[string]any)
	set := func(id, field string, v any) change {
		return func(t *testing.T, doc map[string]any) { zoneTypeOf(doc, id)[field] = v }
	}
	del := func(id, field string) change {
		return func(t *testing.T, doc map[string]any) { delete(zoneTypeOf(doc, id), field) }
	}
	setNIC := func(id, field string, v any) change {
		return func(t *testing.T, doc map[string]any) { nicOf(doc, id)[field] = v }
	}
	setZone := func(id, field string, v any) change {
		return func(t *testing.T, doc map[string]any) { zoneOf(doc, id)[field] = v }
	}
	setIP := func(field string, v any) change {
		return func(t *testing.T, doc map[string]any) { ipValue(doc, nexusID)[field] = v }
	}
	crucibleNIC := func(t *testing.T, doc map[string]any) { zoneTypeOf(doc, crucibleID)["nic"] = nicOf(doc, nexusID) }
	nic := zp(nexusID) + ".zone_type.nic"
	upper := strings.ToUpper(crucibleID)
	noHyphens := strings.ReplaceAll(unusedZoneUUID, "-", "")

	for _, tc := range []struct {
		name     string
		change   change
		path     string // of the problem
		msg      string // in its message
		problems int    // how many problems in all, if not 1
	}{
		// Zone ids.
		{"id differs from key", setZone(crucibleID, "id", crucible2ID), zp(crucibleID) + ".id", `"` + crucible2ID + `" does not match its key`, 0},
		{"id missing", func(t *testing.T, doc map[string]any) { delete(zoneOf(doc, crucibleID), "id") }, zp(crucibleID) + ".id", "is required", 0},
		{"id not a UUID", func(t *testing.T, doc map[string]any) {
			addZone(t, doc, "not-a-uuid", "not-a-uuid", "[fd00:1122:3344:103::200]:1")
		}, zp("not-a-uuid") + ".id", `"not-a-uuid" is not a UUID`, 0},
		{"id without hyphens", func(t *testing.T, doc map[string]any) {
			addZone(t, doc, noHyphens, noHyphens, "[fd00:1122:3344:103::200]:1")
		}, zp(noHyphens) + ".id", "is not a UUID (want the 36-character hyphenated form)", 0},
		{"id in braces", func(t *testing.T, doc map[string]any) {
			id := "{" + unusedZoneUUID + "}"
			addZone(t, doc, id, id, "[fd00:1122:3344:103::200]:1")
		}, zp("{"+unusedZoneUUID+"}") + ".id", "is not a UUID", 0},
		{"ids differ only in case", func(t *testing.T, doc map[string]any) {
			addZone(t, doc, upper, upper, "[fd00:1122:3344:103::200]:1")
		}, zp(crucibleID), `differs from zone "` + upper + `" only in letter case`, 0},

		// Zone types and their fields.
		{"unknown type", set(crucibleID, "type", "crucible_v2"), zp(crucibleID) + ".zone_type.type", `unknown zone type "crucible_v2"`, 0},
		{"type missing", del(crucibleID, "type"), zp(crucibleID) + ".zone_type.type", "is required", 0},
		{"crucible without dataset", del(crucibleID, "dataset"), zp(crucibleID) + ".zone_type.dataset", "is required for zone type crucible", 0},
		{"crucible without address", del(crucibleID, "address"), zp(crucibleID) + ".zone_type.address", "is required for zone type crucible", 0},
		{"nexus without external_tls", del(nexusID, "external_tls"), zp(nexusID) + ".zone_type.external_tls", "is required for zone type nexus", 0},
		{"nexus without external_dns_servers", del(nexusID, "external_dns_servers"), zp(nexusID) + ".zone_type.external_dns_servers", "is required", 0},
		{"nexus without nic", del(nexusID, "nic"), zp(nexusID) + ".zone_type.nic", "is required", 0},
		{"nexus without external_ip", del(nexusID, "external_ip"), zp(nexusID) + ".zone_type.external_ip", "is required", 0},
		{"nexus without internal_address", del(nexusID, "internal_address"), zp(nexusID) + ".zone_type.internal_address", "is required", 0},
		{"internal_dns without gz_address_index", del(internalDNSID, "gz_address_index"), zp(internalDNSID) + ".zone_type.gz_address_index", "is required for zone type internal_dns", 0},
		{"internal_dns without gz_address", del(internalDNSID, "gz_address"), zp(internalDNSID) + ".zone_type.gz_address", "is required", 0},
		{"internal_dns without dns_address", del(internalDNSID, "dns_address"), zp(internalDNSID) + ".zone_type.dns_address", "is required", 0},
		{"internal_dns without dataset", del(internalDNSID, "dataset"), zp(internalDNSID) + ".zone_type.dataset", "is required", 0},
		{"external_dns without nic", del(externalDNSID, "nic"), zp(externalDNSID) + ".zone_type.nic", "is required for zone type external_dns", 0},
		{"external_dns without http_address", del(externalDNSID, "http_address"), zp(externalDNSID) + ".zone_type.http_address", "is required", 0},
		{"boundary_ntp without snat_cfg", del(boundaryNTPID, "snat_cfg"), zp(boundaryNTPID) + ".zone_type.snat_cfg", "is required for zone type boundary_ntp", 0},
		{"boundary_ntp without ntp_servers", del(boundaryNTPID, "ntp_servers"), zp(boundaryNTPID) + ".zone_type.ntp_servers", "is required", 0},
		{"boundary_ntp without dns_servers", del(boundaryNTPID, "dns_servers"), zp(boundaryNTPID) + ".zone_type.dns_servers", "is required", 0},
		{"boundary_ntp without nic", del(boundaryNTPID, "nic"), zp(boundaryNTPID) + ".zone_type.nic", "is required", 0},
		{"internal_ntp without address", del(internalNTPID, "address"), zp(internalNTPID) + ".zone_type.address", "is required for zone type internal_ntp", 0},
		{"crucible_pantry without address", del(pantryID, "address"), zp(pantryID) + ".zone_type.address", "is required for zone type crucible_pantry", 0},
		{"oximeter without address", del(oximeterID, "address"), zp(oximeterID) + ".zone_type.address", "is required for zone type oximeter", 0},
		{"cockroach_db without dataset", del(cockroachID, "dataset"), zp(cockroachID) + ".zone_type.dataset", "is required for zone type cockroach_db", 0},
		{"clickhouse without dataset", del(clickhouseID, "dataset"), zp(clickhouseID) + ".zone_type.dataset", "is required for zone type clickhouse", 0},
		{"clickhouse_keeper without dataset", del(keeperID, "dataset"), zp(keeperID) + ".zone_type.dataset", "is required for zone type clickhouse_keeper", 0},
		{"clickhouse_server without address", del(chServerID, "address"), zp(chServerID) + ".zone_type.address", "is required for zone type clickhouse_server", 0},
		{"nic on crucible", crucibleNIC, zp(crucibleID) + ".zone_type.nic", "is not a field of zone type crucible", 0},
		{"lockstep_port on crucible", set(crucibleID, "lockstep_port", json.Number("12232")), zp(crucibleID) + ".zone_type.lockstep_port", "is not a field of zone type crucible", 0},
		{"domain on nexus", set(nexusID, "domain", "example.com"), zp(nexusID) + ".zone_type.domain", "is not a field of zone type nexus", 0},
		{"dataset on internal_ntp", set(internalNTPID, "dataset", map[string]any{"pool_name": examplePool}), zp(internalNTPID) + ".zone_type.dataset", "is not a field of zone type internal_ntp", 0},
		{"gz_address on external_dns", set(externalDNSID, "gz_address", "fd00::1"), zp(externalDNSID) + ".zone_type.gz_address", "is not a field of zone type external_dns", 0},
		{"address on nexus", set(nexusID, "address", "[fd00:1122:3344:103::47]:1"), zp(nexusID) + ".zone_type.address", "is not a field of zone type nexus", 0},

		// Addresses.
		{"IPv4 underlay address", set(crucibleID, "address", "192.0.2.1:32345"), zp(crucibleID) + ".zone_type.address", "is not an IPv6 socket address", 0},
		{"underlay address without brackets", set(crucibleID, "address", "fd00:1122:3344:103::5:32345"), zp(crucibleID) + ".zone_type.address", "is not an IPv6 socket address", 0},
		{"underlay address without port", set(crucibleID, "address", "[fd00:1122:3344:103::5]"), zp(crucibleID) + ".zone_type.address", "is not an IPv6 socket address", 0},
		{"IPv4-mapped underlay address", set(crucibleID, "address", "[::ffff:192.0.2.1]:32345"), zp(crucibleID) + ".zone_type.address", "IPv4-mapped", 0},
		{"scoped underlay address", set(crucibleID, "address", "[fe80::1%eth0]:32345"), zp(crucibleID) + ".zone_type.address", "scope zone", 0},
		{"nexus internal_address host name", set(nexusID, "internal_address", "nexus:12221"), zp(nexusID) + ".zone_type.internal_address", "is not an IPv6 socket address", 0},
		{"internal_dns IPv4 dns_address", set(internalDNSID, "dns_address", "10.0.0.1:53"), zp(internalDNSID) + ".zone_type.dns_address", "is not an IPv6 socket address", 0},
		{"internal_dns IPv4 http_address", set(internalDNSID, "http_address", "10.0.0.1:5353"), zp(internalDNSID) + ".zone_type.http_address", "is not an IPv6 socket address", 0},
		{"external_dns dns_address without port", set(externalDNSID, "dns_address", "172.20.26.2"), zp(externalDNSID) + ".zone_type.dns_address", `"172.20.26.2" is not an address like`, 0},
		{"nexus external_ip", set(nexusID, "external_ip", "172.20.26.300"), zp(nexusID) + ".zone_type.external_ip", `"172.20.26.300" is not an IP address`, 0},
		{"nexus external_ip with port", set(nexusID, "external_ip", "172.20.26.8:443"), zp(nexusID) + ".zone_type.external_ip", "is not an IP address", 0},
		{"external DNS server name", set(nexusID, "external_dns_servers", []any{"1.1.1.1", "dns.quad9.net"}), zp(nexusID) + ".zone_type.external_dns_servers[1]", `"dns.quad9.net" is not an IP address`, 0},
		{"empty DNS server", set(boundaryNTPID, "dns_servers", []any{""}), zp(boundaryNTPID) + ".zone_type.dns_servers[0]", "is required", 0},
		{"SNAT ip", set(boundaryNTPID, "snat_cfg", map[string]any{"ip": "snat", "first_port": json.Number("0"), "last_port": json.Number("1")}), zp(boundaryNTPID) + ".zone_type.snat_cfg.ip", `"snat" is not an IP address`, 0},
		{"IPv4 gz_address", set(internalDNSID, "gz_address", "10.0.0.1"), zp(internalDNSID) + ".zone_type.gz_address", "is not an IPv6 address", 0},
		{"bracketed gz_address", set(internalDNSID, "gz_address", "[fd00:1122:3344:1::2]"), zp(internalDNSID) + ".zone_type.gz_address", "is not an IPv6 address", 0},
		{"empty NTP server", set(boundaryNTPID, "ntp_servers", []any{"0.pool.ntp.org", ""}), zp(boundaryNTPID) + ".zone_type.ntp_servers[1]", "is empty", 0},

		// Shared underlay addresses.
		{"two crucibles on one address", set(crucible2ID, "address", "[fd00:1122:3344:103::5]:40000"), zp(crucible2ID) + ".zone_type.address", `underlay address fd00:1122:3344:103::5 is also used by zone "` + crucibleID + `"`, 0},
		{"NTP on nexus's address", set(internalNTPID, "address", "[fd00:1122:3344:103::47]:123"), zp(internalNTPID) + ".zone_type.address", `is also used by zone "` + nexusID + `"`, 0},
		{"internal DNS on a crucible's address", func(t *testing.T, doc map[string]any) {
			zt := zoneTypeOf(doc, internalDNSID)
			zt["http_address"] = "[fd00:1122:3344:103::5]:5353"
			zt["dns_address"] = "[fd00:1122:3344:103::5]:53"
		}, zp(internalDNSID) + ".zone_type.http_address", `underlay address fd00:1122:3344:103::5 is also used by zone "` + crucibleID + `"`, 0},

		// Pools.
		{"upper-case pool", setZone(crucibleID, "filesystem_pool", "oxp_7B24095A-72DF-45E3-984F-2B795E052AC7"), zp(crucibleID) + ".filesystem_pool", "is not a zpool name", 0},
		{"pool prefix", setZone(crucibleID, "filesystem_pool", "oxz_7b24095a-72df-45e3-984f-2b795e052ac7"), zp(crucibleID) + ".filesystem_pool", "is not a zpool name", 0},
		{"pool not v4 UUID", setZone(crucibleID, "filesystem_pool", "oxp_7b24095a-72df-15e3-984f-2b795e052ac7"), zp(crucibleID) + ".filesystem_pool", "is not a zpool name", 0},
		{"pool bare UUID", setZone(crucibleID, "filesystem_pool", "7b24095a-72df-45e3-984f-2b795e052ac7"), zp(crucibleID) + ".filesystem_pool", "is not a zpool name", 0},
		{"dataset pool", set(crucibleID, "dataset", map[string]any{"pool_name": "oxp_"}), zp(crucibleID) + ".zone_type.dataset.pool_name", `"oxp_" is not a zpool name`, 0},

		// Image sources.
		{"short artifact hash", setZone(crucibleID, "image_source", map[string]any{"type": "artifact", "hash": "988cab6e"}), zp(crucibleID) + ".image_source.hash", `"988cab6e" is not a SHA-256 hash`, 0},
		{"artifact without hash", setZone(crucibleID, "image_source", map[string]any{"type": "artifact"}), zp(crucibleID) + ".image_source.hash", "is not a SHA-256 hash", 0},
		{"non-hex artifact hash", setZone(crucibleID, "image_source", map[string]any{"type": "artifact", "hash": strings.Repeat("g", 64)}), zp(crucibleID) + ".image_source.hash", "is not a SHA-256 hash", 0},
		{"install_dataset with hash", setZone(crucibleID, "image_source", map[string]any{"type": "install_dataset", "hash": strings.Repeat("a", 64)}), zp(crucibleID) + ".image_source.hash", "is not a field of image source install_dataset", 0},
		{"unknown image source", setZone(crucibleID, "image_source", map[string]any{"type": "url"}), zp(crucibleID) + ".image_source.type", `unknown image source "url"`, 0},
		{"image source without type", setZone(crucibleID, "image_source", map[string]any{}), zp(crucibleID) + ".image_source.type", "is required", 0},

		// NICs.
		{"NIC id", setNIC(nexusID, "id", "nic-1"), nic + ".id", `"nic-1" is not a UUID`, 0},
		{"NIC kind type", setNIC(nexusID, "kind", map[string]any{"type": "vpc", "id": nexusID}), nic + ".kind.type", `unknown NIC kind "vpc"`, 0},
		{"NIC kind id", setNIC(nexusID, "kind", map[string]any{"type": "service", "id": "nexus"}), nic + ".kind.id", `"nexus" is not a UUID`, 0},
		{"NIC kind missing", setNIC(nexusID, "kind", map[string]any{"id": nexusID}), nic + ".kind.type", "is required", 0},
		{"NIC name upper-case start", setNIC(nexusID, "name", "Nexus-1"), nic + ".name", `"Nexus-1" is not a name`, 0},
		{"NIC name ends in -", setNIC(nexusID, "name", "nexus-"), nic + ".name", "is not a name", 0},
		{"NIC name starts with digit", setNIC(nexusID, "name", "1nexus"), nic + ".name", "is not a name", 0},
		{"NIC name underscore", setNIC(nexusID, "name", "nexus_1"), nic + ".name", "is not a name", 0},
		{"NIC name is a UUID", setNIC(nexusID, "name", "abcdef01-0178-45ee-a422-136fa5f4a158"), nic + ".name", "is a UUID", 0},
		{"NIC name too long", setNIC(nexusID, "name", "n"+strings.Repeat("a", 63)), nic + ".name", "longer than 63", 0},
		{"NIC name empty", setNIC(nexusID, "name", ""), nic + ".name", "is empty", 0},
		{"MAC not hex", setNIC(nexusID, "mac", "zz:40:25:FF:80:05"), nic + ".mac", `"zz:40:25:FF:80:05" is not an EUI-48 MAC address`, 0},
		{"MAC with hyphens", setNIC(nexusID, "mac", "A8-40-25-FF-80-05"), nic + ".mac", "is not an EUI-48 MAC address", 0},
		{"MAC EUI-64", setNIC(nexusID, "mac", "A8:40:25:FF:80:05:00:01"), nic + ".mac", "is not an EUI-48 MAC address", 0},
		{"MAC short", setNIC(nexusID, "mac", "A8:40:25:FF:80"), nic + ".mac", "is not an EUI-48 MAC address", 0},
		{"VNI too big", setNIC(nexusID, "vni", json.Number("16777216")), nic + ".vni", "16777216 is larger than the largest VNI, 16777215", 0},
		{"ip_config type", func(t *testing.T, doc map[string]any) {
			nicOf(doc, nexusID)["ip_config"].(map[string]any)["type"] = "v5"
		}, nic + ".ip_config.type", `unknown ip_config type "v5"`, 0},
		{"v4 ip is IPv6", setIP("ip", "fdb0::9"), nic + ".ip_config.value.ip", `"fdb0::9" is not an IPv4 address`, 0},
		{"v4 ip missing", setIP("ip", ""), nic + ".ip_config.value.ip", "is required", 0},
		{"v4 subnet misses ip", setIP("subnet", "172.30.3.0/24"), nic + ".ip_config.value.subnet", "172.30.3.0/24 does not contain ip 172.30.2.9", 0},
		{"v4 subnet is IPv6", setIP("subnet", "fdb0::/64"), nic + ".ip_config.value.subnet", `"fdb0::/64" is not an IPv4 prefix`, 0},
		{"v4 subnet too long", setIP("subnet", "172.30.2.0/33"), nic + ".ip_config.value.subnet", "is not an IPv4 prefix", 0},
		{"v4 transit IP is IPv6", setIP("transit_ips", []any{"fdb0::/64"}), nic + ".ip_config.value.transit_ips[0]", "is not an IPv4 prefix", 0},
		{"v4 with v6", setIP("v6", map[string]any{"ip": "fdb0::9", "subnet": "fdb0::/64", "transit_ips": []any{}}), nic + ".ip_config.value.v6", "is not a field of ip_config type v4", 0},
		{"v6 with IPv4 values", func(t *testing.T, doc map[string]any) {
			nicOf(doc, nexusID)["ip_config"].(map[string]any)["type"] = "v6"
		}, nic + ".ip_config.value.ip", `"172.30.2.9" is not an IPv6 address`, 2},
		{"v6 IPv4-mapped", func(t *testing.T, doc map[string]any) {
			setIPConfig(doc, nexusID, "v6", map[string]any{"ip": "::ffff:172.30.2.9", "subnet": "fdb0::/64", "transit_ips": []any{}})
		}, nic + ".ip_config.value.ip", "is not an IPv6 address", 0},
		{"v6 without transit_ips", func(t *testing.T, doc map[string]any) {
			setIPConfig(doc, nexusID, "v6", map[string]any{"ip": "fdb0::9", "subnet": "fdb0::/64"})
		}, nic + ".ip_config.value.transit_ips", "is required", 0},
		{"dual_stack without v6", func(t *testing.T, doc map[string]any) {
			delete(ipValue(doc, boundaryNTPID), "v6")
		}, zp(boundaryNTPID) + ".zone_type.nic.ip_config.value.v6", "is required for ip_config type dual_stack", 0},
		{"dual_stack with ip", func(t *testing.T, doc map[string]any) {
			ipValue(doc, boundaryNTPID)["ip"] = "172.30.3.5"
		}, zp(boundaryNTPID) + ".zone_type.nic.ip_config.value", "go in v4 and v6", 0},
		{"dual_stack bad v4 ip", func(t *testing.T, doc map[string]any) {
			ipValue(doc, boundaryNTPID)["v4"].(map[string]any)["ip"] = "172.30.3.256"
		}, zp(boundaryNTPID) + ".zone_type.nic.ip_config.value.v4.ip", "is not an IPv4 address", 0},

		// SNAT.
		{"SNAT ports reversed", set(boundaryNTPID, "snat_cfg", map[string]any{"ip": "172.20.26.9", "first_port": json.Number("16384"), "last_port": json.Number("0")}), zp(boundaryNTPID) + ".zone_type.snat_cfg", "first_port 16384 is after last_port 0", 0},

		// Addresses no zone can hold.
		{"loopback underlay address", set(crucibleID, "address", "[::1]:32345"), zp(crucibleID) + ".zone_type.address", "::1 is a loopback address", 0},
		{"link-local underlay address", set(crucibleID, "address", "[fe80::5]:32345"), zp(crucibleID) + ".zone_type.address", "fe80::5 is a link-local address", 0},
		{"multicast underlay address", set(nexusID, "internal_address", "[ff05::2]:12221"), zp(nexusID) + ".zone_type.internal_address", "ff05::2 is a multicast address", 0},
		{"unspecified underlay address", set(internalNTPID, "address", "[::]:123"), zp(internalNTPID) + ".zone_type.address", ":: is the unspecified address", 0},
		{"loopback DNS http_address", set(internalDNSID, "http_address", "[::1]:5353"), zp(internalDNSID) + ".zone_type.http_address", "is a loopback address", 0},
		{"underlay port 0", set(crucibleID, "address", "[fd00:1122:3344:103::5]:0"), zp(crucibleID) + ".zone_type.address", "has port 0", 0},
		{"internal DNS port 0", set(internalDNSID, "dns_address", "[fd00:1122:3344:1::1]:0"), zp(internalDNSID) + ".zone_type.dns_address", "has port 0", 0},
		{"external DNS port 0", set(externalDNSID, "dns_address", "172.20.26.2:0"), zp(externalDNSID) + ".zone_type.dns_address", "has port 0", 0},
		{"lockstep port 0", set(nexusID, "lockstep_port", json.Number("0")), zp(nexusID) + ".zone_type.lockstep_port", "is 0", 0},
		{"loopback gz_address", set(internalDNSID, "gz_address", "::1"), zp(internalDNSID) + ".zone_type.gz_address", "::1 is a loopback address", 0},
		{"link-local gz_address", set(internalDNSID, "gz_address", "fe80::2"), zp(internalDNSID) + ".zone_type.gz_address", "is a link-local address", 0},
		{"gz_address is the zone's own", set(internalDNSID, "gz_address", "fd00:1122:3344:1::1"), zp(internalDNSID) + ".zone_type.gz_address", "is also this zone's own http_address", 0},
		{"gz_address is another zone's", set(internalDNSID, "gz_address", "fd00:1122:3344:103::5"), zp(internalDNSID) + ".zone_type.gz_address", `fd00:1122:3344:103::5 is the underlay address of zone "` + crucibleID + `"`, 0},
		{"two DNS zones on one gz_address", func(t *testing.T, doc map[string]any) {
			z := decodeAny(t, []byte(extraZones[internalDNSID])).(map[string]any)
			z["id"] = unusedZoneUUID
			zt := z["zone_type"].(map[string]any)
			zt["http_address"], zt["dns_address"] = "[fd00:1122:3344:2::1]:5353", "[fd00:1122:3344:2::1]:53"
			doc["zones"].(map[string]any)[unusedZoneUUID] = z
		}, zp(unusedZoneUUID) + ".zone_type.gz_address", `is also the gz_address of zone "` + internalDNSID + `"`, 0},

		// MACs and IPs no NIC can have.
		{"multicast MAC", setNIC(nexusID, "mac", "A9:40:25:FF:80:05"), nic + ".mac", `"A9:40:25:FF:80:05" is a multicast MAC address`, 0},
		{"broadcast MAC", setNIC(nexusID, "mac", "FF:FF:FF:FF:FF:FF"), nic + ".mac", "is a multicast MAC address", 0},
		{"all-zero MAC", setNIC(nexusID, "mac", "00:00:00:00:00:00"), nic + ".mac", "is the all-zero MAC address", 0},
		{"v4 NIC ip multicast", setIP("ip", "224.0.0.1"), nic + ".ip_config.value.ip", "224.0.0.1 is a multicast address", 0},
		{"v4 NIC ip unspecified", setIP("ip", "0.0.0.0"), nic + ".ip_config.value.ip", "is the unspecified address", 0},
		{"v4 NIC ip broadcast", setIP("ip", "255.255.255.255"), nic + ".ip_config.value.ip", "is the broadcast address", 0},
		{"v4 NIC ip loopback", setIP("ip", "127.0.0.1"), nic + ".ip_config.value.ip", "is a loopback address", 0},
		{"v4 NIC ip link-local", setIP("ip", "169.254.0.9"), nic + ".ip_config.value.ip", "is a link-local address", 0},
		{"v4 NIC ip the subnet's broadcast", setIP("ip", "172.30.2.255"), nic + ".ip_config.value.ip", "172.30.2.255 is the broadcast address of subnet 172.30.2.0/24", 0},
		{"v6 NIC ip multicast", func(t *testing.T, doc map[string]any) {
			setIPConfig(doc, nexusID, "v6", map[string]any{"ip": "ff02::9", "subnet": "fdb0::/64", "transit_ips": []any{}})
		}, nic + ".ip_config.value.ip", "ff02::9 is a multicast address", 0},
		{"v6 NIC ip link-local", func(t *testing.T, doc map[string]any) {
			setIPConfig(doc, nexusID, "v6", map[string]any{"ip": "fe80::9", "subnet": "fe80::/64", "transit_ips": []any{}})
		}, nic + ".ip_config.value.ip", "is a link-local address", 0},
		{"dual_stack v6 loopback", func(t *testing.T, doc map[string]any) {
			ipValue(doc, boundaryNTPID)["v6"].(map[string]any)["ip"] = "::1"
		}, zp(boundaryNTPID) + ".zone_type.nic.ip_config.value.v6.ip", "is a loopback address", 0},

		// Generations upstream cannot hold.
		{"generation above upstream's largest", func(t *testing.T, doc map[string]any) { doc["generation"] = json.Number("9223372036854775808") },
			"generation", "9223372036854775808 is larger than the largest generation, 9223372036854775807", 0},
		{"largest uint64 generation", func(t *testing.T, doc map[string]any) { doc["generation"] = json.Number("18446744073709551615") },
			"generation", "is larger than the largest generation", 0},

		// Disks, datasets and the document.
		{"disk id differs from key", func(t *testing.T, doc map[string]any) {
			doc["disks"].(map[string]any)[exampleDiskID].(map[string]any)["id"] = unusedZoneUUID
		}, `disks["` + exampleDiskID + `"].id`, `"` + unusedZoneUUID + `" does not match its key`, 0},
		{"disk without id", func(t *testing.T, doc map[string]any) {
			delete(doc["disks"].(map[string]any)[exampleDiskID].(map[string]any), "id")
		}, `disks["` + exampleDiskID + `"].id`, "is required", 0},
		{"disk not an object", func(t *testing.T, doc map[string]any) {
			doc["disks"].(map[string]any)[exampleDiskID] = json.Number("5")
		}, `disks["` + exampleDiskID + `"]`, "is not a JSON object", 0},
		{"dataset id differs from key", func(t *testing.T, doc map[string]any) {
			doc["datasets"].(map[string]any)[exampleDsetID].(map[string]any)["id"] = unusedZoneUUID
		}, `datasets["` + exampleDsetID + `"].id`, "does not match its key", 0},
		{"dataset id a number", func(t *testing.T, doc map[string]any) {
			doc["datasets"].(map[string]any)[exampleDsetID].(map[string]any)["id"] = json.Number("7")
		}, `datasets["` + exampleDsetID + `"].id`, "7 is not a string", 0},
		{"no zones", func(t *testing.T, doc map[string]any) { delete(doc, "zones") }, "zones", "is required", 0},
		{"null measurements", func(t *testing.T, doc map[string]any) { doc["measurements"] = nil }, "measurements", "is required", 0},
		{"no generation", func(t *testing.T, doc map[string]any) { delete(doc, "generation") }, "generation", "is required", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := fullDoc(t)
			tc.change(t, doc)
			cfg, err := Parse(encode(t, doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = Validate(cfg)
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			want := max(tc.problems, 1)
			if len(verr.Problems) != want {
				t.Errorf("%d problems, want %d: %v", len(verr.Problems), want, err)
			}
			found := false
			for _, p := range verr.Problems {
				if p.Path == tc.path && strings.Contains(p.Message, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("no problem at %s saying %q in: %v", tc.path, tc.msg, err)
			}
			if !strings.Contains(err.Error(), tc.path+": ") {
				t.Errorf("Error() does not name %s: %v", tc.path, err)
			}
		})
	}
}
