// Package storage realises the storage half of a sled config: its disks
// become pools, its datasets real datasets with their properties, and it
// says, for the zone reconciler, whether a zone's storage is ready.
//
// This file holds the vocabulary shared by the storage reconciler and its
// backends (the sim runtime's, and Linux's btrfs on real or file-backed
// disks): what the config asks for, what a backend observes, and the
// Backend interface the reconciler drives.
package storage

import (
	"context"
	"fmt"
	"strings"
)

// DiskIdentity is upstream's DiskIdentity: how a configured disk is found.
type DiskIdentity struct {
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
	Serial string `json:"serial"`
}

func (d DiskIdentity) String() string {
	return fmt.Sprintf("%s/%s/%s", d.Vendor, d.Model, d.Serial)
}

// DiskConfig is one configured disk (upstream's OmicronPhysicalDiskConfig):
// the disk found by Identity carries the pool PoolID.
type DiskConfig struct {
	ID       string
	Identity DiskIdentity
	PoolID   string
}

// Compression is upstream's CompressionAlgorithm: Type "on", "off",
// "gzip", "gzip_n" (with Level 1 to 9), "lz4", "lzjb" or "zle".
type Compression struct {
	Type  string `json:"type"`
	Level int    `json:"level,omitempty"`
}

func (c Compression) String() string {
	if c.Type == "gzip_n" {
		return fmt.Sprintf("gzip-%d", c.Level)
	}
	return c.Type
}

// DatasetConfig is one configured dataset (upstream's DatasetConfig).
type DatasetConfig struct {
	ID string
	// PoolID is the pool's id (the dataset's pool_name is "oxp_<PoolID>").
	PoolID string
	// Kind is upstream's DatasetKind as a string: "crucible",
	// "cockroachdb", "debug", "zone", "zone/<zone name>", ...
	Kind        string
	Quota       *uint64
	Reservation *uint64
	Compression Compression
}

// Name is the dataset's full name, as upstream names it.
func (d DatasetConfig) Name() string { return DatasetName(d.PoolID, d.Kind) }

// DatasetName is upstream's full name of the dataset of kind on the pool:
// "oxp_<pool>/crypt/<kind>", except crucible and local_storage_unencrypted
// datasets, which are not encrypted: "oxp_<pool>/<kind>".
func DatasetName(poolID, kind string) string {
	if kind == "crucible" || kind == "local_storage_unencrypted" {
		return PoolName(poolID) + "/" + kind
	}
	return PoolName(poolID) + "/crypt/" + kind
}

// PoolName is upstream's name of an external pool: "oxp_<id>".
func PoolName(poolID string) string { return "oxp_" + poolID }

// PoolIDFromName returns the id in an external pool's name "oxp_<id>".
func PoolIDFromName(name string) (string, bool) {
	id, ok := strings.CutPrefix(name, "oxp_")
	return id, ok && id != ""
}

// DiskVariant is upstream's DiskVariant: "U2" or "M2".
type DiskVariant string

const (
	VariantU2 DiskVariant = "U2"
	VariantM2 DiskVariant = "M2"
)

// Content is what a backend found on a disk.
type Content string

const (
	// ContentBlank: nothing on it; a pool may be made there.
	ContentBlank Content = "blank"
	// ContentPool: one of our pools, with Disk.PoolID.
	ContentPool Content = "pool"
	// ContentForeign: something we did not make (a filesystem, a
	// partition table); never touched.
	ContentForeign Content = "foreign"
)

// Firmware is what inventory reports of a disk's firmware slots
// (upstream's InventoryDisk fields).
type Firmware struct {
	ActiveSlot    uint8     `json:"active_slot"`
	NextActive    *uint8    `json:"next_active,omitempty"`
	Slots         uint8     `json:"slots"`
	Slot1ReadOnly bool      `json:"slot1_read_only"`
	Versions      []*string `json:"versions"`
}

