package api

import (
	"encoding/json"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
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

// notYetReconciled is the result of a disk or dataset of the last
// reconciled config of which the storage reconciler has said nothing yet.
const notYetReconciled = "not yet reconciled: the storage reconciler has not reported on it for this config"

// addStorageResults fills lr's storage members for cfg, the config of the
// last reconciliation: upstream's last reconciliation is one pass over one
// config, so it has a result for every disk and dataset that config names
// and for no other. Here zones and storage are two reconcilers: each disk
// of cfg takes the storage reconciler's result for it (same id, pool and
// identity), each dataset the result for it (same id and name), and one
// the storage status does not have yet is err, notYetReconciled. The
// orphaned datasets are those kept; like upstream, orphaned_datasets lists
// only datasets that still exist: those destroyed are in our view alone
// (GET /agent/inventory). pending reports that some disk or dataset of cfg
// has no answer of the storage reconciler for cfg yet.
func addStorageResults(lr *ConfigReconcilerInventory, cfg *sledconfig.Config, st *storage.Status) (pending bool) {
	if cfg != nil {
		disks := make(map[string]*storage.DiskStatus, len(st.Disks))
		for i := range st.Disks {
			disks[st.Disks[i].ID] = &st.Disks[i]
		}
		for _, d := range cfg.StorageDisks() {
			got, ok := disks[d.ID]
			if !ok || got.PoolID != d.PoolID || got.Identity != d.Identity {
				lr.ExternalDisks[d.ID] = ResultStatus{Result: "err", Message: notYetReconciled}
				pending = true
				continue
			}
			lr.ExternalDisks[d.ID] = resultStatus(got.Result)
			pending = pending || got.Result.Pending
		}
		datasets := make(map[string]*storage.DatasetStatus, len(st.Datasets))
		for i := range st.Datasets {
			datasets[st.Datasets[i].ID] = &st.Datasets[i]
		}
		for _, d := range cfg.StorageDatasets() {
			got, ok := datasets[d.ID]
			if !ok || got.Name != d.Name() {
				lr.Datasets[d.ID] = ResultStatus{Result: "err", Message: notYetReconciled}
				pending = true
				continue
			}
			lr.Datasets[d.ID] = resultStatus(got.Result)
			pending = pending || got.Result.Pending
		}
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
	return pending
}

// storageEncoding is what the inventory encodes of one storage status
// version: the members disks, zpools and datasets, and the storage results
// of the last reconciliation of one config.
type storageEncoding struct {
	version uint64
	// status is the storage status of version, kept so that a new config
	// (the storage results of its last reconciliation) does not copy it
	// again.
	status *storage.Status
	// members are the encoded members disks, zpools and datasets
	// (",\"disks\":…" with a leading comma).
	members []byte
	// cfg is the config results are of; results the storage results
	// ("\"external_disks\":…,\"datasets\":…,\"orphaned_datasets\":…", no
	// braces); pending whether some have no answer yet (addStorageResults).
	cfg     *sledconfig.Config
	results []byte
	pending bool
}

// cachedStorage returns what is encoded of storage status version, if it
// is cached, with results for cfg.
func (s *Server) cachedStorage(version uint64, cfg *sledconfig.Config) (storageEncoding, bool) {
	c := &s.inv
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.storage
	if e.members == nil || e.version != version || e.cfg != cfg || e.results == nil {
		return storageEncoding{}, false
	}
	return e, true
}

// storageMembers returns the encoded storage members and the storage
// results of a last reconciliation of cfg, encoding them once per storage
// status version and config: the status is copied only when what is
// encoded of it is not of its version.
func (s *Server) storageMembers(cfg *sledconfig.Config) (storageEncoding, error) {
	version := s.storageVersion()
	if e, ok := s.cachedStorage(version, cfg); ok {
		return e, nil
	}
	c := &s.inv
	c.mu.Lock()
	st := c.storage.status
	c.mu.Unlock()
	if st == nil || st.Version != version {
		sst := s.storageStatus()
		st = &sst
	}
	return s.encodeStorage(st, cfg)
}

// encodeStorage encodes what storageMembers returns of st and cfg, and
// caches it.
func (s *Server) encodeStorage(st *storage.Status, cfg *sledconfig.Config) (storageEncoding, error) {
	e := storageEncoding{version: st.Version, status: st, cfg: cfg}
	c := &s.inv
	c.mu.Lock()
	if c.storage.members != nil && c.storage.version == st.Version {
		e.members = c.storage.members
	}
	c.mu.Unlock()
	if e.members == nil {
		enc, err := json.Marshal(toUpstreamStorage(st))
		if err != nil {
			return storageEncoding{}, err
		}
		e.members = append([]byte{','}, enc[1:len(enc)-1]...)
	}
	lr := &ConfigReconcilerInventory{ExternalDisks: map[string]ResultStatus{}, Datasets: map[string]ResultStatus{}, OrphanedDatasets: []OrphanedDataset{}}
	if s.deps.Storage == nil {
		// An agent that manages no storage has no storage results.
		cfg = nil
	}
	e.pending = addStorageResults(lr, cfg, st)
	enc, err := json.Marshal(struct {
		ExternalDisks    map[string]ResultStatus `json:"external_disks"`
		Datasets         map[string]ResultStatus `json:"datasets"`
		OrphanedDatasets []OrphanedDataset       `json:"orphaned_datasets"`
	}{lr.ExternalDisks, lr.Datasets, lr.OrphanedDatasets})
	if err != nil {
		return storageEncoding{}, err
	}
	e.results = enc[1 : len(enc)-1]
	c.mu.Lock()
	c.storage = e
	c.mu.Unlock()
	return e, nil
}
