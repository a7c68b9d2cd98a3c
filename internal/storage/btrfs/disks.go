package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// blockDev is one disk found: a real one in sysfs, or a synthetic one.
type blockDev struct {
	name     string // sysfs name: "nvme0n1", "loop3"
	path     string // "/dev/nvme0n1"
	identity storage.DiskIdentity
	variant  storage.DiskVariant
	slot     int64
	firmware storage.Firmware
	vdev     string // synthetic: the backing file
}

// Upstream's synthetic disks (sled-storage's RawSyntheticDisk): a file
// u2_<name>.vdev or m2_<name>.vdev is a disk with these identity strings,
// in a slot offset by 1024 so that it never collides with a real one.
const (
	syntheticVendor     = "synthetic-vendor"
	syntheticSerial     = "synthetic-serial-"
	syntheticModel      = "synthetic-model-"
	syntheticSlotOffset = 1024
)

// parseVdevName returns the name and variant of a synthetic disk file.
func parseVdevName(file string) (name string, variant storage.DiskVariant, ok bool) {
	base, ok := strings.CutSuffix(file, ".vdev")
	if !ok {
		return "", "", false
	}
	if n, ok := strings.CutPrefix(base, "u2_"); ok && component.MatchString(n) {
		return n, storage.VariantU2, true
	}
	if n, ok := strings.CutPrefix(base, "m2_"); ok && component.MatchString(n) {
		return n, storage.VariantM2, true
	}
	return "", "", false
}

// VdevIdentity is the identity Disks reports for the synthetic disk file
// named file (u2_<name>.vdev, m2_<name>.vdev) in the vdev dir; ok is false
// for a name that is not a synthetic disk's. A sled config names the disk
// by this identity.
func VdevIdentity(file string) (id storage.DiskIdentity, ok bool) {
	name, v, ok := parseVdevName(file)
	if !ok {
		return storage.DiskIdentity{}, false
	}
	return syntheticIdentity(name, v), true
}

func syntheticIdentity(name string, v storage.DiskVariant) storage.DiskIdentity {
	return storage.DiskIdentity{
		Vendor: syntheticVendor,
		Serial: syntheticSerial + name,
		Model:  syntheticModel + string(v),
	}
}

// vdevFiles lists the synthetic disks in VdevDir (sorted; each one's slot
// is its index plus upstream's offset), without attaching them.
func (b *Backend) vdevFiles() ([]blockDev, error) {
	if b.opts.VdevDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(b.opts.VdevDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("vdev dir: %w", err)
	}
	var out []blockDev
	for _, e := range ents { // ReadDir sorts by name
		name, v, ok := parseVdevName(e.Name())
		if !ok || !e.Type().IsRegular() || !strings.HasPrefix(name, b.opts.Tag) {
			continue
		}
		out = append(out, blockDev{
			identity: syntheticIdentity(name, v),
			variant:  v,
			slot:     syntheticSlotOffset + int64(len(out)),
			vdev:     filepath.Join(b.opts.VdevDir, e.Name()),
			firmware: storage.Firmware{ActiveSlot: 1, Slots: 1},
		})
	}
	return out, nil
}

// skipped are sysfs block devices that are not disks.
var skipped = []string{"loop", "ram", "dm-", "zram", "sr", "fd", "md", "nbd"}

// sysfsDisks lists the real disks in a sysfs block directory by identity.
// A disk without a serial cannot be told apart from another and is left
// out. Every real disk is reported as a U.2: Linux does not say which
// bay a disk is in.
func sysfsDisks(root string) ([]blockDev, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("sysfs: %w", err)
	}
	var out []blockDev
	for _, e := range ents {
		name := e.Name()
		if hasAnyPrefix(name, skipped) {
			continue
		}
		dir := filepath.Join(root, name)
		if exists(filepath.Join(dir, "partition")) || readTrim(filepath.Join(dir, "hidden")) == "1" {
			continue
		}
		var id storage.DiskIdentity
		var fw storage.Firmware
		if strings.HasPrefix(name, "nvme") {
			id.Model = readTrim(filepath.Join(dir, "device", "model"))
			id.Serial = readTrim(filepath.Join(dir, "device", "serial"))
			id.Vendor = firstOf(dir, "device/vendor", "device/device/vendor", "device/subsystem_vendor", "device/device/subsystem_vendor")
			if rev := readTrim(filepath.Join(dir, "device", "firmware_rev")); rev != "" {
				fw = storage.Firmware{ActiveSlot: 1, Slots: 1, Versions: []*string{&rev}}
			}
		} else {
			id.Vendor = firstOf(dir, "device/vendor", "device/subsystem_vendor")
			id.Model = firstOf(dir, "device/model")
			id.Serial = firstOf(dir, "device/serial", "serial")
			if id.Serial == "" {
				id.Serial = vpdSerial(filepath.Join(dir, "device", "vpd_pg80"))
			}
			if id.Serial == "" {
				id.Serial = firstOf(dir, "device/wwid", "wwid")
			}
			if rev := firstOf(dir, "device/rev", "device/firmware_rev"); rev != "" {
				fw = storage.Firmware{ActiveSlot: 1, Slots: 1, Versions: []*string{&rev}}
			}
		}
		id.Vendor = strings.TrimPrefix(id.Vendor, "0x") // a PCI vendor id
		if id.Serial == "" {
			continue
		}
		out = append(out, blockDev{
			name: name, path: "/dev/" + name, identity: id,
			variant: storage.VariantU2, slot: int64(len(out)), firmware: fw,
		})
	}
	return out, nil
}

