package sledconfig

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// edit is a change to a decoded document.
type edit func(doc map[string]any)

// at returns the object at a path of member names below doc.
func at(doc map[string]any, path ...string) map[string]any {
	for _, p := range path {
		doc = doc[p].(map[string]any)
	}
	return doc
}

// stripNulls removes every member whose value is null, at every depth: what
// a generated client sends for optional members it has no value for.
func stripNulls(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if x == nil {
				delete(v, k)
				continue
			}
			stripNulls(x)
		}
	case []any:
		for _, x := range v {
			stripNulls(x)
		}
	}
}

func nexusType(doc map[string]any) map[string]any {
	return at(doc, "zones", nexusID, "zone_type")
}

func nexusV4(doc map[string]any) map[string]any {
	return at(nexusType(doc), "nic", "ip_config", "value")
}

const (
	hashA = "8234c10964ef7f62880772caaf96f449234bad8428b2a6a09e623d383550bfdf"
	hashB = "1ae3b88364f311ce588ac802cb8177c4806b76da0ce42e39aab0b0d8bb04c197"
)

func measurements(hashes ...string) []any {
	out := []any{}
	for _, h := range hashes {
		out = append(out, map[string]any{"hash": h})
	}
	return out
}

// sameMeaningCases are pairs of edits of the example config that upstream
// decodes to equal values, and pairs it does not.
var sameMeaningCases = []struct {
	name string
	a, b edit
	same bool
}{
	{"nulls left out", nil, func(d map[string]any) { stripNulls(d) }, true},
	{"remove_mupdate_override left out", nil, func(d map[string]any) { delete(d, "remove_mupdate_override") }, true},
	{"filesystem_pool left out", nil, func(d map[string]any) { delete(at(d, "zones", crucibleID), "filesystem_pool") }, false},
	{"null filesystem_pool left out",
		func(d map[string]any) { at(d, "zones", crucibleID)["filesystem_pool"] = nil },
		func(d map[string]any) { delete(at(d, "zones", crucibleID), "filesystem_pool") }, true},
	{"dataset quota left out", nil, func(d map[string]any) { delete(at(d, "datasets", exampleDsetID), "quota") }, true},
	{"image_source left out is install_dataset",
		func(d map[string]any) {
			at(d, "zones", crucibleID)["image_source"] = map[string]any{"type": "install_dataset"}
		},
		func(d map[string]any) { delete(at(d, "zones", crucibleID), "image_source") }, true},
	{"host_phase_2 left out is current contents",
		func(d map[string]any) {
			d["host_phase_2"] = map[string]any{"slot_a": map[string]any{"type": "current_contents"}, "slot_b": map[string]any{"type": "current_contents"}}
		},
		func(d map[string]any) { delete(d, "host_phase_2") }, true},
	{"lockstep_port left out is 12232", nil, func(d map[string]any) { delete(nexusType(d), "lockstep_port") }, true},
	{"v4 transit_ips left out is empty", nil, func(d map[string]any) { delete(nexusV4(d), "transit_ips") }, true},
	{"measurements in another order, repeated",
		func(d map[string]any) { d["measurements"] = measurements(hashA, hashB) },
		func(d map[string]any) { d["measurements"] = measurements(hashB, hashA, hashB) }, true},
	{"letter case of UUIDs, hashes and MACs",
		nil,
		func(d map[string]any) {
			z := at(d, "zones", nexusID)
			z["image_source"].(map[string]any)["hash"] = "1AE3B88364F311CE588AC802CB8177C4806B76DA0CE42E39AAB0B0D8BB04C197"
			nic := at(z, "zone_type", "nic")
			nic["mac"] = "a8:40:25:ff:80:05"
			nic["id"] = "98D2E08E-A3A6-43ED-A2A0-7CF52FD211F8"
			delete(d["zones"].(map[string]any), nexusID)
			z["id"] = "470FBF4D-0178-45EE-A422-136FA5F4A158"
			d["zones"].(map[string]any)["470FBF4D-0178-45EE-A422-136FA5F4A158"] = z
		}, true},
	{"IPv6 written out in full",
		nil,
		func(d map[string]any) {
			nexusType(d)["internal_address"] = "[fd00:1122:3344:103:0:0:0:47]:12221"
			at(d, "zones", internalNTPID, "zone_type")["address"] = "[FD00:1122:3344:103::45]:123"
		}, true},

	{"dataset reservation left out", nil, func(d map[string]any) { delete(at(d, "datasets", exampleDebugID), "reservation") }, true},
	{"letter case of disk and dataset ids",
		nil,
		func(d map[string]any) {
			disks, datasets := d["disks"].(map[string]any), d["datasets"].(map[string]any)
			disk := at(d, "disks", exampleDiskID)
			delete(disks, exampleDiskID)
			disk["id"] = strings.ToUpper(exampleDiskID)
			disk["pool_id"] = "6340805E-C5AF-418D-8BD1-FC0085667F33"
			disks[strings.ToUpper(exampleDiskID)] = disk
			ds := at(d, "datasets", exampleDebugID)
			delete(datasets, exampleDebugID)
			ds["id"] = strings.ToUpper(exampleDebugID)
			datasets[strings.ToUpper(exampleDebugID)] = ds
		}, true},
	{"another disk serial", nil, func(d map[string]any) { at(d, "disks", exampleDiskID, "identity")["serial"] = "A084A5E4" }, false},
	{"another pool for a disk", nil, func(d map[string]any) { at(d, "disks", exampleDiskID)["pool_id"] = unusedZoneUUID }, false},
	{"another dataset kind", nil, func(d map[string]any) {
		at(d, "datasets", exampleLocalID, "name")["kind"] = "local_storage_unencrypted"
	}, false},
	{"another gzip level", nil, func(d map[string]any) { at(d, "datasets", exampleDebugID, "compression")["level"] = json.Number("8") }, false},
	{"a level on compression off", nil, func(d map[string]any) { at(d, "datasets", exampleDsetID, "compression")["level"] = json.Number("8") }, false},
	{"a reservation", nil, func(d map[string]any) { at(d, "datasets", exampleDebugID)["reservation"] = json.Number("1") }, false},
	{"lockstep_port other than the default", nil, func(d map[string]any) { nexusType(d)["lockstep_port"] = json.Number("12233") }, false},
	{"image_source left out is not an artifact", nil, func(d map[string]any) { delete(at(d, "zones", crucibleID), "image_source") }, false},
	{"host_phase_2 left out is not an artifact", nil, func(d map[string]any) { delete(d, "host_phase_2") }, false},
	{"remove_mupdate_override set", nil, func(d map[string]any) { d["remove_mupdate_override"] = unusedZoneUUID }, false},
	{"another measurement",
		func(d map[string]any) { d["measurements"] = measurements(hashA) },
		func(d map[string]any) { d["measurements"] = measurements(hashA, hashB) }, false},
	{"external DNS servers in another order", nil, func(d map[string]any) {
		nexusType(d)["external_dns_servers"] = []any{"9.9.9.9", "1.1.1.1"}
	}, false},
	{"a quota", nil, func(d map[string]any) { at(d, "datasets", exampleDsetID)["quota"] = json.Number("0") }, false},
	{"transit IPs", nil, func(d map[string]any) { nexusV4(d)["transit_ips"] = []any{"10.0.0.0/8"} }, false},
	{"another address", nil, func(d map[string]any) { nexusType(d)["internal_address"] = "[fd00:1122:3344:103::48]:12221" }, false},
	{"a member upstream does not know", nil, func(d map[string]any) { d["future"] = json.Number("1") }, false},
	{"a null member upstream does not know", nil, func(d map[string]any) { d["future"] = nil }, false},
	{"lockstep_port on a zone type without one", nil, func(d map[string]any) {
		at(d, "zones", internalNTPID, "zone_type")["lockstep_port"] = json.Number("12232")
	}, false},
}

func editedExample(t *testing.T, e edit) *Config {
	t.Helper()
	doc := exampleDoc(t)
	if e != nil {
		e(doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return cfg
}

func TestSameMeaning(t *testing.T) {
	for _, c := range sameMeaningCases {
		t.Run(c.name, func(t *testing.T) {
			a, b := editedExample(t, c.a), editedExample(t, c.b)
			if a.SameContent(b) {
				t.Fatal("the edit changed nothing")
			}
			if got := a.SameMeaning(b); got != c.same {
				t.Errorf("SameMeaning = %v, want %v\n a: %s\n b: %s", got, c.same, a.Canonical(), b.Canonical())
			}
			if got := b.SameMeaning(a); got != c.same {
				t.Errorf("SameMeaning the other way = %v, want %v", got, c.same)
			}
		})
	}
}

// The example as the upstream document has it, with nulls left out, means
// what it means with them.
func TestSameMeaningOfTheUpstreamExample(t *testing.T) {
	raw, err := os.ReadFile(upstreamExampleFile)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	b := editedExample(t, func(d map[string]any) { stripNulls(d) })
	if !a.SameMeaning(b) {
		t.Fatal("the example with nulls left out does not mean the same")
	}
}
