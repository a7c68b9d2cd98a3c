package sim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// The simulated machine's storage: the disks the agent is told are there
// (AddDisks), one pool per disk at most, datasets in pools. It is kept in
// the state file with the zones, so a restarted agent finds its pools and
// datasets as it left them and adopts them. Faults ("disks" in the fault
// map) make one disk's calls hang, fail or take long, or pull the disk out.
// A disk pulled out or put back (its "present" fault) or added is a
// hardware event (DiskEvents), as a real disk's is on Linux.

var (
	_ storage.Backend     = (*Runtime)(nil)
	_ storage.DiskWatcher = (*Runtime)(nil)
)

// DiskSize is the size of every simulated disk.
const DiskSize = 1 << 40

// poolRoot is where simulated pools say they are mounted.
const poolRoot = "/sim/pool/ext/"

type simDisk struct {
	id   storage.DiskIdentity
	slot int64
}

type simPool struct {
	id       string
	disk     storage.DiskIdentity
	open     bool
	datasets map[string]*simDataset // by full name
}

type simDataset struct {
	name, id    string
	quota       *uint64
	reservation *uint64
	compression storage.Compression
}

// AddDisks puts disks into the simulated machine. The sim does not know the
// sled config: whoever wires it up tells it the configured disks, and every
// one of them is there unless a fault says otherwise ("present": false).
// Disks are never taken out again: a disk dropped from the config stays in
// the machine with its pool, as a real one would.
func (r *Runtime) AddDisks(ids ...storage.DiskIdentity) error {
	r.mu.Lock()
	for _, id := range ids {
		if _, ok := r.disks[id]; ok {
			continue
		}
		r.disks[id] = &simDisk{id: id, slot: int64(len(r.disks))}
		r.changedLocked()
		r.listingChangedLocked()
		r.diskEventLocked()
	}
	r.mu.Unlock()
	return r.persist()
}

// DiskEvents reports, until ctx ends, every disk pulled out or put back by
// the fault map, and every disk added: one value may stand for several.
// The channel is closed when ctx ends.
func (r *Runtime) DiskEvents(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	r.mu.Lock()
	r.diskWatch = append(r.diskWatch, ch)
	r.mu.Unlock()
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.diskWatch = slices.DeleteFunc(r.diskWatch, func(c chan struct{}) bool { return c == ch })
		close(ch)
	})
	return ch
}

