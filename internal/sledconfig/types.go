// Package sledconfig holds the upstream sled config types (OmicronSledConfig, its
// zones, disks and datasets), decodes them without loss, validates them and names
// zones and datasets.
package sledconfig

import (
	"encoding/json"
)

// Config is the desired state of one sled (upstream OmicronSledConfig).
//
// Parts this agent does not manage (measurements, host phase 2, mupdate
// override) are kept as raw JSON. Disks and datasets are kept as raw JSON too
// (what the API document describes), with typed views, decoded by Parse:
// DiskConfigs, DatasetConfigs, and in the storage reconciler's vocabulary
// StorageDisks and StorageDatasets. A Config produced by Parse remembers the
// canonical form of the document it came from and marshals back to exactly
// that, so nothing the control plane sent is ever lost, including fields this
// version of the agent does not know about.
type Config struct {
	Generation            uint64                     `json:"generation" doc:"Generation of this config; higher replaces lower."`
	Disks                 map[string]json.RawMessage `json:"disks" doc:"Physical disks, keyed by disk id (kept, not managed)."`
	Datasets              map[string]json.RawMessage `json:"datasets" doc:"Datasets, keyed by dataset id (kept, not managed)."`
	Zones                 map[string]Zone            `json:"zones" doc:"Zones, keyed by zone id; each key equals its zone's id."`
	Measurements          []json.RawMessage          `json:"measurements" doc:"Measurement artifacts (kept, not managed)."`
	RemoveMupdateOverride *string                    `json:"remove_mupdate_override,omitempty" nullable:"true"`
	HostPhase2            json.RawMessage            `json:"host_phase_2,omitempty"`

	// canonical is the canonical JSON of the whole document (sorted keys, compact),
	// set by Parse.
	canonical []byte
	// missing lists the required top-level members that the parsed document
	// lacks or has as null (Validate reports them).
	missing []string
	// disks and datasets are the typed views of Disks and Datasets, sorted
	// by key, set by Parse (a config built in code decodes them when
	// asked).
	disks    []item[DiskConfig]
	datasets []item[DatasetConfig]
	// zoneKeys are the keys of Zones as Parse set it, sorted. Zones is
	// the caller's to change, so Validate uses them only while they are
	// still its keys.
	zoneKeys []string
}

// DiskConfig is upstream OmicronPhysicalDiskConfig: the disk found by
// Identity is to carry the pool PoolID.
type DiskConfig struct {
	ID       string       `json:"id"`
	Identity DiskIdentity `json:"identity"`
	PoolID   string       `json:"pool_id"`
}

// DiskIdentity is upstream DiskIdentity: how a disk is found.
type DiskIdentity struct {
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
	Serial string `json:"serial"`
}

// DatasetConfig is upstream DatasetConfig: one dataset, named by pool and
// kind, with its properties.
type DatasetConfig struct {
	ID          string               `json:"id"`
	Name        DatasetName          `json:"name"`
	Compression CompressionAlgorithm `json:"compression"`
	Quota       *uint64              `json:"quota"`
	Reservation *uint64              `json:"reservation"`
}

// DatasetName is upstream DatasetName: the pool ("oxp_<uuid>") and the
// kind (upstream DatasetKind as it writes it: "crucible", "zone",
// "zone/<zone name>", "debug", ...).
type DatasetName struct {
	PoolName string `json:"pool_name"`
	Kind     string `json:"kind"`
}

// CompressionAlgorithm is upstream CompressionAlgorithm, tagged by type: on,
// off, gzip, gzip_n (with level), lz4, lzjb or zle.
type CompressionAlgorithm struct {
	Type  string `json:"type"`
	Level *uint8 `json:"level,omitempty"`
}

// Zone is one Omicron zone (upstream OmicronZoneConfig).
type Zone struct {
	ID             string       `json:"id" doc:"Zone id (UUID)."`
	FilesystemPool *string      `json:"filesystem_pool,omitempty" nullable:"true" doc:"Pool holding the zone root, oxp_<uuid> or oxi_<uuid>."`
	ZoneType       ZoneType     `json:"zone_type"`
	ImageSource    *ImageSource `json:"image_source,omitempty"`

	// hash is the SHA-256 of the zone's canonical JSON, set by Parse.
	hash string
}

