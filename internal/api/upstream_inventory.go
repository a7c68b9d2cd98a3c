package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// What this platform cannot have, said in upstream's error variants with
// the reason. Upstream's own messages come first ("boot disk not found",
// "no disk found in this slot", as its boot partition reader reports them).
const (
	noBootDisks      = "this sled has no M.2 boot disks"
	bootDiskNotFound = "boot disk not found: " + noBootDisks
	noDiskInSlot     = "no disk found in this slot: " + noBootDisks
	noZoneManifest   = bootDiskNotFound + ", so no install dataset and no zone manifest; zones run the agent's own zone image"
	noMeasurements   = bootDiskNotFound + ", so no measurement manifest"
	noMupdate        = bootDiskNotFound + ", so no mupdate override file"
	noFMD            = "no fault management daemon on Linux"
)

// boot is the boot partition contents this sled reports: it has no M.2 boot
// disks (upstream's sled agent cannot run without one; this one runs from
// the host's own disk).
var boot = BootPartitionContents{
	BootDisk: M2SlotResult{Err: ptr(bootDiskNotFound)},
	SlotA:    BootPartitionResult{Err: ptr(noDiskInSlot)},
	SlotB:    BootPartitionResult{Err: ptr(noDiskInSlot)},
}

func ptr[T any](v T) *T { return &v }

// fileSourceResolver is what this sled reports of the manifests and the
// mupdate override, which live on M.2 boot disks it does not have.
func fileSourceResolver() OmicronFileSourceResolverInventory {
	return OmicronFileSourceResolverInventory{
		ZoneManifest: ManifestInventory{
			BootInventory: ManifestBootResult{Err: ptr(noZoneManifest)},
			NonBootStatus: []ManifestNonBootInventory{},
		},
		MeasurementManifest: ManifestInventory{
			BootInventory: ManifestBootResult{Err: ptr(noMeasurements)},
			NonBootStatus: []ManifestNonBootInventory{},
		},
		MupdateOverride: MupdateOverrideInventory{
			BootOverride:  MupdateOverrideBootResult{Err: ptr(noMupdate)},
			NonBootStatus: []MupdateOverrideNonBootInventory{},
		},
	}
}

// zoneFMRI names a zone's one supervised service in SMF's FMRI form, as
// upstream's svcs reports the services of a zone.
func zoneFMRI(kind string) string { return "svc:/oxide/" + kind + ":default" }

// notOnlineState says how a zone's supervised service stands if the zone
// is wanted and exists but is not up, in svcs' words: a zone being started,
// or waiting for its storage or synchronized time (SMF's waiting for its
// dependencies), is offline, one whose start or run failed is in
// maintenance, and a running zone failing its health checks is degraded.
// "" for any other zone.
func notOnlineState(z *reconciler.ZoneStatus) string {
	if !z.Wanted || !z.Exists {
		return ""
	}
	switch {
	case z.State == reconciler.StateStarting, z.State == reconciler.StateWaiting:
		return "offline"
	case z.State == reconciler.StateFailed:
		return "maintenance"
	case z.State == reconciler.StateRunning && z.Health.State == reconciler.HealthFailing:
		return "degraded"
	}
	return ""
}

// servicesNotOnline lists the supervised services of the zones that should
// be up and are not. From published status only: inventory never waits for
// the runtime.
func servicesNotOnline(zones []reconciler.ZoneStatus) []SvcEnabledNotOnline {
	out := []SvcEnabledNotOnline{}
	for i := range zones {
		z := &zones[i]
		if state := notOnlineState(z); state != "" {
			out = append(out, SvcEnabledNotOnline{FMRI: zoneFMRI(z.Kind), Zone: z.Name, State: state})
		}
	}
	return out
}

// reservoirSize is the VMM reservoir's size in bytes (0 without one).
func (s *Server) reservoirSize() uint64 {
	if r := s.deps.Reservoir; r != nil {
		return r.Size()
	}
	return 0
}

