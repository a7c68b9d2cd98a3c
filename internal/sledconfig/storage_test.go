package sledconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// Disks and datasets of the example config.
const (
	examplePoolID   = "7b24095a-72df-45e3-984f-2b795e052ac7" // crucibleID's pool
	exampleDisk2ID  = "883b970b-2b70-4771-bb0e-aed2765c3e6a"
	exampleRootID   = "01ffd316-ea25-4287-95aa-01bf6b036a16" // zone/oxz_crucible_<crucibleID>
	exampleDebugID  = "2c260613-a7bc-401e-ab73-cde4069ef09a" // gzip_n 9, quota 100 GiB
	exampleZoneID   = "5171b6ba-b282-4e71-917e-f253c7b2eb22" // zone
	exampleLocalID  = "c5e4bd8a-d323-48ec-a641-5c7dbecf3252" // local_storage
	unusedDatasetID = "d0000000-0000-4000-8000-00000000000d"
)

func diskOf(doc map[string]any, id string) map[string]any {
	return doc["disks"].(map[string]any)[id].(map[string]any)
}

func datasetOf(doc map[string]any, id string) map[string]any {
	return doc["datasets"].(map[string]any)[id].(map[string]any)
}

func datasetNameOf(doc map[string]any, id string) map[string]any {
	return datasetOf(doc, id)["name"].(map[string]any)
}

// addDataset adds a copy of dataset from under key, with id key and the
// changes in set.
func addDataset(t *testing.T, doc map[string]any, from, key string, set map[string]any) {
	t.Helper()
	d := decodeAny(t, encode(t, datasetOf(doc, from))).(map[string]any)
	d["id"] = key
	for k, v := range set {
		d[k] = v
	}
	doc["datasets"].(map[string]any)[key] = d
}

func TestStorageOfExample(t *testing.T) {
	data := exampleBytes(t)
	cfg, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(cfg); err != nil {
		t.Fatal(err)
	}
	want, err := Canonicalize(data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cfg.Canonical(), want) {
		t.Error("Canonical() is not the canonical form of the document parsed")
	}

	disks := cfg.StorageDisks()
	if len(disks) != 10 {
		t.Fatalf("%d disks, want 10", len(disks))
	}
	if !slices.IsSortedFunc(disks, func(a, b storage.DiskConfig) int { return strings.Compare(a.ID, b.ID) }) {
		t.Error("disks not sorted by id")
	}
	wantDisk := storage.DiskConfig{
		ID:       exampleDiskID,
		Identity: storage.DiskIdentity{Vendor: "1b96", Model: "WUS4C6432DSP3X3", Serial: "A084A5E3"},
		PoolID:   "6340805e-c5af-418d-8bd1-fc0085667f33",
	}
	if disks[0] != wantDisk {
		t.Errorf("first disk %+v, want %+v", disks[0], wantDisk)
	}

	datasets := cfg.StorageDatasets()
	if len(datasets) != 54 {
		t.Fatalf("%d datasets, want 54", len(datasets))
	}
	if !slices.IsSortedFunc(datasets, func(a, b storage.DatasetConfig) int { return strings.Compare(a.ID, b.ID) }) {
		t.Error("datasets not sorted by id")
	}
	byID := map[string]storage.DatasetConfig{}
	for _, d := range datasets {
		byID[d.ID] = d
	}
	for _, tc := range []struct{ id, name string }{
		{exampleDsetID, "oxp_" + examplePoolID + "/crucible"},
		{exampleRootID, "oxp_" + examplePoolID + "/crypt/zone/oxz_crucible_" + crucibleID},
		{exampleZoneID, "oxp_" + examplePoolID + "/crypt/zone"},
		{exampleDebugID, "oxp_" + examplePoolID + "/crypt/debug"},
		{exampleLocalID, "oxp_" + examplePoolID + "/crypt/local_storage"},
	} {
		if got := byID[tc.id].Name(); got != tc.name {
			t.Errorf("dataset %s is named %q, want %q", tc.id, got, tc.name)
		}
		if got := cfg.DatasetConfigs()[tc.id].Name.String(); got != tc.name {
			t.Errorf("DatasetName of %s is %q, want %q", tc.id, got, tc.name)
		}
	}
	debug := byID[exampleDebugID]
	if debug.Compression != (storage.Compression{Type: "gzip_n", Level: 9}) || debug.Quota == nil || *debug.Quota != 100<<30 || debug.Reservation != nil {
		t.Errorf("debug dataset %+v, want gzip_n 9, a quota of 100 GiB and no reservation", debug)
	}
	if c := byID[exampleDsetID]; c.Compression != (storage.Compression{Type: "off"}) || c.Quota != nil {
		t.Errorf("crucible dataset %+v, want compression off and no quota", c)
	}

	// Every zone of the example has its storage.
	for id, z := range cfg.Zones {
		if missing := cfg.MissingZoneDatasets(z); len(missing) != 0 {
			t.Errorf("zone %s lacks %v", id, missing)
		}
	}
	// Parsing changed nothing.
	again, err := Parse(cfg.Canonical())
	if err != nil || !bytes.Equal(again.Canonical(), cfg.Canonical()) {
		t.Errorf("the canonical document does not parse back to itself: %v", err)
	}
}

