package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// fakeStorage is a storage reconciler whose status the test sets.
type fakeStorage struct {
	mu sync.Mutex
	st storage.Status
	// copies counts the calls of Status.
	copies int
}

func (f *fakeStorage) Status() storage.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.copies++
	return f.st
}

func (f *fakeStorage) statusCopies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.copies
}

func (f *fakeStorage) Version() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Version
}

func (f *fakeStorage) set(st storage.Status) {
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
}

const (
	diskA    = "5f0c2e1a-7a4b-4c1e-9d3f-0a1b2c3d4e01"
	diskB    = "5f0c2e1a-7a4b-4c1e-9d3f-0a1b2c3d4e02"
	poolA    = "7e1d3f2b-8b5c-4d2f-8e4a-1b2c3d4e5f01"
	poolB    = "7e1d3f2b-8b5c-4d2f-8e4a-1b2c3d4e5f02"
	debugID  = "9a2e4f3c-9c6d-4e3a-8f5b-2c3d4e5f6a01"
	zoneID   = "9a2e4f3c-9c6d-4e3a-8f5b-2c3d4e5f6a02"
	orphanID = "9a2e4f3c-9c6d-4e3a-8f5b-2c3d4e5f6a03"
	goneID   = "9a2e4f3c-9c6d-4e3a-8f5b-2c3d4e5f6a04"
)