// inventoryIdentity builds the members of Inventory that never change while
// the agent runs: all the small ones but smf_services_enabled_not_online
// and the storage ones (disks, zpools, datasets).
func (s *Server) inventoryIdentity() InventoryIdentity {
	id := s.deps.Identity
	hw := id.Hardware
	return InventoryIdentity{
		SledID:                id.SledID,
		SledAgentAddress:      id.Address,
		SledRole:              id.Role,
		BaseboardID:           BaseboardID{PartNumber: hw.Baseboard.Part, SerialNumber: hw.Baseboard.Serial},
		UsableHardwareThreads: hw.HardwareThreads,
		UsablePhysicalRAM:     hw.PhysicalRAM,
		CPUFamily:             string(hw.Family()),
		ReservoirSize:         s.reservoirSize(),
		FileSourceResolver:    fileSourceResolver(),
		ReferenceMeasurements: []SingleMeasurementInventory{},
		FMD:                   FmdResult{Err: &FmdInventoryError{Kind: "fmd_error", Message: noFMD}},
	}
}

// servicesResult is smf_services_enabled_not_online as of now.
func (s *Server) servicesResult(now time.Time) SvcsEnabledNotOnlineResult {
	zones := s.deps.Reconciler.ZonesWhere(func(z reconciler.ZoneStatus) bool { return notOnlineState(&z) != "" })
	return SvcsEnabledNotOnlineResult{
		Type: "svcs_enabled_not_online",
		Value: &SvcsEnabledNotOnline{
			Services:     servicesNotOnline(zones),
			Errors:       []string{},
			TimeOfStatus: now.UTC().Format(time.RFC3339Nano),
		},
	}
}

// reconcilerStatus is upstream's reconciler status, as of now. Upstream
// reconciles zones and storage in one pass; here the zone reconciler's
// pass is not over while the storage reconciler has not answered for its
// config (storagePending): its last pass, idle to the zone reconciler, is
// still running, since its start. A last pass that had no config (the
// first, before any was put) stays idle: upstream's running status carries
// the config it works on.
func reconcilerStatus(st reconciler.Status, storagePending bool, now time.Time) ReconcilerStatus {
	if st.Phase == reconciler.PhaseIdle && storagePending && st.Last != nil && st.Last.Config != nil {
		st.Phase, st.Config, st.StartedAt = reconciler.PhaseRunning, st.Last.Config, st.CompletedAt.Add(-st.RanFor)
	}
	rs := ReconcilerStatus{Status: string(st.Phase)}
	switch st.Phase {
	case reconciler.PhaseRunning:
		t := st.StartedAt
		rs.Config = st.Config
		rs.StartedAt = &t
		rs.RunningFor = duration(now.Sub(t))
	case reconciler.PhaseIdle:
		t := st.CompletedAt
		rs.CompletedAt = &t
		rs.RanFor = duration(st.RanFor)
	}
	return rs
}

// toUpstreamReconciliation converts the reconciler's last reconciliation into
// upstream's shape, with the storage results as the storage reconciler
// publishes them. Upstream reconciles zones and storage in one pass; here
// they are two reconcilers, so the storage results are the storage
// reconciler's latest, not those of the zone pass. GET /inventory writes
// the same from parts encoded once (lastReconciliationSegments); this whole
// is what the parts must agree with.
func toUpstreamReconciliation(last *reconciler.Reconciliation, st *storage.Status) *ConfigReconcilerInventory {
	lr := &ConfigReconcilerInventory{
		LastReconciledConfig: last.Config,
		Zones:                upstreamZoneResults(last),
		ExternalDisks:        map[string]ResultStatus{},
		Datasets:             map[string]ResultStatus{},
		OrphanedDatasets:     []OrphanedDataset{},
		BootPartitions:       boot,
	}
	addStorageResults(lr, last.Config, st)
	if last.Config != nil && last.Config.RemoveMupdateOverride != nil {
		// Asked to remove an override: there is none this sled could hold.
		lr.RemoveMupdateOverride = removeMupdate()
	}
	return lr
}

