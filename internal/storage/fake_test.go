package storage_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// fakeBackend is an in-memory machine of disks, pools and datasets that
// records every call and can make the calls on one disk hang or fail.
type fakeBackend struct {
	mu     sync.Mutex
	disks  map[string]*storage.Disk // by serial; Content blank or foreign
	pools  map[string]*fakePool     // by pool id
	calls  []call
	hang   map[string]bool // by serial: its pool and dataset calls hang until their deadline
	hangOp string          // if set, only calls of this op hang
	// stuck: hanging calls do not heed cancellation either, only their
	// deadline, as a call in the kernel on a dead disk may not.
	stuck bool
	fail  map[string]error // by serial: its pool and dataset calls fail
	// delay is how long a call takes, by "op target"
	// ("open_pool oxp_pool-a").
	delay    map[string]time.Duration
	listFail error
}

type fakePool struct {
	serial   string
	open     bool
	datasets map[string]storage.Dataset
}

type call struct {
	at     time.Time
	op     string
	target string
}

func (c call) String() string { return strings.TrimSpace(c.op + " " + c.target) }

func newFake() *fakeBackend {
	return &fakeBackend{disks: map[string]*storage.Disk{}, pools: map[string]*fakePool{}, hang: map[string]bool{}, fail: map[string]error{}, delay: map[string]time.Duration{}}
}

func ident(serial string) storage.DiskIdentity {
	return storage.DiskIdentity{Vendor: "v", Model: "m", Serial: serial}
}

// addDisk puts a blank U.2 disk in the machine.
func (b *fakeBackend) addDisk(serial string) *storage.Disk {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := &storage.Disk{Identity: ident(serial), Variant: storage.VariantU2, Content: storage.ContentBlank, Size: 1 << 40, Path: "/dev/" + serial}
	b.disks[serial] = d
	return d
}

// addPool puts one of our pools on a disk, closed, with datasets.
func (b *fakeBackend) addPool(serial, poolID string, datasets ...storage.Dataset) {
	b.addDisk(serial)
	b.mu.Lock()
	defer b.mu.Unlock()
	p := &fakePool{serial: serial, datasets: map[string]storage.Dataset{}}
	for _, d := range datasets {
		d.Path = "/pool/ext/" + d.Name
		p.datasets[d.Name] = d
	}
	b.pools[poolID] = p
}

func (b *fakeBackend) setHang(serial string, hang bool) {
	b.mu.Lock()
	b.hang[serial] = hang
	b.mu.Unlock()
}

func (b *fakeBackend) setDelay(op, target string, d time.Duration) {
	b.mu.Lock()
	b.delay[op+" "+target] = d
	b.mu.Unlock()
}

// removeDisk pulls a disk out of the machine: listings no longer show it.
func (b *fakeBackend) removeDisk(serial string) {
	b.mu.Lock()
	delete(b.disks, serial)
	b.mu.Unlock()
}

func (b *fakeBackend) setFail(serial string, err error) {
	b.mu.Lock()
	b.fail[serial] = err
	b.mu.Unlock()
}

// transcript returns the calls since index from, as "op target".
func (b *fakeBackend) transcript(from int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, c := range b.calls[min(from, len(b.calls)):] {
		out = append(out, c.String())
	}
	return out
}

func (b *fakeBackend) ncalls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// callTimes returns when each call with op on target was made.
func (b *fakeBackend) callTimes(op, target string) []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []time.Time
	for _, c := range b.calls {
		if c.op == op && c.target == target {
			out = append(out, c.at)
		}
	}
	return out
}

func (b *fakeBackend) dataset(poolID, name string) (storage.Dataset, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.pools[poolID]
	if !ok {
		return storage.Dataset{}, false
	}
	d, ok := p.datasets[name]
	return d, ok
}

// gate records a call and applies the disk's faults; it returns with b.mu
// held on success.
func (b *fakeBackend) gate(ctx context.Context, op, target, serial string) error {
	b.mu.Lock()
	b.calls = append(b.calls, call{at: time.Now(), op: op, target: target})
	hang, fail, delay := b.hang[serial] && (b.hangOp == "" || b.hangOp == op), b.fail[serial], b.delay[op+" "+target]
	b.mu.Unlock()
	if hang && b.stuck {
		if dl, ok := ctx.Deadline(); ok {
			time.Sleep(time.Until(dl))
		}
		return context.DeadlineExceeded
	}
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	if fail != nil {
		return fail
	}
	b.mu.Lock()
	return nil
}

func (b *fakeBackend) Disks(ctx context.Context) ([]storage.Disk, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, call{at: time.Now(), op: "disks"})
	if b.listFail != nil {
		return nil, b.listFail
	}
	poolOn := make(map[string]string, len(b.pools)) // pool id by serial
	for id, p := range b.pools {
		poolOn[p.serial] = id
	}
	var out []storage.Disk
	for _, serial := range slices.Sorted(maps.Keys(b.disks)) {
		d := *b.disks[serial]
		if id, ok := poolOn[serial]; ok {
			d.Content, d.PoolID = storage.ContentPool, id
		}
		out = append(out, d)
	}
	return out, nil
}

func (b *fakeBackend) CreatePool(ctx context.Context, disk storage.DiskIdentity, poolID string) error {
	if err := b.gate(ctx, "create_pool", storage.PoolName(poolID), disk.Serial); err != nil {
		return err
	}
	defer b.mu.Unlock()
	d, ok := b.disks[disk.Serial]
	if !ok {
		return storage.ErrNoDisk
	}
	for _, p := range b.pools {
		if p.serial == disk.Serial {
			return storage.ErrNotBlank
		}
	}
	if d.Content != storage.ContentBlank {
		return storage.ErrNotBlank
	}
	b.pools[poolID] = &fakePool{serial: disk.Serial, datasets: map[string]storage.Dataset{}}
	return nil
}

