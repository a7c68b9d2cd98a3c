package api

import (
	"encoding/json"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The types of GET /inventory: upstream's Inventory (sled-agent API 48.0.0)
// and every schema it contains, member for member. Types carry upstream's
// names, or are renamed to them in upstreamNames, so the generated document
// uses upstream's schema names. Members this agent cannot fill honestly
// (no boot disks, no fault manager) are reported
// with upstream's own error variants or as empty lists, never invented.

// Inventory is upstream's Inventory: identity and basic status of the sled.
// It has every member upstream requires and none of ours (our own view is
// AgentInventory, at GET /agent/inventory): clients generated from the
// upstream document decode it strictly.
type Inventory struct {
	InventoryIdentity
	LedgeredSledConfig *sledconfig.Config         `json:"ledgered_sled_config" required:"false" doc:"The ledgered config; null when there is none."`
	ReconcilerStatus   ReconcilerStatus           `json:"reconciler_status"`
	LastReconciliation *ConfigReconcilerInventory `json:"last_reconciliation" required:"false" doc:"The last completed pass; null before the first."`
}

// InventoryIdentity is every member of Inventory but the three large ones
// (the configs and the last reconciliation), which are encoded once per
// published snapshot rather than per request.
type InventoryIdentity struct {
	SledID                      string                             `json:"sled_id" format:"uuid"`
	SledAgentAddress            string                             `json:"sled_agent_address"`
	SledRole                    string                             `json:"sled_role" enum:"gimlet,scrimlet"`
	BaseboardID                 BaseboardID                        `json:"baseboard_id"`
	UsableHardwareThreads       uint32                             `json:"usable_hardware_threads"`
	UsablePhysicalRAM           uint64                             `json:"usable_physical_ram"`
	CPUFamily                   string                             `json:"cpu_family" enum:"unknown,amd_milan,amd_turin,amd_turin_dense"`
	ReservoirSize               uint64                             `json:"reservoir_size" doc:"The VMM reservoir, memory for guests, in bytes (--vmm-reservoir-percentage or --vmm-reservoir-size-mb)."`
	Disks                       []InventoryDisk                    `json:"disks"`
	Zpools                      []InventoryZpool                   `json:"zpools"`
	Datasets                    []InventoryDataset                 `json:"datasets"`
	FileSourceResolver          OmicronFileSourceResolverInventory `json:"file_source_resolver"`
	SMFServicesEnabledNotOnline SvcsEnabledNotOnlineResult         `json:"smf_services_enabled_not_online"`
	ReferenceMeasurements       []SingleMeasurementInventory       `json:"reference_measurements"`
	FMD                         FmdResult                          `json:"fmd"`
}

// BaseboardID is upstream's BaseboardId.
type BaseboardID struct {
	PartNumber   string `json:"part_number" doc:"Oxide Part Number"`
	SerialNumber string `json:"serial_number" doc:"Serial number (unique for a given part number)"`
}

// InventoryDisk is upstream's InventoryDisk: one physical disk.
type InventoryDisk struct {
	Identity               DiskIdentity `json:"identity"`
	Variant                string       `json:"variant" enum:"U2,M2"`
	Slot                   int64        `json:"slot"`
	ActiveFirmwareSlot     uint8        `json:"active_firmware_slot"`
	NextActiveFirmwareSlot *uint8       `json:"next_active_firmware_slot,omitempty" nullable:"true"`
	NumberOfFirmwareSlots  uint8        `json:"number_of_firmware_slots"`
	Slot1IsReadOnly        bool         `json:"slot1_is_read_only"`
	SlotFirmwareVersions   []*string    `json:"slot_firmware_versions"`
}

// DiskIdentity is upstream's DiskIdentity.
type DiskIdentity struct {
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
	Serial string `json:"serial"`
}

// InventoryZpool is upstream's InventoryZpool.
type InventoryZpool struct {
	ID        string `json:"id" format:"uuid"`
	TotalSize uint64 `json:"total_size"`
	Health    string `json:"health" enum:"online,degraded,faulted,offline,removed,unavailable"`
}

// InventoryDataset is upstream's InventoryDataset.
type InventoryDataset struct {
	ID          *string `json:"id,omitempty" nullable:"true" format:"uuid"`
	Name        string  `json:"name"`
	Available   uint64  `json:"available"`
	Used        uint64  `json:"used"`
	Quota       *uint64 `json:"quota,omitempty" nullable:"true"`
	Reservation *uint64 `json:"reservation,omitempty" nullable:"true"`
	Compression string  `json:"compression"`
}

// SingleMeasurementInventory is upstream's SingleMeasurementInventory.
type SingleMeasurementInventory struct {
	Path   string       `json:"path"`
	Result ResultStatus `json:"result"`
}

// OmicronFileSourceResolverInventory is upstream's: what the sled found of
// the zone and measurement manifests and the mupdate override on its boot
// disks.
type OmicronFileSourceResolverInventory struct {
	ZoneManifest        ManifestInventory        `json:"zone_manifest"`
	MeasurementManifest ManifestInventory        `json:"measurement_manifest"`
	MupdateOverride     MupdateOverrideInventory `json:"mupdate_override"`
}

// ManifestInventory is upstream's ManifestInventory.
type ManifestInventory struct {
	BootDiskPath  string                     `json:"boot_disk_path"`
	BootInventory ManifestBootResult         `json:"boot_inventory"`
	NonBootStatus []ManifestNonBootInventory `json:"non_boot_status"`
}

// ManifestBootResult is upstream's Result<ManifestBootInventory, String>:
// {"ok": …} or {"err": "…"}.
type ManifestBootResult struct {
	Ok  *ManifestBootInventory `json:"ok,omitempty"`
	Err *string                `json:"err,omitempty"`
}

// ManifestBootInventory is upstream's ManifestBootInventory.
type ManifestBootInventory struct {
	Source    OmicronInstallManifestSource `json:"source"`
	Artifacts []ZoneArtifactInventory      `json:"artifacts"`
}

// OmicronInstallManifestSource is upstream's, tagged by "source".
type OmicronInstallManifestSource struct {
	Source    string `json:"source" enum:"installinator,sled_agent"`
	MupdateID string `json:"mupdate_id,omitempty" format:"uuid"`
}

// ZoneArtifactInventory is upstream's ZoneArtifactInventory.
type ZoneArtifactInventory struct {
	FileName     string         `json:"file_name"`
	Path         string         `json:"path"`
	ExpectedSize uint64         `json:"expected_size"`
	ExpectedHash string         `json:"expected_hash"`
	Status       ArtifactStatus `json:"status"`
}

// ArtifactStatus is upstream's Result<(), String>: {"ok": null} or
// {"err": "…"}.
type ArtifactStatus struct {
	Err *string `json:"err,omitempty"`
}

// MarshalJSON writes {"ok": null} for success, as upstream does.
func (s ArtifactStatus) MarshalJSON() ([]byte, error) {
	if s.Err == nil {
		return []byte(`{"ok":null}`), nil
	}
	return json.Marshal(struct {
		Err string `json:"err"`
	}{*s.Err})
}

// ManifestNonBootInventory is upstream's ManifestNonBootInventory.
type ManifestNonBootInventory struct {
	ZpoolID string `json:"zpool_id" format:"uuid"`
	Path    string `json:"path"`
	IsValid bool   `json:"is_valid"`
	Message string `json:"message"`
}

// MupdateOverrideInventory is upstream's MupdateOverrideInventory.
type MupdateOverrideInventory struct {
	BootDiskPath  string                            `json:"boot_disk_path"`
	BootOverride  MupdateOverrideBootResult         `json:"boot_override"`
	NonBootStatus []MupdateOverrideNonBootInventory `json:"non_boot_status"`
}

// MupdateOverrideBootResult is upstream's
// Result<Option<MupdateOverrideBootInventory>, String>: {"ok": …|null} or
// {"err": "…"}.
type MupdateOverrideBootResult struct {
	Ok  *MupdateOverrideBootInventory `json:"ok,omitempty"`
	Err *string                       `json:"err,omitempty"`
}

// MarshalJSON writes {"ok": null} when no override is present, as upstream
// does.
func (r MupdateOverrideBootResult) MarshalJSON() ([]byte, error) {
	if r.Err != nil {
		return json.Marshal(struct {
			Err string `json:"err"`
		}{*r.Err})
	}
	return json.Marshal(struct {
		Ok *MupdateOverrideBootInventory `json:"ok"`
	}{r.Ok})
}

// MupdateOverrideBootInventory is upstream's MupdateOverrideBootInventory.
type MupdateOverrideBootInventory struct {
	MupdateOverrideID string `json:"mupdate_override_id" format:"uuid"`
}

// MupdateOverrideNonBootInventory is upstream's
// MupdateOverrideNonBootInventory.
type MupdateOverrideNonBootInventory struct {
	ZpoolID string `json:"zpool_id" format:"uuid"`
	Path    string `json:"path"`
	IsValid bool   `json:"is_valid"`
	Message string `json:"message"`
}

// SvcsEnabledNotOnlineResult is upstream's, tagged by "type". This agent
// reports svcs_enabled_not_online from the reconciler's published zone
// states; it runs no svcs command, so it never reports svcs_cmd_error (whose
// value, upstream's SvcsError, is not modelled here).
type SvcsEnabledNotOnlineResult struct {
	Type  string                `json:"type" enum:"svcs_enabled_not_online,svcs_cmd_error,data_unavailable"`
	Value *SvcsEnabledNotOnline `json:"value,omitempty"`
}

// SvcsEnabledNotOnline is upstream's SvcsEnabledNotOnline.
type SvcsEnabledNotOnline struct {
	Services     []SvcEnabledNotOnline `json:"services"`
	Errors       []string              `json:"errors"`
	TimeOfStatus string                `json:"time_of_status" format:"date-time"`
}

// SvcEnabledNotOnline is upstream's SvcEnabledNotOnline: one service that
// should be up and is not.
type SvcEnabledNotOnline struct {
	FMRI  string `json:"fmri"`
	Zone  string `json:"zone"`
	State string `json:"state" enum:"offline,degraded,maintenance,unrecognized"`
}

// FmdResult is upstream's Result<FmdInventory, FmdInventoryError>:
// {"ok": …} or {"err": …}.
type FmdResult struct {
	Ok  *FmdInventory      `json:"ok,omitempty"`
	Err *FmdInventoryError `json:"err,omitempty"`
}

// FmdInventory is upstream's FmdInventory: the fault manager's cases and
// resources.
type FmdInventory struct {
	Cases     []FmdHostCase `json:"cases"`
	Resources []FmdResource `json:"resources"`
}

// FmdHostCase is upstream's FmdHostCase.
type FmdHostCase struct {
	UUID  string          `json:"uuid" format:"uuid"`
	Code  string          `json:"code"`
	URL   string          `json:"url"`
	Event json.RawMessage `json:"event,omitempty"`
}

// FmdResource is upstream's FmdResource.
type FmdResource struct {
	UUID      string `json:"uuid" format:"uuid"`
	CaseID    string `json:"case_id" format:"uuid"`
	FMRI      string `json:"fmri"`
	Faulty    bool   `json:"faulty"`
	Unusable  bool   `json:"unusable"`
	Invisible bool   `json:"invisible"`
}

// FmdInventoryError is upstream's FmdInventoryError.
type FmdInventoryError struct {
	Kind    string `json:"kind" enum:"fmd_error,too_many_cases,too_many_resources"`
	Message string `json:"message"`
}

// ConfigReconcilerInventory is upstream's ConfigReconcilerInventory: the
// last completed reconciliation, with the storage reconciler's latest
// results (empty when the agent manages no storage).
type ConfigReconcilerInventory struct {
	LastReconciledConfig  *sledconfig.Config              `json:"last_reconciled_config" nullable:"false"`
	ExternalDisks         map[string]ResultStatus         `json:"external_disks"`
	Datasets              map[string]ResultStatus         `json:"datasets"`
	OrphanedDatasets      []OrphanedDataset               `json:"orphaned_datasets"`
	Zones                 map[string]ResultStatus         `json:"zones"`
	BootPartitions        BootPartitionContents           `json:"boot_partitions"`
	RemoveMupdateOverride *RemoveMupdateOverrideInventory `json:"remove_mupdate_override,omitempty" doc:"The result of removing the mupdate override; absent when the config does not ask for it."`
}

// OrphanedDataset is upstream's OrphanedDataset.
type OrphanedDataset struct {
	Name      DatasetName `json:"name"`
	ID        *string     `json:"id,omitempty" nullable:"true" format:"uuid"`
	Mounted   bool        `json:"mounted"`
	Available uint64      `json:"available"`
	Used      uint64      `json:"used"`
	Reason    string      `json:"reason"`
}

// DatasetName is upstream's DatasetName.
type DatasetName struct {
	PoolName string `json:"pool_name"`
	Kind     string `json:"kind"`
}

// BootPartitionContents is upstream's BootPartitionContents: which M.2 disk
// the sled booted from and what each boot slot holds.
type BootPartitionContents struct {
	BootDisk M2SlotResult        `json:"boot_disk"`
	SlotA    BootPartitionResult `json:"slot_a"`
	SlotB    BootPartitionResult `json:"slot_b"`
}

// M2SlotResult is upstream's Result<M2Slot, String>.
type M2SlotResult struct {
	Ok  *string `json:"ok,omitempty" enum:"A,B"`
	Err *string `json:"err,omitempty"`
}

// BootPartitionResult is upstream's Result<BootPartitionDetails, String>.
type BootPartitionResult struct {
	Ok  *BootPartitionDetails `json:"ok,omitempty"`
	Err *string               `json:"err,omitempty"`
}

// BootPartitionDetails is upstream's BootPartitionDetails.
type BootPartitionDetails struct {
	Header       BootImageHeader `json:"header"`
	ArtifactHash string          `json:"artifact_hash"`
	ArtifactSize uint64          `json:"artifact_size"`
}

// BootImageHeader is upstream's BootImageHeader.
type BootImageHeader struct {
	Flags      uint64 `json:"flags"`
	DataSize   uint64 `json:"data_size"`
	ImageSize  uint64 `json:"image_size"`
	TargetSize uint64 `json:"target_size"`
	SHA256     Digest `json:"sha256"`
	ImageName  string `json:"image_name"`
}

// Digest is a SHA-256 digest as upstream sends it: an array of 32 bytes
// (encoding/json writes a Go array of bytes as numbers, but huma would
// describe it as a base64 string).
type Digest [32]uint8

// Schema describes a Digest as upstream's document does.
func (Digest) Schema(huma.Registry) *huma.Schema {
	zero := 0.0
	n := 32
	return &huma.Schema{Type: "array", Items: &huma.Schema{Type: "integer", Format: "uint8", Minimum: &zero}, MinItems: &n, MaxItems: &n}
}

// RemoveMupdateOverrideInventory is upstream's
// RemoveMupdateOverrideInventory.
type RemoveMupdateOverrideInventory struct {
	BootDiskResult RemoveMupdateOverrideBootResult `json:"boot_disk_result"`
	NonBootMessage string                          `json:"non_boot_message"`
}

// RemoveMupdateOverrideBootResult is upstream's
// Result<RemoveMupdateOverrideBootSuccessInventory, String>.
type RemoveMupdateOverrideBootResult struct {
	Ok  *string `json:"ok,omitempty" enum:"removed,no_override"`
	Err *string `json:"err,omitempty"`
}