// removeMupdate is the result of removing the mupdate override: there is
// none this sled could hold.
func removeMupdate() *RemoveMupdateOverrideInventory {
	return &RemoveMupdateOverrideInventory{
		BootDiskResult: RemoveMupdateOverrideBootResult{Err: ptr(noMupdate)},
		NonBootMessage: noBootDisks,
	}
}

// inventoryCache holds the parts of the inventory encoded once: the members
// that never change, the storage members and the last reconciliation's
// storage results of the last storage status (encoded once per status
// version), and the last reconciliation's zone results (once per reconciler
// snapshot). A zone starting for one more second re-encodes a thousand zone
// results, not the thousands of disks and datasets beside them. The configs
// carry their canonical bytes themselves.
type inventoryCache struct {
	headOnce sync.Once
	head     []byte // every constant member, without the closing brace

	mu sync.Mutex
	// Guarded by mu; never mutated once stored.
	// zones are the zone results of zonesOf, the reconciler's last
	// reconciliation snapshot, converted and encoded.
	zonesOf   *reconciler.Reconciliation
	zones     map[string]ResultStatus
	zonesJSON []byte
	// storage is what is encoded of the last storage status (its version
	// and the config of the last reconciliation). A zone's change
	// re-encodes only the zones, a storage change only these.
	storage storageEncoding
}

// head returns the encoded constant members.
func (s *Server) head() []byte {
	c := &s.inv
	c.headOnce.Do(func() {
		id := s.inventoryIdentity()
		// Everything but the services, which change with the zones, and
		// the storage members, which change with the storage status.
		b, err := appendMembers(nil, struct {
			*InventoryIdentity
			SMF      struct{} `json:"smf_services_enabled_not_online,omitzero"`
			Disks    struct{} `json:"disks,omitzero"`
			Zpools   struct{} `json:"zpools,omitzero"`
			Datasets struct{} `json:"datasets,omitzero"`
		}{InventoryIdentity: &id})
		if err != nil {
			panic("encoding the inventory's constant members: " + err.Error())
		}
		c.head = b
	})
	return c.head
}

// upstreamZoneResults is last's zone results in upstream's shape.
func upstreamZoneResults(last *reconciler.Reconciliation) map[string]ResultStatus {
	m := make(map[string]ResultStatus, len(last.Zones))
	for id, res := range last.Zones {
		if res.OK {
			m[id] = ResultStatus{Result: "ok"}
		} else {
			m[id] = ResultStatus{Result: "err", Message: res.Message}
		}
	}
	return m
}

// zoneResults returns the zone results of last in upstream's shape, and
// encoded, converting and encoding them outside the lock when they are not
// the cached ones.
func (s *Server) zoneResults(last *reconciler.Reconciliation) (map[string]ResultStatus, []byte, error) {
	c := &s.inv
	c.mu.Lock()
	if c.zonesOf == last && c.zonesJSON != nil {
		m, b := c.zones, c.zonesJSON
		c.mu.Unlock()
		return m, b, nil
	}
	c.mu.Unlock()
	m := upstreamZoneResults(last)
	b, err := json.Marshal(m)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	c.zonesOf, c.zones, c.zonesJSON = last, m, b
	c.mu.Unlock()
	return m, b, nil
}

// lastReconciliationSegments encodes last as json.Marshal would encode
// toUpstreamReconciliation(last, st) (members in another order), from the
// storage results of st (results) and the zones of last (zones), with the
// config's canonical bytes copied in rather than re-encoded.
func lastReconciliationSegments(last *reconciler.Reconciliation, results, zones []byte) [][]byte {
	segs := [][]byte{[]byte("{"), results, []byte(`,"zones":`), zones, []byte(`,"boot_partitions":`), bootJSON()}
	if last.Config != nil && last.Config.RemoveMupdateOverride != nil {
		segs = append(segs, []byte(`,"remove_mupdate_override":`), removeMupdateJSON())
	}
	return append(segs, []byte(`,"last_reconciled_config":`), configJSON(last.Config), []byte("}"))
}