// diskEventLocked tells every DiskEvents channel; it never blocks.
func (r *Runtime) diskEventLocked() {
	for _, ch := range r.diskWatch {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// presenceChanged reports whether a disk is pulled out in one fault map
// and not in the other.
func presenceChanged(old, new map[string]diskFaults) bool {
	for serial, f := range new {
		if old[serial].absent != f.absent {
			return true
		}
	}
	for serial, f := range old {
		if _, ok := new[serial]; !ok && f.absent {
			return true
		}
	}
	return false
}

func (r *Runtime) recordStorageLocked(op, target string) {
	if r.opts.RecordCalls {
		r.calls = append(r.calls, Call{Op: op, Target: target})
	}
}

// variant says what kind a simulated disk is: M.2 if its model ends in
// "M2" (as upstream's synthetic disks' "synthetic-model-M2" do), else U.2.
func variant(id storage.DiskIdentity) storage.DiskVariant {
	if strings.HasSuffix(id.Model, "M2") {
		return storage.VariantM2
	}
	return storage.VariantU2
}

// Disks lists the disks present and what each holds. The listing is made
// once per change of the disks, their pools or the faults, not per call.
func (r *Runtime) Disks(ctx context.Context) ([]storage.Disk, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordStorageLocked("disks", "")
	if !r.listed {
		r.listing, r.listed = r.listLocked(), true
	}
	return slices.Clone(r.listing), nil
}

// listingChangedLocked notes that Disks' answer is to be made again.
func (r *Runtime) listingChangedLocked() { r.listing, r.listed = nil, false }

// listLocked lists the disks present, by slot.
func (r *Runtime) listLocked() []storage.Disk {
	poolOn := make(map[storage.DiskIdentity]*simPool, len(r.pools))
	for _, p := range r.pools {
		poolOn[p.disk] = p
	}
	var out []storage.Disk
	for id, d := range r.disks {
		if r.diskFaults[id.Serial].absent {
			continue
		}
		disk := storage.Disk{Identity: id, Variant: variant(id), Slot: d.slot, Path: "/dev/sim/" + id.Serial, Content: storage.ContentBlank, Size: DiskSize}
		if p := poolOn[id]; p != nil {
			disk.Content, disk.PoolID = storage.ContentPool, p.id
		}
		out = append(out, disk)
	}
	slices.SortFunc(out, func(a, b storage.Disk) int { return cmp.Compare(a.Slot, b.Slot) })
	return out
}

func (r *Runtime) poolOnLocked(id storage.DiskIdentity) *simPool {
	for _, p := range r.pools {
		if p.disk == id {
			return p
		}
	}
	return nil
}

// gate records a storage call on a disk's behalf and applies that disk's
// faults: an absent disk is ErrNoDisk; ensure hangs, fails or delays. No
// lock is held while it waits.
func (r *Runtime) gate(ctx context.Context, op, target string, disk storage.DiskIdentity) error {
	r.mu.Lock()
	r.recordStorageLocked(op, target)
	f := r.diskFaults[disk.Serial]
	_, known := r.disks[disk]
	r.mu.Unlock()
	if !known || f.absent {
		return fmt.Errorf("disk %s: %w", disk, storage.ErrNoDisk)
	}
	b := f.ensure
	switch {
	case b.fail:
		return fmt.Errorf("disk %s: %w", disk, ErrInjected)
	case b.hang:
		<-ctx.Done()
		return fmt.Errorf("disk %s does not answer (sim fault): %w", disk, ctx.Err())
	case b.delay > 0:
		t := time.NewTimer(b.delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("disk %s is slow (sim fault): %w", disk, ctx.Err())
		case <-t.C:
		}
	}
	return ctx.Err()
}

// poolDisk returns the disk of a pool (the zero identity if there is no
// such pool).
func (r *Runtime) poolDisk(poolID string) storage.DiskIdentity {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pools[poolID]; ok {
		return p.disk
	}
	return storage.DiskIdentity{}
}

// openPoolLocked returns a pool that is open.
func (r *Runtime) openPoolLocked(poolID string) (*simPool, error) {
	p, ok := r.pools[poolID]
	if !ok || !p.open {
		return nil, fmt.Errorf("pool %s is not open", storage.PoolName(poolID))
	}
	return p, nil
}

// CreatePool makes a pool on a blank disk.
func (r *Runtime) CreatePool(ctx context.Context, disk storage.DiskIdentity, poolID string) error {
	if err := r.gate(ctx, "create_pool", storage.PoolName(poolID), disk); err != nil {
		return err
	}
	r.mu.Lock()
	if p := r.poolOnLocked(disk); p != nil {
		r.mu.Unlock()
		return fmt.Errorf("disk %s holds pool %s: %w", disk, storage.PoolName(p.id), storage.ErrNotBlank)
	}
	if p, ok := r.pools[poolID]; ok {
		r.mu.Unlock()
		return fmt.Errorf("pool %s exists on disk %s", storage.PoolName(poolID), p.disk)
	}
	r.pools[poolID] = &simPool{id: poolID, disk: disk, datasets: map[string]*simDataset{}}
	r.changedLocked()
	r.listingChangedLocked()
	r.mu.Unlock()
	return r.persist()
}

// OpenPool opens the pool poolID on disk, as it is.
func (r *Runtime) OpenPool(ctx context.Context, disk storage.DiskIdentity, poolID string) (storage.Pool, error) {
	if err := r.gate(ctx, "open_pool", storage.PoolName(poolID), disk); err != nil {
		return storage.Pool{}, err
	}
	r.mu.Lock()
	p, ok := r.pools[poolID]
	if !ok || p.disk != disk {
		r.mu.Unlock()
		return storage.Pool{}, fmt.Errorf("disk %s holds no pool %s", disk, storage.PoolName(poolID))
	}
	if !p.open {
		p.open = true
		r.changedLocked()
	}
	r.mu.Unlock()
	return storage.Pool{ID: poolID, Mountpoint: poolRoot + poolID, TotalSize: DiskSize, Health: "online"}, r.persist()
}

// ClosePool closes a pool; a pool that is not open (or does not exist) is
// not an error. Nothing is destroyed.
func (r *Runtime) ClosePool(ctx context.Context, poolID string) error {
	disk := r.poolDisk(poolID)
	if disk == (storage.DiskIdentity{}) {
		r.mu.Lock()
		r.recordStorageLocked("close_pool", storage.PoolName(poolID))
		r.mu.Unlock()
		return ctx.Err()
	}
	if err := r.gate(ctx, "close_pool", storage.PoolName(poolID), disk); err != nil {
		return err
	}
	r.mu.Lock()
	if p, ok := r.pools[poolID]; ok && p.open {
		p.open = false
		r.changedLocked()
	}
	r.mu.Unlock()
	return r.persist()
}

// Datasets lists the datasets of an open pool.
func (r *Runtime) Datasets(ctx context.Context, poolID string) ([]storage.Dataset, error) {
	if err := r.gate(ctx, "datasets", storage.PoolName(poolID), r.poolDisk(poolID)); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.openPoolLocked(poolID)
	if err != nil {
		return nil, err
	}
	out := make([]storage.Dataset, 0, len(p.datasets))
	for _, d := range p.datasets {
		out = append(out, d.observed(poolID))
	}
	slices.SortFunc(out, func(a, b storage.Dataset) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (d *simDataset) observed(poolID string) storage.Dataset {
	avail := uint64(DiskSize)
	if d.quota != nil {
		avail = *d.quota
	}
	return storage.Dataset{
		Name: d.name, ID: d.id,
		Path:  poolRoot + poolID + "/" + strings.TrimPrefix(d.name, storage.PoolName(poolID)+"/"),
		Quota: d.quota, Reservation: d.reservation, Compression: d.compression,
		Available: avail, Mounted: true,
	}
}

// EnsureDataset creates a dataset, or sets the properties that differ. A
// zone's root ("zone/<name>") needs the transient zone root ("zone").
func (r *Runtime) EnsureDataset(ctx context.Context, want storage.DatasetConfig) (storage.Dataset, error) {
	name := want.Name()
	if err := r.gate(ctx, "ensure_dataset", name, r.poolDisk(want.PoolID)); err != nil {
		return storage.Dataset{}, err
	}
	r.mu.Lock()
	p, err := r.openPoolLocked(want.PoolID)
	if err != nil {
		r.mu.Unlock()
		return storage.Dataset{}, err
	}
	if storage.IsZoneRoot(want.Kind) {
		if _, ok := p.datasets[storage.DatasetName(want.PoolID, "zone")]; !ok {
			r.mu.Unlock()
			return storage.Dataset{}, fmt.Errorf("dataset %s: its parent %s does not exist", name, storage.DatasetName(want.PoolID, "zone"))
		}
	}
	d, ok := p.datasets[name]
	switch {
	case ok && d.id != "" && d.id != want.ID:
		r.mu.Unlock()
		return storage.Dataset{}, fmt.Errorf("dataset %s has id %s: %w", name, d.id, storage.ErrOtherID)
	case !ok:
		d = &simDataset{name: name}
		p.datasets[name] = d
		r.changedLocked()
	}
	if d.id != want.ID {
		d.id = want.ID
		r.changedLocked()
	}
	if !sameSize(d.quota, want.Quota) {
		d.quota = clonePtr(want.Quota)
		r.changedLocked()
	}
	if !sameSize(d.reservation, want.Reservation) {
		d.reservation = clonePtr(want.Reservation)
		r.changedLocked()
	}
	if d.compression != want.Compression {
		d.compression = want.Compression
		r.changedLocked()
	}
	obs := d.observed(want.PoolID)
	r.mu.Unlock()
	return obs, r.persist()
}

// DestroyDataset destroys a dataset and the datasets inside it; one that
// does not exist is not an error.
func (r *Runtime) DestroyDataset(ctx context.Context, poolID, name string) error {
	if err := r.gate(ctx, "destroy_dataset", name, r.poolDisk(poolID)); err != nil {
		return err
	}
	r.mu.Lock()
	p, err := r.openPoolLocked(poolID)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	for n := range p.datasets {
		if n == name || strings.HasPrefix(n, name+"/") {
			delete(p.datasets, n)
			r.changedLocked()
		}
	}
	r.mu.Unlock()
	return r.persist()
}

func sameSize(a, b *uint64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func clonePtr(p *uint64) *uint64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