// ZoneType is the tagged union upstream calls OmicronZoneType. Type selects the
// variant; each variant uses a subset of the other fields (see Validate).
type ZoneType struct {
	Type string `json:"type" enum:"boundary_ntp,clickhouse,clickhouse_keeper,clickhouse_server,cockroach_db,crucible,crucible_pantry,external_dns,internal_dns,internal_ntp,nexus,oximeter"`

	// Address is the service address "[ipv6]:port" of most zone kinds.
	Address string   `json:"address,omitempty"`
	Dataset *Dataset `json:"dataset,omitempty"`

	// boundary_ntp
	DNSServers []string `json:"dns_servers,omitempty"`
	Domain     *string  `json:"domain,omitempty" nullable:"true"`
	NTPServers []string `json:"ntp_servers,omitempty"`
	SNAT       *SNAT    `json:"snat_cfg,omitempty"`

	// boundary_ntp, external_dns, nexus
	NIC *NIC `json:"nic,omitempty"`

	// external_dns, internal_dns
	DNSAddress  string `json:"dns_address,omitempty"`
	HTTPAddress string `json:"http_address,omitempty"`

	// internal_dns
	GZAddress      string  `json:"gz_address,omitempty"`
	GZAddressIndex *uint32 `json:"gz_address_index,omitempty"`

	// nexus
	InternalAddress    string   `json:"internal_address,omitempty"`
	LockstepPort       *uint16  `json:"lockstep_port,omitempty"`
	ExternalIP         string   `json:"external_ip,omitempty"`
	ExternalTLS        *bool    `json:"external_tls,omitempty"`
	ExternalDNSServers []string `json:"external_dns_servers,omitempty"`
}

// Dataset is upstream OmicronZoneDataset.
type Dataset struct {
	PoolName string `json:"pool_name"`
}

// SNAT is upstream SourceNatConfigGeneric: an external IP and an inclusive port range.
type SNAT struct {
	IP        string `json:"ip"`
	FirstPort uint16 `json:"first_port"`
	LastPort  uint16 `json:"last_port"`
}

// ImageSource is upstream OmicronZoneImageSource: {"type":"install_dataset"} or
// {"type":"artifact","hash":"<64 hex>"}.
type ImageSource struct {
	Type string `json:"type" enum:"install_dataset,artifact"`
	Hash string `json:"hash,omitempty"`
}

// NIC is upstream NetworkInterface: the OPTE port of a zone with external
// connectivity.
type NIC struct {
	ID       string   `json:"id"`
	Kind     NICKind  `json:"kind"`
	Name     string   `json:"name"`
	IPConfig IPConfig `json:"ip_config"`
	MAC      string   `json:"mac" doc:"EUI-48 MAC address, e.g. A8:40:25:FF:80:05."`
	VNI      uint32   `json:"vni"`
	Primary  bool     `json:"primary"`
	Slot     uint8    `json:"slot"`
}

// NICKind is upstream NetworkInterfaceKind.
type NICKind struct {
	Type string `json:"type" enum:"instance,service,probe"`
	ID   string `json:"id"`
}

// IPConfig is upstream PrivateIpConfig, tagged v4, v6 or dual_stack.
type IPConfig struct {
	Type  string        `json:"type" enum:"v4,v6,dual_stack"`
	Value IPConfigValue `json:"value"`
}

// IPConfigValue carries either one private IP config (v4, v6) or both
// (dual_stack, in V4 and V6).
type IPConfigValue struct {
	IP         string     `json:"ip,omitempty"`
	Subnet     string     `json:"subnet,omitempty"`
	TransitIPs []string   `json:"transit_ips,omitempty"`
	V4         *PrivateIP `json:"v4,omitempty"`
	V6         *PrivateIP `json:"v6,omitempty"`
}

// PrivateIP is upstream PrivateIpv4Config / PrivateIpv6Config.
type PrivateIP struct {
	IP         string   `json:"ip"`
	Subnet     string   `json:"subnet"`
	TransitIPs []string `json:"transit_ips,omitempty"`
}