// bootJSON and removeMupdateJSON are the encoded constant members of every
// last reconciliation.
var (
	bootJSON          = sync.OnceValue(func() []byte { return mustJSON(boot) })
	removeMupdateJSON = sync.OnceValue(func() []byte { return mustJSON(removeMupdate()) })
)

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("encoding a constant member of the inventory: " + err.Error())
	}
	return b
}

// configJSON is a config's canonical JSON, or null.
func configJSON(cfg *sledconfig.Config) []byte {
	if cfg == nil {
		return []byte("null")
	}
	return cfg.Canonical()
}

// appendMembers appends the JSON of v, an object with at least one member,
// without its closing brace.
func appendMembers(b []byte, v any) ([]byte, error) {
	enc, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, enc[:len(enc)-1]...), nil
}

// inventory encodes upstream's inventory from published snapshots, as of
// now, as segments to be written in order: the constant members, the
// storage members and the last reconciliation encoded once, the configs'
// canonical bytes, and only
// what changes with time (the services, the reconciler's timings) encoded
// per request.
func (s *Server) inventorySegments(now time.Time) ([][]byte, error) {
	st := s.deps.Reconciler.Status()
	// The storage status is copied only when what is encoded of it is not
	// that of its version.
	var lastCfg *sledconfig.Config
	if st.Last != nil {
		lastCfg = st.Last.Config
	}
	stor, err := s.storageMembers(lastCfg)
	if err != nil {
		return nil, err
	}
	smf, err := json.Marshal(s.servicesResult(now))
	if err != nil {
		return nil, err
	}
	rs := reconcilerStatus(st, stor.pending, now)
	cfg := rs.Config
	rs.Config = nil
	status, err := appendMembers(nil, rs)
	if err != nil {
		return nil, err
	}
	segs := [][]byte{
		s.head(), stor.members,
		[]byte(`,"smf_services_enabled_not_online":`), smf,
		[]byte(`,"ledgered_sled_config":`), configJSON(s.deps.Configs.Current()),
		[]byte(`,"reconciler_status":`), status,
	}
	if cfg != nil {
		segs = append(segs, []byte(`,"config":`), cfg.Canonical())
	}
	segs = append(segs, []byte(`},"last_reconciliation":`))
	if st.Last == nil {
		segs = append(segs, []byte("null"))
	} else {
		_, zones, err := s.zoneResults(st.Last)
		if err != nil {
			return nil, err
		}
		segs = append(segs, lastReconciliationSegments(st.Last, stor.results, zones)...)
	}
	return append(segs, []byte("}")), nil
}

type inventoryOutput struct {
	Body func(huma.Context)
}

// inventory writes the segments straight to the connection, with their
// length: the megabyte of a large sled's inventory is never copied into one
// buffer.
func (s *Server) inventory(ctx context.Context, _ *struct{}) (*inventoryOutput, error) {
	segs, err := s.inventorySegments(time.Now())
	if err != nil {
		return nil, apiError(ctx, http.StatusInternalServerError, "encoding the inventory: "+err.Error())
	}
	return &inventoryOutput{Body: func(hc huma.Context) {
		n := 0
		for _, b := range segs {
			n += len(b)
		}
		hc.SetHeader("Content-Type", "application/json")
		hc.SetHeader("Content-Length", strconv.Itoa(n))
		hc.SetStatus(http.StatusOK)
		w := hc.BodyWriter()
		for _, b := range segs {
			if _, err := w.Write(b); err != nil {
				return // the client went away
			}
		}
	}}, nil
}