// Disk is one disk a backend observes.
type Disk struct {
	Identity DiskIdentity `json:"identity"`
	Variant  DiskVariant  `json:"variant"`
	// Slot is the disk's physical slot (upstream's i64), or the index of a
	// file-backed disk.
	Slot int64 `json:"slot"`
	// Path is the device, for people ("/dev/loop7").
	Path     string   `json:"path"`
	Content  Content  `json:"content"`
	PoolID   string   `json:"pool_id,omitempty"` // Content pool
	Foreign  string   `json:"foreign,omitempty"` // Content foreign: what was found, for people
	Size     uint64   `json:"size"`              // bytes
	Firmware Firmware `json:"firmware"`
}

// Pool is one of our pools, opened.
type Pool struct {
	ID string `json:"id"`
	// Mountpoint is where its datasets are, on backends that mount.
	Mountpoint string `json:"mountpoint,omitempty"`
	TotalSize  uint64 `json:"total_size"`
	// Health is upstream's ZpoolHealth: "online", "degraded", "faulted",
	// "offline", "removed" or "unavailable".
	Health string `json:"health"`
}

// Dataset is one dataset a backend observes.
type Dataset struct {
	// Name is its full name ("oxp_<pool>/crypt/debug").
	Name string `json:"name"`
	// ID is the id recorded with it, "" if none.
	ID string `json:"id,omitempty"`
	// Path is where its files are.
	Path        string      `json:"path"`
	Quota       *uint64     `json:"quota,omitempty"`
	Reservation *uint64     `json:"reservation,omitempty"`
	Compression Compression `json:"compression"`
	Used        uint64      `json:"used"`
	Available   uint64      `json:"available"`
	Mounted     bool        `json:"mounted"`
}

// Backend is what the storage reconciler needs of the machine. Every
// method honours ctx's deadline: an implementation whose work can block
// (a command, a syscall on a dead disk) gives up at the deadline, killing
// what it started. Methods on different disks may run at once.
type Backend interface {
	// Disks lists the disks present and what each holds. It writes
	// nothing.
	Disks(ctx context.Context) ([]Disk, error)
	// CreatePool makes a pool with poolID on a blank disk, and refuses
	// (without writing) a disk that is not blank.
	CreatePool(ctx context.Context, disk DiskIdentity, poolID string) error
	// OpenPool makes the pool poolID on disk usable, adopting it as it is:
	// nothing on it is formatted or wiped.
	OpenPool(ctx context.Context, disk DiskIdentity, poolID string) (Pool, error)
	// ClosePool stops using a pool that is no longer managed. It destroys
	// nothing. A pool that is not open is not an error (the reconciler
	// closes, once, the pools it finds on disks the config does not name).
	ClosePool(ctx context.Context, poolID string) error
	// Datasets lists the datasets of an open pool.
	Datasets(ctx context.Context, poolID string) ([]Dataset, error)
	// EnsureDataset creates the dataset if it is missing, recording its id,
	// and sets its quota, reservation and compression where they differ
	// (and only those). A dataset that exists with another recorded id is
	// an error wrapping ErrOtherID, and is left as it is.
	EnsureDataset(ctx context.Context, want DatasetConfig) (Dataset, error)
	// DestroyDataset destroys a dataset of an open pool and everything in
	// it. A dataset that does not exist is not an error.
	DestroyDataset(ctx context.Context, poolID, name string) error
}

// Errors that drive the reconciler's decisions; backends wrap them.
var (
	// ErrOtherID: the dataset exists with another recorded id.
	ErrOtherID = errorString("dataset exists with another id")
	// ErrNotBlank: CreatePool was given a disk that is not blank.
	ErrNotBlank = errorString("disk is not blank")
	// ErrNoDisk: the disk is not present.
	ErrNoDisk = errorString("disk not found")
)

type errorString string

func (e errorString) Error() string { return string(e) }