// storageStatus is a storage status of version v: two disks (b in error),
// one pool, two datasets, one orphan kept and one destroyed.
func storageStatus(v uint64, debugResult storage.Result) storage.Status {
	next := uint8(2)
	fwVersion := "E4.0.1"
	quota, reservation := uint64(100<<30), uint64(10<<30)
	return storage.Status{
		Version:    v,
		Configured: true,
		Disks: []storage.DiskStatus{
			{ID: diskA, Identity: storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-a"}, PoolID: poolA, Result: storage.Result{OK: true}},
			{ID: diskB, Identity: storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-b"}, PoolID: poolB, Result: storage.Result{Message: "disk not found"}},
		},
		Datasets: []storage.DatasetStatus{
			{ID: debugID, Name: storage.DatasetName(poolA, "debug"), Result: debugResult},
			{ID: zoneID, Name: storage.DatasetName(poolA, "zone"), Result: storage.Result{OK: true}},
		},
		Observed: storage.Observed{
			Disks: []storage.Disk{
				{Identity: storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-a"}, Variant: storage.VariantU2, Slot: 1024,
					Content: storage.ContentPool, PoolID: poolA, Size: 1 << 40,
					Firmware: storage.Firmware{ActiveSlot: 1, NextActive: &next, Slots: 2, Slot1ReadOnly: true, Versions: []*string{&fwVersion, nil}}},
				{Identity: storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-M2", Serial: "synthetic-serial-m"}, Variant: storage.VariantM2, Slot: 1025,
					Content: storage.ContentBlank, Size: 1 << 30},
			},
			Pools: []storage.Pool{{ID: poolA, Mountpoint: "/pool/ext/" + poolA, TotalSize: 1 << 40, Health: "online"}},
			Datasets: []storage.ObservedDataset{
				{PoolID: poolA, Dataset: storage.Dataset{Name: storage.DatasetName(poolA, "debug"), ID: debugID, Quota: &quota, Reservation: &reservation,
					Compression: storage.Compression{Type: "gzip_n", Level: 9}, Used: 1 << 20, Available: 99 << 30, Mounted: true}},
				{PoolID: poolA, Dataset: storage.Dataset{Name: storage.DatasetName(poolA, "zone"), Compression: storage.Compression{Type: "off"}, Used: 1 << 10, Available: 1 << 39}},
			},
		},
		Orphans: []storage.Orphan{
			{Name: storage.DatasetName(poolA, "zone/oxz_gone"), ID: orphanID, Kind: "zone/oxz_gone", PoolID: poolA, Reason: "zone datasets are never destroyed",
				Dataset: storage.Dataset{Name: storage.DatasetName(poolA, "zone/oxz_gone"), ID: orphanID, Used: 5, Available: 6, Mounted: true}},
			{Name: storage.DatasetName(poolA, "cockroachdb"), ID: goneID, Kind: "cockroachdb", PoolID: poolA, Reason: "destroyed", Destroyed: true},
		},
	}
}

// withFakeStorage returns the document of cfg with the disks and datasets
// storageStatus reports on (disks a and b, datasets debug and zone on pool
// a) in place of its own: the last reconciliation has results for a
// config's disks and datasets alone.
func withFakeStorage(t *testing.T, cfg *sledconfig.Config) []byte {
	t.Helper()
	doc, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	disk := func(id, serial, pool string) any {
		return map[string]any{"id": id, "identity": map[string]any{"vendor": "synthetic-vendor", "model": "synthetic-model-U2", "serial": serial}, "pool_id": pool}
	}
	dataset := func(id, kind string) any {
		return map[string]any{"id": id, "name": map[string]any{"pool_name": "oxp_" + poolA, "kind": kind}, "compression": map[string]any{"type": "off"}, "quota": nil, "reservation": nil}
	}
	m["disks"] = map[string]any{diskA: disk(diskA, "synthetic-serial-a", poolA), diskB: disk(diskB, "synthetic-serial-b", poolB)}
	m["datasets"] = map[string]any{debugID: dataset(debugID, "debug"), zoneID: dataset(zoneID, "zone")}
	if doc, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	return doc
}

type upOrphan struct {
	Name struct {
		PoolName string `json:"pool_name"`
		Kind     string `json:"kind"`
	} `json:"name"`
	ID        *string `json:"id"`
	Mounted   bool    `json:"mounted"`
	Available uint64  `json:"available"`
	Used      uint64  `json:"used"`
	Reason    string  `json:"reason"`
}

// storageSled serves a sled whose storage reconciler is fs, with cfg
// ledgered and a reconciler pass completed.
func storageSled(t *testing.T, fs *fakeStorage, cfg *sledconfig.Config) *sled {
	t.Helper()
	s := newSled(t, sim.Options{}, func(d *api.Deps) { d.Storage = fs })
	doc := withFakeStorage(t, cfg)
	if r := s.put(doc); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	waitFor(t, "a completed pass", func() bool { return s.rec.Status().Phase == reconciler.PhaseIdle })
	return s
}

// TestInventoryReportsStorage checks GET /inventory's disks, zpools,
// datasets and storage results against the upstream document, decoded
// strictly, from the storage reconciler's status, and that a new status
// version shows up.
func TestInventoryReportsStorage(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	fs := &fakeStorage{st: storageStatus(1, storage.Result{OK: true})}
	s := storageSled(t, fs, sledconfigtest.Config(1, sledconfigtest.Crucibles(1)...))

	inv := s.upstreamInventory(spec)
	if len(inv.Disks) != 2 {
		t.Fatalf("disks: %+v", inv.Disks)
	}
	a, m := inv.Disks[0], inv.Disks[1]
	if a.Identity.Serial != "synthetic-serial-a" || a.Identity.Vendor != "synthetic-vendor" || a.Identity.Model != "synthetic-model-U2" ||
		a.Variant != "U2" || a.Slot != 1024 || a.ActiveFirmwareSlot != 1 || a.NextActiveFirmwareSlot == nil || *a.NextActiveFirmwareSlot != 2 ||
		a.NumberOfFirmwareSlots != 2 || !a.Slot1IsReadOnly || len(a.SlotFirmwareVersions) != 2 ||
		a.SlotFirmwareVersions[0] == nil || *a.SlotFirmwareVersions[0] != "E4.0.1" || a.SlotFirmwareVersions[1] != nil {
		t.Errorf("disk a: %+v", a)
	}
	if m.Variant != "M2" || m.Slot != 1025 || m.NextActiveFirmwareSlot != nil || m.SlotFirmwareVersions == nil {
		t.Errorf("disk m: %+v", m)
	}
	if len(inv.Zpools) != 1 || inv.Zpools[0] != (upZpool{ID: poolA, TotalSize: 1 << 40, Health: "online"}) {
		t.Errorf("zpools: %+v", inv.Zpools)
	}
	if len(inv.Datasets) != 2 {
		t.Fatalf("datasets: %+v", inv.Datasets)
	}
	debug, zone := inv.Datasets[0], inv.Datasets[1]
	if debug.ID == nil || *debug.ID != debugID || debug.Name != "oxp_"+poolA+"/crypt/debug" || debug.Compression != "gzip-9" ||
		debug.Quota == nil || *debug.Quota != 100<<30 || debug.Reservation == nil || *debug.Reservation != 10<<30 ||
		debug.Used != 1<<20 || debug.Available != 99<<30 {
		t.Errorf("debug dataset: %+v", debug)
	}
	if zone.ID != nil || zone.Name != "oxp_"+poolA+"/crypt/zone" || zone.Compression != "off" || zone.Quota != nil || zone.Reservation != nil {
		t.Errorf("zone dataset: %+v", zone)
	}

	lr := inv.LastReconciliation
	if lr == nil {
		t.Fatal("no last reconciliation")
	}
	if len(lr.ExternalDisks) != 2 || lr.ExternalDisks[diskA] != (upResult{Result: "ok"}) || lr.ExternalDisks[diskB] != (upResult{Result: "err", Message: "disk not found"}) {
		t.Errorf("external disks: %+v", lr.ExternalDisks)
	}
	if len(lr.Datasets) != 2 || lr.Datasets[debugID].Result != "ok" || lr.Datasets[zoneID].Result != "ok" {
		t.Errorf("datasets: %+v", lr.Datasets)
	}
	// The destroyed orphan is gone: upstream lists those that exist.
	if len(lr.OrphanedDatasets) != 1 {
		t.Fatalf("orphaned datasets: %s", lr.OrphanedDatasets)
	}
	var o upOrphan
	if err := strictDecode(lr.OrphanedDatasets[0], &o); err != nil {
		t.Fatal(err)
	}
	if o.Name.PoolName != "oxp_"+poolA || o.Name.Kind != "zone/oxz_gone" || o.ID == nil || *o.ID != orphanID || !o.Mounted ||
		o.Used != 5 || o.Available != 6 || !strings.Contains(o.Reason, "never destroyed") {
		t.Errorf("orphan: %+v", o)
	}

	// A new status, with the debug dataset in error, shows up; the same
	// version again is served from the cache.
	fs.set(storageStatus(2, storage.Result{Message: "dataset exists with another id"}))
	inv = s.upstreamInventory(spec)
	if res := inv.LastReconciliation.Datasets[debugID]; res != (upResult{Result: "err", Message: "dataset exists with another id"}) {
		t.Errorf("after a new storage status, debug's result: %+v", res)
	}
	st := storageStatus(2, storage.Result{OK: true})
	st.Observed.Pools = nil
	fs.set(st)
	inv = s.upstreamInventory(spec)
	if res := inv.LastReconciliation.Datasets[debugID]; res.Result != "err" || len(inv.Zpools) != 1 {
		t.Errorf("the same version is encoded again: debug %+v, zpools %+v", res, inv.Zpools)
	}
	st.Version = 3
	fs.set(st)
	inv = s.upstreamInventory(spec)
	if res := inv.LastReconciliation.Datasets[debugID]; res.Result != "ok" || len(inv.Zpools) != 0 {
		t.Errorf("after version 3: debug %+v, zpools %+v", res, inv.Zpools)
	}

	// Our view has the whole status.
	r := s.do(http.MethodGet, "/agent/inventory", nil)
	var ai api.AgentInventory
	if err := strictDecode(r.body, &ai); err != nil {
		t.Fatalf("GET /agent/inventory: %d %v\n%s", r.status, err, r.body)
	}
	if ai.Storage == nil || ai.Storage.Version != 3 || len(ai.Storage.Orphans) != 2 || len(ai.Storage.Observed.Disks) != 2 {
		t.Errorf("agent inventory's storage: %+v", ai.Storage)
	}
	disk := s.agentInventory()["storage"].(map[string]any)["observed"].(map[string]any)["disks"].([]any)[0].(map[string]any)
	if _, ok := disk["identity"]; !ok {
		t.Errorf("an observed disk in /agent/inventory has no identity member: %v", disk)
	}
}

// GET /inventory copies the storage status only when its version is not
// the one encoded: a thousand disks' status is not copied per request.
func TestInventoryCopiesStorageStatusOncePerVersion(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	fs := &fakeStorage{st: storageStatus(1, storage.Result{OK: true})}
	s := storageSled(t, fs, sledconfigtest.Config(1, sledconfigtest.Crucibles(1)...))

	s.upstreamInventory(spec)
	n := fs.statusCopies()
	for range 3 {
		s.upstreamInventory(spec)
	}
	if got := fs.statusCopies() - n; got != 0 {
		t.Errorf("3 requests at one storage version copied the status %d times", got)
	}
	fs.set(storageStatus(2, storage.Result{Message: "dataset exists with another id"}))
	inv := s.upstreamInventory(spec)
	if res := inv.LastReconciliation.Datasets[debugID]; res.Result != "err" {
		t.Errorf("after a new storage status, debug's result: %+v", res)
	}
	if got := fs.statusCopies() - n; got != 1 {
		t.Errorf("a new storage version copied the status %d times, want 1", got)
	}
}

// TestInventoryWithoutStorage checks that an agent managing no storage
// reports none.
func TestInventoryWithoutStorage(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	s := newSled(t, sim.Options{})
	doc, _ := json.Marshal(sledconfigtest.Config(1, sledconfigtest.Crucibles(1)...))
	s.put(doc)
	waitFor(t, "a completed pass", func() bool { return s.rec.Status().Phase == reconciler.PhaseIdle })
	inv := s.upstreamInventory(spec)
	if inv.Disks == nil || inv.Zpools == nil || inv.Datasets == nil || len(inv.Disks)+len(inv.Zpools)+len(inv.Datasets) != 0 {
		t.Errorf("storage lists: %+v %+v %+v", inv.Disks, inv.Zpools, inv.Datasets)
	}
	lr := inv.LastReconciliation
	if lr == nil || lr.ExternalDisks == nil || lr.Datasets == nil || lr.OrphanedDatasets == nil ||
		len(lr.ExternalDisks)+len(lr.Datasets)+len(lr.OrphanedDatasets) != 0 {
		t.Errorf("storage results: %+v", lr)
	}
	if v, ok := s.agentInventory()["storage"]; !ok || v != nil {
		t.Errorf("agent inventory's storage: %v, %v; want null", v, ok)
	}
}

// A change of the zones alone re-encodes the zones alone: the storage
// status is not copied again, and its results are still those of its
// version beside the new zones.
func TestInventoryZoneChangeKeepsStorageEncoded(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	fs := &fakeStorage{st: storageStatus(1, storage.Result{Message: "dataset exists with another id"})}
	zones := sledconfigtest.Crucibles(2)
	s := storageSled(t, fs, sledconfigtest.Config(1, zones[0]))
	before := s.upstreamInventory(spec)
	n := fs.statusCopies()

	doc := withFakeStorage(t, sledconfigtest.Config(2, zones...))
	if r := s.put(doc); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	waitFor(t, "the second zone in the last reconciliation", func() bool {
		_, ok := s.upstreamInventory(spec).LastReconciliation.Zones[zones[1].ID]
		return ok
	})
	inv := s.upstreamInventory(spec)
	if got := fs.statusCopies() - n; got != 0 {
		t.Errorf("a change of the zones alone copied the storage status %d times", got)
	}
	if res := inv.LastReconciliation.Datasets[debugID]; res.Result != "err" || res.Message != "dataset exists with another id" {
		t.Errorf("debug's result after a zone change: %+v", res)
	}
	if got, want := len(inv.LastReconciliation.ExternalDisks), len(before.LastReconciliation.ExternalDisks); got != want || got == 0 {
		t.Errorf("external disks after a zone change: %d, before %d", got, want)
	}
	var cfg struct{ Generation uint64 }
	if err := json.Unmarshal(inv.LastReconciliation.LastReconciledConfig, &cfg); err != nil || cfg.Generation != 2 {
		t.Errorf("last reconciled config: %s (%v)", inv.LastReconciliation.LastReconciledConfig, err)
	}
}

// Until the storage reconciler has answered for the config of the last
// reconciliation, that reconciliation is still running, and each of the
// config's disks and datasets it has said nothing of is err, not yet
// reconciled: never idle with zone results and no storage results.
func TestReconcilerIsNotIdleWhileStorageHasNotAnswered(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	fs := &fakeStorage{}
	s := storageSled(t, fs, sledconfigtest.Config(1, sledconfigtest.Crucibles(1)...))
	inv := s.upstreamInventory(spec)
	lr := inv.LastReconciliation
	if inv.ReconcilerStatus.Status != "running" || len(lr.Zones) != 1 {
		t.Errorf("before storage answered: reconciler %+v, %d zone results", inv.ReconcilerStatus, len(lr.Zones))
	}
	for id, r := range lr.ExternalDisks {
		if r.Result != "err" || !strings.Contains(r.Message, "not yet reconciled") {
			t.Errorf("disk %s before storage answered: %+v", id, r)
		}
	}
	if len(lr.ExternalDisks) != 2 || len(lr.Datasets) != 2 {
		t.Errorf("before storage answered: %d disk and %d dataset results, want 2 and 2", len(lr.ExternalDisks), len(lr.Datasets))
	}
	// A disk whose first pass has not finished is no answer either.
	st := storageStatus(1, storage.Result{Message: "not yet managed: its first pass has not finished", Pending: true})
	fs.set(st)
	if got := s.upstreamInventory(spec).ReconcilerStatus.Status; got != "running" {
		t.Errorf("with a dataset pending: reconciler %s", got)
	}
	st = storageStatus(2, storage.Result{OK: true})
	fs.set(st)
	inv = s.upstreamInventory(spec)
	if inv.ReconcilerStatus.Status != "idle" || inv.LastReconciliation.Datasets[debugID].Result != "ok" {
		t.Errorf("once storage answered: reconciler %+v, debug %+v", inv.ReconcilerStatus, inv.LastReconciliation.Datasets[debugID])
	}
	// A disk or dataset of another config is no answer for this one.
	st = storageStatus(3, storage.Result{OK: true})
	st.Disks[0].PoolID = poolB
	fs.set(st)
	inv = s.upstreamInventory(spec)
	if r := inv.LastReconciliation.ExternalDisks[diskA]; inv.ReconcilerStatus.Status != "running" || r.Result != "err" {
		t.Errorf("with disk a's status for another pool: reconciler %+v, disk a %+v", inv.ReconcilerStatus, r)
	}
}