func (b *fakeBackend) OpenPool(ctx context.Context, disk storage.DiskIdentity, poolID string) (storage.Pool, error) {
	if err := b.gate(ctx, "open_pool", storage.PoolName(poolID), disk.Serial); err != nil {
		return storage.Pool{}, err
	}
	defer b.mu.Unlock()
	p, ok := b.pools[poolID]
	if !ok || p.serial != disk.Serial {
		return storage.Pool{}, fmt.Errorf("no pool %s on disk %s", poolID, disk)
	}
	p.open = true
	return storage.Pool{ID: poolID, Mountpoint: "/pool/ext/" + poolID, TotalSize: 1 << 40, Health: "online"}, nil
}

func (b *fakeBackend) serialOf(poolID string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.pools[poolID]; ok {
		return p.serial
	}
	return ""
}

func (b *fakeBackend) ClosePool(ctx context.Context, poolID string) error {
	if err := b.gate(ctx, "close_pool", storage.PoolName(poolID), b.serialOf(poolID)); err != nil {
		return err
	}
	defer b.mu.Unlock()
	if p, ok := b.pools[poolID]; ok {
		p.open = false
	}
	return nil
}

func (b *fakeBackend) openPool(poolID string) (*fakePool, error) {
	p, ok := b.pools[poolID]
	if !ok || !p.open {
		return nil, fmt.Errorf("pool %s is not open", poolID)
	}
	return p, nil
}

func (b *fakeBackend) Datasets(ctx context.Context, poolID string) ([]storage.Dataset, error) {
	if err := b.gate(ctx, "datasets", storage.PoolName(poolID), b.serialOf(poolID)); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	p, err := b.openPool(poolID)
	if err != nil {
		return nil, err
	}
	return slices.Collect(maps.Values(p.datasets)), nil
}

func (b *fakeBackend) EnsureDataset(ctx context.Context, want storage.DatasetConfig) (storage.Dataset, error) {
	name := want.Name()
	if err := b.gate(ctx, "ensure_dataset", name, b.serialOf(want.PoolID)); err != nil {
		return storage.Dataset{}, err
	}
	defer b.mu.Unlock()
	p, err := b.openPool(want.PoolID)
	if err != nil {
		return storage.Dataset{}, err
	}
	if parent, _, ok := strings.Cut(name, "/crypt/zone/"); ok {
		if _, ok := p.datasets[parent+"/crypt/zone"]; !ok {
			return storage.Dataset{}, errors.New("parent dataset does not exist")
		}
	}
	d, ok := p.datasets[name]
	if ok && d.ID != "" && d.ID != want.ID {
		return storage.Dataset{}, fmt.Errorf("dataset %s: %w", name, storage.ErrOtherID)
	}
	d.Name, d.ID, d.Path, d.Mounted = name, want.ID, "/pool/ext/"+name, true
	d.Quota, d.Reservation, d.Compression = want.Quota, want.Reservation, want.Compression
	p.datasets[name] = d
	return d, nil
}

func (b *fakeBackend) DestroyDataset(ctx context.Context, poolID, name string) error {
	if err := b.gate(ctx, "destroy_dataset", name, b.serialOf(poolID)); err != nil {
		return err
	}
	defer b.mu.Unlock()
	p, err := b.openPool(poolID)
	if err != nil {
		return err
	}
	delete(p.datasets, name)
	return nil
}

var _ storage.Backend = (*fakeBackend)(nil)

// harness runs a reconciler over a backend inside a synctest bubble.
type harness struct {
	t      *testing.T
	b      *fakeBackend
	r      *storage.Reconciler
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, b *fakeBackend, opts storage.Options) *harness {
	t.Helper()
	h := &harness{t: t, b: b, r: storage.New(b, opts), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.r.Run(ctx) }()
	synctest.Wait()
	return h
}

// stop ends Run and waits for it.
func (h *harness) stop() {
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
}

func (h *harness) update(disks []storage.DiskConfig, datasets []storage.DatasetConfig) {
	h.r.Update(disks, datasets)
	synctest.Wait()
}

func (h *harness) disk(id string) storage.DiskStatus {
	h.t.Helper()
	for _, d := range h.r.Status().Disks {
		if d.ID == id {
			return d
		}
	}
	h.t.Fatalf("no status of disk %s", id)
	return storage.DiskStatus{}
}

func (h *harness) dataset(name string) storage.DatasetStatus {
	h.t.Helper()
	for _, d := range h.r.Status().Datasets {
		if d.Name == name {
			return d
		}
	}
	h.t.Fatalf("no status of dataset %s", name)
	return storage.DatasetStatus{}
}

// wantResult checks a result: ok (msg "") or an error containing msg.
func wantResult(t *testing.T, what string, got storage.Result, msg string) {
	t.Helper()
	switch {
	case msg == "" && !got.OK:
		t.Errorf("%s: %q, want ok", what, got.Message)
	case msg != "" && (got.OK || !strings.Contains(got.Message, msg)):
		t.Errorf("%s: %+v, want an error containing %q", what, got, msg)
	}
}

func diskCfg(n string) storage.DiskConfig {
	return storage.DiskConfig{ID: "disk-" + n, Identity: ident("serial-" + n), PoolID: "pool-" + n}
}

func dsCfg(id, poolID, kind string) storage.DatasetConfig {
	return storage.DatasetConfig{ID: id, PoolID: poolID, Kind: kind, Compression: storage.Compression{Type: "off"}}
}

func ptr(v uint64) *uint64 { return &v }

func has(list []string, s string) bool { return slices.Contains(list, s) }
