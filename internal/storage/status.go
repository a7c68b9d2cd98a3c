package storage

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Result is the outcome of one configured disk or dataset: ok, or the error
// that says what is wrong.
type Result struct {
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
	// Pending: no pass of the config as it is now has finished with this
	// disk or dataset yet (Message says so); the storage reconciler has
	// not answered for it.
	Pending bool `json:"pending,omitempty"`
}

func resultOf(err error) Result {
	if err == nil {
		return Result{OK: true}
	}
	return Result{Message: err.Error()}
}

// Status is a snapshot of the reconciler for readers.
type Status struct {
	// Version changes with every published snapshot: a reader may cache
	// what it derives from a Status by it. While a disk is busy with a
	// slow call a snapshot is published every second (activity.go), so
	// what a Status says of it is never more than a second old; only
	// DiskStatus.Activity is read live, and is not covered by Version.
	Version uint64 `json:"version"`
	// Configured is false until the first Update.
	Configured bool `json:"configured"`
	// ListedAt is when the disks were last listed; ListError why the
	// newest listing failed, if it did.
	ListedAt  *time.Time `json:"listed_at,omitempty"`
	ListError string     `json:"list_error,omitempty"`
	// Disks and Datasets are the configured ones, by id and by name.
	Disks    []DiskStatus    `json:"disks"`
	Datasets []DatasetStatus `json:"datasets"`
	Observed Observed        `json:"observed"`
	// Orphans are datasets on managed pools that the config no longer
	// names: those kept (with why), and the last ones destroyed.
	Orphans []Orphan `json:"orphans"`
}

// DiskStatus is one configured disk.
type DiskStatus struct {
	ID       string       `json:"id"`
	Identity DiskIdentity `json:"identity"`
	PoolID   string       `json:"pool_id"`
	Result   Result       `json:"result"`
	// Attempts counts failed passes in a row; NextRetry is the next one.
	Attempts  int        `json:"attempts"`
	NextRetry *time.Time `json:"next_retry,omitempty"`
	CheckedAt *time.Time `json:"checked_at,omitempty"`
	// Activity is the backend call in flight on this disk, if any: what,
	// for how long, and its deadline, as of the read. Once the call has
	// taken a second, Result is err with it too.
	Activity string `json:"activity,omitempty"`
}

// DatasetStatus is one configured dataset.
type DatasetStatus struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Result    Result     `json:"result"`
	CheckedAt *time.Time `json:"checked_at,omitempty"`
}

// Observed is what the backend last showed.
type Observed struct {
	Disks []Disk `json:"disks"`
	// Pools are the managed pools, as opened.
	Pools []Pool `json:"pools"`
	// Datasets are the managed pools' datasets as last read.
	Datasets []ObservedDataset `json:"datasets"`
}

// ObservedDataset is one dataset as read at ReadAt.
type ObservedDataset struct {
	PoolID  string    `json:"pool_id"`
	Dataset Dataset   `json:"dataset"`
	ReadAt  time.Time `json:"read_at"`
}

// Orphan is a dataset of one of our kinds on a managed pool that the config
// no longer names.
type Orphan struct {
	Name   string `json:"name"`
	ID     string `json:"id,omitempty"`
	Kind   string `json:"kind"`
	PoolID string `json:"pool_id"`
	// Reason says why it is kept, or that it was destroyed.
	Reason    string    `json:"reason"`
	Destroyed bool      `json:"destroyed"`
	At        time.Time `json:"at"`
	// Dataset is the dataset as found.
	Dataset Dataset `json:"dataset"`
}

// ErrNotReady is what ZoneStorage's errors wrap.
var ErrNotReady = errors.New("storage not ready")

// NotReadyError says what storage a zone waits for.
type NotReadyError struct{ Reason string }

func (e *NotReadyError) Error() string        { return e.Reason }
func (e *NotReadyError) Is(target error) bool { return target == ErrNotReady }