func TestStorageOfConfigBuiltInCode(t *testing.T) {
	c := Config{
		Disks: map[string]json.RawMessage{
			"B0000000-0000-4000-8000-00000000000B": json.RawMessage(`{"id": "B0000000-0000-4000-8000-00000000000B",
				"identity": {"vendor": "v", "model": "m", "serial": "s2"}, "pool_id": "E0000000-0000-4000-8000-00000000000E"}`),
			"a0000000-0000-4000-8000-00000000000a": json.RawMessage(`{"id": "a0000000-0000-4000-8000-00000000000a",
				"identity": {"vendor": "v", "model": "m", "serial": "s1"}, "pool_id": "f0000000-0000-4000-8000-00000000000f"}`),
		},
		Datasets: map[string]json.RawMessage{
			unusedDatasetID: json.RawMessage(`{"id": "` + unusedDatasetID + `",
				"name": {"pool_name": "oxp_f0000000-0000-4000-8000-00000000000f", "kind": "local_storage_unencrypted"},
				"compression": {"type": "lz4"}, "reservation": 1024}`),
		},
	}
	if err := Validate(&c); err != nil {
		t.Fatal(err)
	}
	disks := c.StorageDisks()
	if len(disks) != 2 || disks[0].ID != "a0000000-0000-4000-8000-00000000000a" ||
		disks[1].ID != "b0000000-0000-4000-8000-00000000000b" || disks[1].PoolID != "e0000000-0000-4000-8000-00000000000e" {
		t.Errorf("disks %+v, want a0… then b0… (ids in lower case)", disks)
	}
	ds := c.StorageDatasets()
	if len(ds) != 1 || ds[0].Name() != "oxp_f0000000-0000-4000-8000-00000000000f/local_storage_unencrypted" ||
		ds[0].Reservation == nil || *ds[0].Reservation != 1024 || ds[0].Quota != nil || ds[0].Compression.Type != "lz4" {
		t.Errorf("datasets %+v", ds)
	}
}

