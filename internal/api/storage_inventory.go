package api

import (
	"encoding/json"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// Storage is what the API reads of the storage reconciler: its published
// status, which never waits on a backend call.
type Storage interface {
	Status() storage.Status
	// Version is the Version of the Status Status would return now.
	Version() uint64
}

// storageStatus is the storage reconciler's status, or the empty one
// (version 0, nothing configured or observed) when the agent manages no
// storage.
func (s *Server) storageStatus() storage.Status {
	if s.deps.Storage == nil {
		return storage.Status{}
	}
	return s.deps.Storage.Status()
}

// storageVersion is storageStatus().Version, without copying the status.
func (s *Server) storageVersion() uint64 {
	if s.deps.Storage == nil {
		return 0
	}
	return s.deps.Storage.Version()
}

// upstreamStorage is what the storage reconciler last observed, in
// upstream's shapes: every disk present, the managed pools, and their
// datasets.
type upstreamStorage struct {
	Disks    []InventoryDisk    `json:"disks"`
	Zpools   []InventoryZpool   `json:"zpools"`
	Datasets []InventoryDataset `json:"datasets"`
}

func toUpstreamStorage(st *storage.Status) upstreamStorage {
	out := upstreamStorage{
		Disks:    make([]InventoryDisk, 0, len(st.Observed.Disks)),
		Zpools:   make([]InventoryZpool, 0, len(st.Observed.Pools)),
		Datasets: make([]InventoryDataset, 0, len(st.Observed.Datasets)),
	}
	for _, d := range st.Observed.Disks {
		fw := d.Firmware
		versions := fw.Versions
		if versions == nil {
			versions = []*string{}
		}
		out.Disks = append(out.Disks, InventoryDisk{
			Identity:               DiskIdentity{Vendor: d.Identity.Vendor, Model: d.Identity.Model, Serial: d.Identity.Serial},
			Variant:                string(d.Variant),
			Slot:                   d.Slot,
			ActiveFirmwareSlot:     fw.ActiveSlot,
			NextActiveFirmwareSlot: fw.NextActive,
			NumberOfFirmwareSlots:  fw.Slots,
			Slot1IsReadOnly:        fw.Slot1ReadOnly,
			SlotFirmwareVersions:   versions,
		})
	}
	for _, p := range st.Observed.Pools {
		out.Zpools = append(out.Zpools, InventoryZpool{ID: p.ID, TotalSize: p.TotalSize, Health: p.Health})
	}
	for _, od := range st.Observed.Datasets {
		d := od.Dataset
		out.Datasets = append(out.Datasets, InventoryDataset{
			ID:          optionalID(d.ID),
			Name:        d.Name,
			Available:   d.Available,
			Used:        d.Used,
			Quota:       d.Quota,
			Reservation: d.Reservation,
			Compression: d.Compression.String(),
		})
	}
	return out
}

// optionalID is an id that may be absent: nil for "".
func optionalID(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

func resultStatus(r storage.Result) ResultStatus {
	if r.OK {
		return ResultStatus{Result: "ok"}
	}
	return ResultStatus{Result: "err", Message: r.Message}
}

// addStorageResults fills lr's storage members from the storage status:
// every configured disk's and dataset's result, by id, and the orphaned
// datasets kept. Like upstream, orphaned_datasets lists only datasets that
// still exist: those destroyed are in our view alone (GET /agent/inventory).
func addStorageResults(lr *ConfigReconcilerInventory, st *storage.Status) {
	for _, d := range st.Disks {
		lr.ExternalDisks[d.ID] = resultStatus(d.Result)
	}
	for _, d := range st.Datasets {
		lr.Datasets[d.ID] = resultStatus(d.Result)
	}
	for _, o := range st.Orphans {
		if o.Destroyed {
			continue
		}
		lr.OrphanedDatasets = append(lr.OrphanedDatasets, OrphanedDataset{
			Name:      DatasetName{PoolName: storage.PoolName(o.PoolID), Kind: o.Kind},
			ID:        optionalID(o.ID),
			Mounted:   o.Dataset.Mounted,
			Available: o.Dataset.Available,
			Used:      o.Dataset.Used,
			Reason:    o.Reason,
		})
	}
}

// cachedStorage returns the encoded storage members and last
// reconciliation's storage results of storage status version, if they are
// cached.
func (s *Server) cachedStorage(version uint64) (stor, results []byte, ok bool) {
	c := &s.inv
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storage == nil || c.storageVersion != version {
		return nil, nil, false
	}
	return c.storage, c.results, true
}

// storageMembers returns the encoded members disks, zpools and datasets
// (",\"disks\":…" with a leading comma), and the storage results of the
// last reconciliation ("\"external_disks\":…,\"datasets\":…,
// \"orphaned_datasets\":…", no braces), encoding them once per storage
// status version: the status is copied only when what is encoded of it is
// not of its version.
func (s *Server) storageMembers() (stor, results []byte, err error) {
	if stor, results, ok := s.cachedStorage(s.storageVersion()); ok {
		return stor, results, nil
	}
	sst := s.storageStatus()
	return s.encodeStorage(&sst)
}

// encodeStorage encodes what storageMembers returns of st, and caches it.
func (s *Server) encodeStorage(st *storage.Status) (stor, results []byte, err error) {
	enc, err := json.Marshal(toUpstreamStorage(st))
	if err != nil {
		return nil, nil, err
	}
	stor = append([]byte{','}, enc[1:len(enc)-1]...)
	lr := &ConfigReconcilerInventory{ExternalDisks: map[string]ResultStatus{}, Datasets: map[string]ResultStatus{}, OrphanedDatasets: []OrphanedDataset{}}
	addStorageResults(lr, st)
	if enc, err = json.Marshal(struct {
		ExternalDisks    map[string]ResultStatus `json:"external_disks"`
		Datasets         map[string]ResultStatus `json:"datasets"`
		OrphanedDatasets []OrphanedDataset       `json:"orphaned_datasets"`
	}{lr.ExternalDisks, lr.Datasets, lr.OrphanedDatasets}); err != nil {
		return nil, nil, err
	}
	results = enc[1 : len(enc)-1]
	c := &s.inv
	c.mu.Lock()
	c.storageVersion, c.storage, c.results = st.Version, stor, results
	c.mu.Unlock()
	return stor, results, nil
}