// vpdSerial reads the unit serial number from a SCSI VPD page 0x80.
func vpdSerial(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	return strings.TrimSpace(string(b[4:min(len(b), 4+n)]))
}

// devices lists every disk, attaching each synthetic one to a loop device.
// A synthetic disk that cannot be attached is left out and logged.
func (b *Backend) devices(ctx context.Context) ([]blockDev, error) {
	var out []blockDev
	if b.opts.Tag == "" {
		real, err := sysfsDisks(b.opts.SysBlock)
		if err != nil {
			return nil, err
		}
		out = append(out, real...)
	}
	vdevs, err := b.vdevFiles()
	if err != nil {
		return nil, err
	}
	for _, d := range vdevs {
		dev, err := b.loopOf(ctx, d.vdev)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			b.log.Warn("synthetic disk not attached", "file", d.vdev, "err", err)
			continue
		}
		d.path, d.name = dev, filepath.Base(dev)
		out = append(out, d)
	}
	return out, nil
}

// find returns the disk with identity id, ErrNoDisk if it is not present.
func (b *Backend) find(ctx context.Context, id storage.DiskIdentity) (blockDev, error) {
	if id.Vendor == syntheticVendor {
		vdevs, err := b.vdevFiles()
		if err != nil {
			return blockDev{}, err
		}
		for _, d := range vdevs {
			if d.identity == id {
				dev, err := b.loopOf(ctx, d.vdev)
				if err != nil {
					return blockDev{}, fmt.Errorf("disk %s: %w", id, err)
				}
				d.path, d.name = dev, filepath.Base(dev)
				return d, nil
			}
		}
		return blockDev{}, fmt.Errorf("disk %s: %w", id, storage.ErrNoDisk)
	}
	if b.opts.Tag == "" {
		real, err := sysfsDisks(b.opts.SysBlock)
		if err != nil {
			return blockDev{}, err
		}
		for _, d := range real {
			if d.identity == id {
				return d, nil
			}
		}
	}
	return blockDev{}, fmt.Errorf("disk %s: %w", id, storage.ErrNoDisk)
}

// Disks lists the disks present and what each holds, reading (never
// writing) the start of each, all at once, each under ProbeTimeout. A disk
// that cannot be read in time is reported foreign, with why: it is never
// written, and the next call looks again.
func (b *Backend) Disks(ctx context.Context) ([]storage.Disk, error) {
	devs, err := b.devices(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]storage.Disk, len(devs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, b.opts.ProbeTimeout)
			defer cancel()
			disk := storage.Disk{
				Identity: d.identity, Variant: d.variant, Slot: d.slot, Path: d.path,
				Firmware: d.firmware, Size: sysSize(b.opts.SysBlock, d.name),
			}
			if d.vdev != "" {
				disk.Size = sysSize(sysBlock, d.name)
			}
			c, err := b.probe(pctx, d.path)
			if err != nil {
				c = content{kind: storage.ContentForeign, what: "unreadable: " + err.Error()}
			}
			disk.Content, disk.PoolID, disk.Foreign = c.kind, c.poolID, c.what
			out[i] = disk
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out, nil
}

// sysSize is a block device's size in bytes from sysfs (0 if unknown).
func sysSize(sysBlock, name string) uint64 {
	n, err := strconv.ParseUint(readTrim(filepath.Join(sysBlock, name, "size")), 10, 64)
	if err != nil {
		return 0
	}
	return n * 512
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// firstOf returns the first non-empty of dir's files rel.
func firstOf(dir string, rel ...string) string {
	for _, r := range rel {
		if s := readTrim(filepath.Join(dir, r)); s != "" {
			return s
		}
	}
	return ""
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// loopOf returns the loop device of the synthetic disk file, as loopFor
// does. The device it returned last time for the same file is checked
// first (it is still backed by the whole file), rather than every loop
// device's backing file read again: with a loop device per disk, each
// disk's pass would read them all.
func (b *Backend) loopOf(ctx context.Context, file string) (string, error) {
	abs, err := filepath.EvalSymlinks(file)
	if err == nil {
		b.mu.Lock()
		dev, ok := b.loops[abs]
		b.mu.Unlock()
		if ok && backedBy(dev, abs) {
			return dev, nil
		}
	}
	dev, err := b.loopFor(ctx, file)
	if err == nil && abs != "" {
		b.mu.Lock()
		b.loops[abs] = dev
		b.mu.Unlock()
	}
	return dev, err
}

// backedBy reports whether loop device dev is backed by the whole of file,
// as findLoop requires.
func backedBy(dev, file string) bool {
	dir := filepath.Join(sysBlock, filepath.Base(dev), "loop")
	whole := func(v string) bool { return v == "" || v == "0" }
	return readTrim(filepath.Join(dir, "backing_file")) == file &&
		whole(readTrim(filepath.Join(dir, "offset"))) && whole(readTrim(filepath.Join(dir, "sizelimit")))
}