func TestStorageSkipsWhatCannotBeNamed(t *testing.T) {
	// A config that fails validation (one ledgered by an agent with fewer
	// rules, say) never passes on a dataset whose name is not safe.
	doc := exampleDoc(t)
	addDataset(t, doc, exampleRootID, unusedDatasetID, map[string]any{
		"name": map[string]any{"pool_name": "oxp_" + examplePoolID, "kind": "zone/../../etc"}})
	cfg, err := Parse(encode(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	if Validate(cfg) == nil {
		t.Fatal("Validate accepted zone/../../etc")
	}
	for _, d := range cfg.StorageDatasets() {
		if d.ID == unusedDatasetID {
			t.Errorf("StorageDatasets passed on %+v", d)
		}
	}
	if len(cfg.StorageDatasets()) != 54 {
		t.Errorf("%d datasets, want the example's 54", len(cfg.StorageDatasets()))
	}
}

func TestZoneDatasets(t *testing.T) {
	doc := fullDoc(t)
	delete(doc["datasets"].(map[string]any), exampleRootID)
	delete(doc["datasets"].(map[string]any), exampleDsetID)
	cfg, err := Parse(encode(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	// Accepted, as upstream's sled agent accepts it; the zone fails later.
	if err := Validate(cfg); err != nil {
		t.Fatalf("a zone without its datasets: %v", err)
	}
	pool := "oxp_" + examplePoolID
	want := []DatasetName{{pool, "zone/oxz_crucible_" + crucibleID}, {pool, "crucible"}}
	if got := cfg.MissingZoneDatasets(cfg.Zones[crucibleID]); !slices.Equal(got, want) {
		t.Errorf("MissingZoneDatasets = %v, want %v", got, want)
	}
	if got := cfg.MissingZoneDatasets(cfg.Zones[crucible2ID]); len(got) != 0 {
		t.Errorf("MissingZoneDatasets of another crucible = %v", got)
	}
	for _, tc := range []struct {
		zone          string
		root, durable string // "" for none
	}{
		{nexusID, examplePool + "/crypt/zone/oxz_nexus_" + nexusID, ""},
		{internalNTPID, examplePool + "/crypt/zone/oxz_ntp_" + internalNTPID, ""},
		{externalDNSID, examplePool + "/crypt/zone/oxz_external_dns_" + externalDNSID, examplePool + "/crypt/external_dns"},
		{internalDNSID, "", examplePool + "/crypt/internal_dns"}, // no filesystem_pool
		{cockroachID, "", examplePool + "/crypt/cockroachdb"},
		{keeperID, "", examplePool + "/crypt/clickhouse_keeper"},
		{crucible2ID, "oxp_26e698bb-006d-4208-94b9-d1bc279111fa/crypt/zone/oxz_crucible_" + crucible2ID, "oxp_26e698bb-006d-4208-94b9-d1bc279111fa/crucible"},
	} {
		z := cfg.Zones[tc.zone]
		root, ok := z.RootDataset()
		if got := root.String(); ok != (tc.root != "") || ok && got != tc.root {
			t.Errorf("zone %s: RootDataset = %q, %v; want %q", tc.zone, got, ok, tc.root)
		}
		durable, ok := z.DurableDataset()
		if got := durable.String(); ok != (tc.durable != "") || ok && got != tc.durable {
			t.Errorf("zone %s: DurableDataset = %q, %v; want %q", tc.zone, got, ok, tc.durable)
		}
	}
}

func TestValidateStorageAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, doc map[string]any)
	}{
		{"a dataset on a pool no disk carries", func(t *testing.T, doc map[string]any) {
			delete(doc["disks"].(map[string]any), "9272fa96-eef8-43ed-8658-12ccf722bec2") // examplePoolID's disk
		}},
		{"every compression algorithm", func(t *testing.T, doc map[string]any) {
			for i, c := range []map[string]any{
				{"type": "on"}, {"type": "off"}, {"type": "gzip"}, {"type": "gzip_n", "level": json.Number("1")},
				{"type": "lz4"}, {"type": "lzjb"}, {"type": "zle"}, {"type": "off", "level": json.Number("3")},
			} {
				key := fmt.Sprintf("d000000%d-0000-4000-8000-00000000000d", i)
				addDataset(t, doc, exampleDebugID, key, map[string]any{"compression": c,
					"name": map[string]any{"pool_name": fmt.Sprintf("oxp_%08x-1111-4111-8111-%012x", i, i), "kind": "debug"}})
			}
		}},
		{"reservation equal to quota", func(t *testing.T, doc map[string]any) {
			datasetOf(doc, exampleDebugID)["reservation"] = json.Number("107374182400")
		}},
		{"reservation without quota", func(t *testing.T, doc map[string]any) {
			datasetOf(doc, exampleDsetID)["reservation"] = json.Number("1")
		}},
		{"largest byte count", func(t *testing.T, doc map[string]any) {
			datasetOf(doc, exampleDsetID)["quota"] = json.Number("9223372036854775807")
		}},
		{"quota and reservation left out", func(t *testing.T, doc map[string]any) {
			delete(datasetOf(doc, exampleDsetID), "quota")
			delete(datasetOf(doc, exampleDsetID), "reservation")
		}},
		{"local_storage_unencrypted", func(t *testing.T, doc map[string]any) {
			datasetNameOf(doc, exampleLocalID)["kind"] = "local_storage_unencrypted"
		}},
		{"two transient roots of one zone name on two pools", func(t *testing.T, doc map[string]any) {
			addDataset(t, doc, exampleRootID, unusedDatasetID, map[string]any{
				"name": map[string]any{"pool_name": examplePool, "kind": "zone/oxz_crucible_" + crucibleID}})
		}},
		{"a zone root of a zone not in the config", func(t *testing.T, doc map[string]any) {
			datasetNameOf(doc, exampleRootID)["kind"] = "zone/oxz_crucible_pantry_" + unusedZoneUUID
		}},
		{"upper-case ids", func(t *testing.T, doc map[string]any) {
			up := strings.ToUpper(exampleDsetID)
			d := datasetOf(doc, exampleDsetID)
			delete(doc["datasets"].(map[string]any), exampleDsetID)
			d["id"] = up
			doc["datasets"].(map[string]any)[up] = d
			diskOf(doc, exampleDiskID)["pool_id"] = "6340805E-C5AF-418D-8BD1-FC0085667F33"
		}},
		{"unknown members", func(t *testing.T, doc map[string]any) {
			datasetOf(doc, exampleDsetID)["future"] = "x"
			datasetNameOf(doc, exampleDsetID)["future"] = "x"
			diskOf(doc, exampleDiskID)["identity"].(map[string]any)["future"] = "x"
		}},
		{"no disks or datasets", func(t *testing.T, doc map[string]any) {
			doc["disks"], doc["datasets"] = map[string]any{}, map[string]any{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := exampleDoc(t)
			tc.change(t, doc)
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

func TestValidateStorageRejects(t *testing.T) {
	type change = func(t *testing.T, doc map[string]any)
	disk := func(field string, v any) change {
		return func(t *testing.T, doc map[string]any) { diskOf(doc, exampleDiskID)[field] = v }
	}
	delDisk := func(field string) change {
		return func(t *testing.T, doc map[string]any) { delete(diskOf(doc, exampleDiskID), field) }
	}
	identity := func(field string, v any) change {
		return func(t *testing.T, doc map[string]any) {
			id := diskOf(doc, exampleDiskID)["identity"].(map[string]any)
			if v == nil {
				delete(id, field)
				return
			}
			id[field] = v
		}
	}
	dset := func(id, field string, v any) change {
		return func(t *testing.T, doc map[string]any) { datasetOf(doc, id)[field] = v }
	}
	delDset := func(id, field string) change {
		return func(t *testing.T, doc map[string]any) { delete(datasetOf(doc, id), field) }
	}
	name := func(id, field string, v any) change {
		return func(t *testing.T, doc map[string]any) {
			if v == nil {
				delete(datasetNameOf(doc, id), field)
				return
			}
			datasetNameOf(doc, id)[field] = v
		}
	}
	gzip := func(level any) change {
		return dset(exampleDebugID, "compression", map[string]any{"type": "gzip_n", "level": level})
	}
	dp := `disks["` + exampleDiskID + `"]`
	dsp := func(id string) string { return `datasets["` + id + `"]` }
	upperDisk := strings.ToUpper(exampleDiskID)
	upperDset := strings.ToUpper(exampleDsetID)

	for _, tc := range []struct {
		name       string
		change     change
		path       string // of the problem
		msg        string // in its message
		problems   int    // how many problems in all, if not 1
		wellFormed bool   // upstream decodes it: a config ledgered with it loads
	}{
		// Disks.
		{"disk id not a UUID", func(t *testing.T, doc map[string]any) {
			d := diskOf(doc, exampleDiskID)
			d["id"] = "disk-1"
			doc["disks"].(map[string]any)["disk-1"] = d
			delete(doc["disks"].(map[string]any), exampleDiskID)
		}, `disks["disk-1"].id`, `"disk-1" is not a UUID`, 0, false},
		{"disk with null id", disk("id", nil), dp + ".id", "is required", 0, false},
		{"disk without identity", delDisk("identity"), dp + ".identity", "is required", 0, false},
		{"disk with null identity", disk("identity", nil), dp + ".identity", "is required", 0, false},
		{"disk identity a string", disk("identity", "1b96/WUS4C6432DSP3X3/A084A5E3"), dp + ".identity", `"1b96/WUS4C6432DSP3X3/A084A5E3" is not an object`, 0, false},
		{"disk without serial", identity("serial", nil), dp + ".identity.serial", "is required", 0, false},
		{"disk serial a number", identity("serial", json.Number("5")), dp + ".identity.serial", "5 is not a string", 0, false},
		{"disk vendor empty", identity("vendor", ""), dp + ".identity.vendor", "is empty; a disk is found by its vendor, model and serial", 0, true},
		{"disk without pool_id", delDisk("pool_id"), dp + ".pool_id", "is required", 0, false},
		{"disk pool_id not a UUID", disk("pool_id", "oxp_6340805e-c5af-418d-8bd1-fc0085667f33"), dp + ".pool_id", "is not a UUID", 0, false},
		{"disk pool_id a number", disk("pool_id", json.Number("7")), dp + ".pool_id", "7 is not a string", 0, false},
		{"disk field in the wrong case", func(t *testing.T, doc map[string]any) {
			d := diskOf(doc, exampleDiskID)
			d["Pool_Id"] = d["pool_id"]
			delete(d, "pool_id")
		}, dp + ".Pool_Id", `unknown field; field names are case-sensitive (did you mean "pool_id"?)`, 2, false},
		{"two disks with one identity", func(t *testing.T, doc map[string]any) {
			diskOf(doc, exampleDisk2ID)["identity"] = diskOf(doc, exampleDiskID)["identity"]
		}, `disks["` + exampleDisk2ID + `"].identity`, `1b96/WUS4C6432DSP3X3/A084A5E3 is also the identity of disk "` + exampleDiskID + `"`, 0, true},
		{"two disks with one pool", func(t *testing.T, doc map[string]any) {
			diskOf(doc, exampleDisk2ID)["pool_id"] = "6340805E-C5AF-418D-8BD1-FC0085667F33"
		}, `disks["` + exampleDisk2ID + `"].pool_id`, `pool 6340805e-c5af-418d-8bd1-fc0085667f33 is also the pool of disk "` + exampleDiskID + `"`, 0, true},
		{"disk ids differ only in case", func(t *testing.T, doc map[string]any) {
			d := decodeAny(t, encode(t, diskOf(doc, exampleDiskID))).(map[string]any)
			d["id"] = upperDisk
			d["identity"].(map[string]any)["serial"] = "other"
			d["pool_id"] = unusedZoneUUID
			doc["disks"].(map[string]any)[upperDisk] = d
		}, dp, `disk id differs from disk "` + upperDisk + `" only in letter case`, 0, false},

		// Dataset names.
		{"dataset without name", delDset(exampleDsetID, "name"), dsp(exampleDsetID) + ".name", "is required", 0, false},
		{"dataset name a string", dset(exampleDsetID, "name", "oxp_"+examplePoolID+"/crucible"), dsp(exampleDsetID) + ".name", `"oxp_` + examplePoolID + `/crucible" is not an object`, 0, false},
		{"dataset without pool_name", name(exampleDsetID, "pool_name", nil), dsp(exampleDsetID) + ".name.pool_name", "is required", 0, false},
		{"dataset pool_name a bare UUID", name(exampleDsetID, "pool_name", examplePoolID), dsp(exampleDsetID) + ".name.pool_name", "is not a zpool name like oxp_<uuid>", 0, false},
		{"dataset pool_name upper case", name(exampleDsetID, "pool_name", "oxp_"+strings.ToUpper(examplePoolID)), dsp(exampleDsetID) + ".name.pool_name", "is not a zpool name", 0, false},
		{"dataset on an internal pool", name(exampleDsetID, "pool_name", "oxi_"+examplePoolID), dsp(exampleDsetID) + ".name.pool_name", "is an internal pool", 0, true},
		{"dataset without kind", name(exampleDsetID, "kind", nil), dsp(exampleDsetID) + ".name.kind", "is required", 0, false},
		{"unknown kind", name(exampleDsetID, "kind", "crucible_v2"), dsp(exampleDsetID) + ".name.kind", `"crucible_v2" is not a dataset kind (want one of clickhouse, clickhouse_keeper,`, 0, false},
		{"kind with crypt/", name(exampleDebugID, "kind", "crypt/debug"), dsp(exampleDebugID) + ".name.kind", "is not a dataset kind", 0, false},
		{"kind in upper case", name(exampleDebugID, "kind", "Debug"), dsp(exampleDebugID) + ".name.kind", "is not a dataset kind", 0, false},
		{"zone/ without a name", name(exampleRootID, "kind", "zone/"), dsp(exampleRootID) + ".name.kind", "the name after zone/ must be a zone name", 0, false},
		{"zone/ with a path", name(exampleRootID, "kind", "zone/../../etc"), dsp(exampleRootID) + ".name.kind", "must be a zone name", 0, false},
		{"zone/ with an upper-case id", name(exampleRootID, "kind", "zone/oxz_crucible_"+strings.ToUpper(crucibleID)), dsp(exampleRootID) + ".name.kind", "must be a zone name", 0, false},
		{"zone/ with an unknown zone kind", name(exampleRootID, "kind", "zone/oxz_propolis_"+crucibleID), dsp(exampleRootID) + ".name.kind", "must be a zone name", 0, false},
		{"two crucible datasets on one pool", func(t *testing.T, doc map[string]any) {
			addDataset(t, doc, exampleDsetID, unusedDatasetID, nil)
		}, dsp(unusedDatasetID) + ".name", `pool oxp_` + examplePoolID + ` already has a crucible dataset, "` + exampleDsetID + `": a pool holds at most one durable dataset of a kind`, 0, true},
		{"two debug datasets on one pool", func(t *testing.T, doc map[string]any) {
			addDataset(t, doc, exampleDebugID, unusedDatasetID, nil)
		}, dsp(unusedDatasetID) + ".name", `oxp_` + examplePoolID + `/crypt/debug is also the name of dataset "` + exampleDebugID + `"`, 0, true},
		{"dataset ids differ only in case", func(t *testing.T, doc map[string]any) {
			addDataset(t, doc, exampleDsetID, upperDset, map[string]any{
				"name": map[string]any{"pool_name": "oxp_" + unusedZoneUUID, "kind": "crucible"}})
		}, dsp(exampleDsetID), `dataset id differs from dataset "` + upperDset + `" only in letter case`, 0, false},
		{"dataset id not a UUID", func(t *testing.T, doc map[string]any) {
			addDataset(t, doc, exampleDebugID, "debug", map[string]any{
				"name": map[string]any{"pool_name": "oxp_" + unusedZoneUUID, "kind": "debug"}})
		}, dsp("debug") + ".id", `"debug" is not a UUID`, 0, false},

		// Compression.
		{"dataset without compression", delDset(exampleDsetID, "compression"), dsp(exampleDsetID) + ".compression", "is required", 0, false},
		{"compression without type", dset(exampleDsetID, "compression", map[string]any{}), dsp(exampleDsetID) + ".compression.type", "is required", 0, false},
		{"compression a string", dset(exampleDsetID, "compression", "off"), dsp(exampleDsetID) + ".compression", `"off" is not an object`, 0, false},
		{"unknown compression", dset(exampleDsetID, "compression", map[string]any{"type": "zstd"}), dsp(exampleDsetID) + ".compression.type", `unknown compression algorithm "zstd" (want one of on, off, gzip, gzip_n, lz4, lzjb, zle)`, 0, false},
		{"gzip_n without level", dset(exampleDebugID, "compression", map[string]any{"type": "gzip_n"}), dsp(exampleDebugID) + ".compression.level", "is required for compression type gzip_n", 0, false},
		{"gzip level 0", gzip(json.Number("0")), dsp(exampleDebugID) + ".compression.level", "0 is not a gzip level, 1 to 9", 0, true},
		{"gzip level 10", gzip(json.Number("10")), dsp(exampleDebugID) + ".compression.level", "10 is not a gzip level", 0, true},
		{"gzip level 300", gzip(json.Number("300")), dsp(exampleDebugID) + ".compression.level", "300 is not an integer from 0 to 255", 0, false},
		{"gzip level a string", gzip("9"), dsp(exampleDebugID) + ".compression.level", `"9" is not an integer from 0 to 255`, 0, false},

		// Quota and reservation.
		{"quota a string", dset(exampleDebugID, "quota", "100G"), dsp(exampleDebugID) + ".quota", `"100G" is not an integer from 0 to 18446744073709551615`, 0, false},
		{"quota negative", dset(exampleDebugID, "quota", json.Number("-1")), dsp(exampleDebugID) + ".quota", "-1 is not an integer", 0, false},
		{"quota a fraction", dset(exampleDebugID, "quota", json.Number("1.5")), dsp(exampleDebugID) + ".quota", "1.5 is not an integer", 0, false},
		{"quota above upstream's largest", dset(exampleDebugID, "quota", json.Number("9223372036854775808")), dsp(exampleDebugID) + ".quota",
			"9223372036854775808 is larger than the largest byte count, 9223372036854775807", 0, false},
		{"reservation above upstream's largest", dset(exampleDsetID, "reservation", json.Number("18446744073709551615")), dsp(exampleDsetID) + ".reservation",
			"is larger than the largest byte count", 0, false},
		{"reservation above the quota", dset(exampleDebugID, "reservation", json.Number("107374182401")), dsp(exampleDebugID) + ".reservation",
			"107374182401 is more than the quota, 107374182400", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := exampleDoc(t)
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
			if want := max(tc.problems, 1); len(verr.Problems) != want {
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
			if verr.WellFormed() != tc.wellFormed {
				t.Errorf("WellFormed() = %v, want %v", verr.WellFormed(), tc.wellFormed)
			}
		})
	}
}