// ZonePaths are where a zone's storage is.
type ZonePaths struct {
	// Root is the zone's transient root dataset's path.
	Root string
	// Durable is its durable dataset's path ("" if it has none).
	Durable string
}

// store holds what readers see. It is written by the loop and read by
// anyone; the lock is never held across anything that can block.
type store struct {
	mu   sync.Mutex
	snap *snapshot // guarded by mu; replaced, never modified
}

type snapshot struct {
	status Status
	// activity is each configured disk's call in flight, by disk id.
	activity map[string]*atomic.Pointer[activity]
	ready    readiness
}

// readiness is what ZoneStorage answers from.
type readiness struct {
	configured bool
	// pools are the configured pools, by id: "" if managed, else why not.
	pools map[string]poolReady
	// datasets are the configured datasets, by name.
	datasets map[string]datasetReady
}

type poolReady struct {
	managed bool
	why     string
}

type datasetReady struct {
	ok   bool
	path string
	why  string
}

func (a readiness) same(b readiness) bool {
	return a.configured == b.configured &&
		maps.EqualFunc(a.pools, b.pools, func(x, y poolReady) bool { return x.managed == y.managed }) &&
		maps.EqualFunc(a.datasets, b.datasets, func(x, y datasetReady) bool { return x.ok == y.ok && x.path == y.path })
}

// Status returns a snapshot of the reconciler. It never waits on a backend
// call.
func (r *Reconciler) Status() Status {
	r.store.mu.Lock()
	snap := r.store.snap
	r.store.mu.Unlock()
	s := snap.status
	s.Disks = slices.Clone(s.Disks)
	for i := range s.Disks {
		if p := snap.activity[s.Disks[i].ID]; p != nil {
			if a := p.Load(); a != nil {
				s.Disks[i].Activity = a.String()
			}
		}
	}
	s.Datasets = slices.Clone(s.Datasets)
	s.Orphans = slices.Clone(s.Orphans)
	s.Observed.Disks = slices.Clone(s.Observed.Disks)
	s.Observed.Pools = slices.Clone(s.Observed.Pools)
	s.Observed.Datasets = slices.Clone(s.Observed.Datasets)
	return s
}

// Version is the Version of the Status Status would return now, without
// copying the status: a reader that caches what it derives from a Status
// asks for the whole one only when this changed.
func (r *Reconciler) Version() uint64 {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	return r.store.snap.status.Version
}

// ZoneStorage says whether a zone's storage is ready, from the published
// state (it never waits on a backend call): its filesystem pool
// ("oxp_<id>") is managed, its transient root dataset
// "oxp_<id>/crypt/zone/<zone name>" is ensured, and so is its durable
// dataset (a full name, "" if it has none). The error, wrapping
// ErrNotReady, names what is missing; a pool whose disk is busy with a call
// slower than a second, or that the newest listing no longer shows, is not
// managed, and the error says so with the call.
func (r *Reconciler) ZoneStorage(filesystemPool, zoneName, durable string) (ZonePaths, error) {
	r.store.mu.Lock()
	rd := r.store.snap.ready
	r.store.mu.Unlock()
	notReady := func(format string, args ...any) (ZonePaths, error) {
		return ZonePaths{}, &NotReadyError{Reason: fmt.Sprintf(format, args...)}
	}
	poolID, ok := PoolIDFromName(filesystemPool)
	if !ok {
		return notReady("filesystem pool %q is not an external pool (oxp_<id>)", filesystemPool)
	}
	if !rd.configured {
		return notReady("pool %s is not managed: no storage config yet", filesystemPool)
	}
	if p, ok := rd.pools[poolID]; !ok {
		return notReady("pool %s is not managed: no disk in the config carries it", filesystemPool)
	} else if !p.managed {
		return notReady("pool %s is not managed: %s", filesystemPool, p.why)
	}
	dataset := func(name string) (string, error) {
		d, ok := rd.datasets[name]
		switch {
		case !ok:
			return "", &NotReadyError{Reason: fmt.Sprintf("dataset %s is not in the config", name)}
		case !d.ok:
			return "", &NotReadyError{Reason: fmt.Sprintf("dataset %s not yet ensured: %s", name, d.why)}
		}
		return d.path, nil
	}
	var paths ZonePaths
	var err error
	if paths.Root, err = dataset(DatasetName(poolID, zoneRootPrefix+zoneName)); err != nil {
		return ZonePaths{}, err
	}
	if durable != "" {
		if paths.Durable, err = dataset(durable); err != nil {
			return ZonePaths{}, err
		}
	}
	return paths, nil
}

// ReadyPaths are where the ensured datasets of the given kinds are, from
// the published state (it never waits on a backend call): for instance
// the local_storage datasets in which a guest's disk files may lie.
func (r *Reconciler) ReadyPaths(kinds ...string) []string {
	var out []string
	for _, d := range r.ReadyDatasets(kinds...) {
		out = append(out, d.Path)
	}
	slices.Sort(out)
	return out
}

// ReadyDataset is an ensured dataset of a managed pool.
type ReadyDataset struct {
	PoolID, Kind, Path string
}

// ReadyDatasets are the ensured datasets of the given kinds, from the
// published state (it never waits on a backend call), by name.
func (r *Reconciler) ReadyDatasets(kinds ...string) []ReadyDataset {
	r.store.mu.Lock()
	rd := r.store.snap.ready
	r.store.mu.Unlock()
	var out []ReadyDataset
	for name, d := range rd.datasets {
		if !d.ok || d.path == "" {
			continue
		}
		pool, _, _ := strings.Cut(name, "/")
		id, ok := PoolIDFromName(pool)
		if !ok {
			continue
		}
		for _, k := range kinds {
			if name == DatasetName(id, k) {
				out = append(out, ReadyDataset{PoolID: id, Kind: k, Path: d.path})
			}
		}
	}
	slices.SortFunc(out, func(a, b ReadyDataset) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// Why PoolDataset finds no dataset, besides a *NotReadyError (the pool or
// the dataset is configured but not usable now: a caller may try again).
var (
	// ErrUnknownPool: no disk of the sled config carries the pool.
	ErrUnknownPool = errors.New("no disk of this sled's config carries the pool")
	// ErrNoDataset: the sled config has no dataset of that kind on the pool.
	ErrNoDataset = errors.New("this sled's config has no such dataset on the pool")
)

// PoolDataset is where the ensured dataset of kind on pool poolID is, from
// the published state (it never waits on a backend call). A pool no
// configured disk carries is ErrUnknownPool, a dataset the config does not
// name ErrNoDataset; a pool not managed now (no config yet, its disk
// missing or busy), or a dataset not yet ensured, is a *NotReadyError
// saying why.
func (r *Reconciler) PoolDataset(poolID, kind string) (string, error) {
	r.store.mu.Lock()
	rd := r.store.snap.ready
	r.store.mu.Unlock()
	pool, name := PoolName(poolID), DatasetName(poolID, kind)
	if !rd.configured {
		return "", &NotReadyError{Reason: fmt.Sprintf("pool %s is not managed: no storage config yet", pool)}
	}
	p, ok := rd.pools[poolID]
	if !ok {
		return "", fmt.Errorf("pool %s: %w", pool, ErrUnknownPool)
	}
	d, ok := rd.datasets[name]
	switch {
	case !ok:
		return "", fmt.Errorf("dataset %s: %w", name, ErrNoDataset)
	case !p.managed:
		return "", &NotReadyError{Reason: fmt.Sprintf("pool %s is not managed: %s", pool, p.why)}
	case !d.ok || d.path == "":
		return "", &NotReadyError{Reason: fmt.Sprintf("dataset %s not yet ensured: %s", name, d.why)}
	}
	return d.path, nil
}
