package storage

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Publishing the status.
//
// Every change a reader can see is published at once: a disk's or a
// dataset's result, what a pass observed, a disk that came or went, a new
// config, a call that became slow (activity.go). A pass that found its disk
// as the last one left it changes only when things were checked (CheckedAt,
// ReadAt, ListedAt, an orphan's At): those are published at most
// publishMinGap later, at once when no pass or listing is left in flight.
// So a round of a thousand passes that change nothing publishes a few
// snapshots, not a thousand, and no reader sees a state more than
// publishMinGap old.
//
// A snapshot is built from parts: each configured disk's part (its status,
// its pool's and datasets' readiness, what its last pass observed) is kept
// with the inputs it was made from and made again only when they change,
// or while the disk's call in flight is slow (what the part says of the
// call changes with time). The parts are kept in the order of the status,
// so a publish sorts nothing it did not change.

const publishMinGap = 100 * time.Millisecond

// diskPart is what one configured disk contributes to a snapshot.
type diskPart struct {
	key partKey
	// slow: made while a slow call was in flight; made again at every
	// publish.
	slow bool

	disk DiskStatus
	pool poolReady
	// shown: what the last pass observed (pool, datasets, orphans) is
	// shown.
	shown    bool
	observed []ObservedDataset // sorted by name
	// datasets are the statuses of the datasets configured on its pool,
	// sorted by name; ready their readiness, in the same order.
	datasets []DatasetStatus
	ready    []datasetReady
}

// partKey is what a part is made from, besides the time while a call is
// slow.
type partKey struct {
	cfgGen   uint64 // entry.cfgGen
	last     *passResult
	open     string
	attempts int
	retryAt  time.Time
	gone     bool
}

func (r *Reconciler) partKey(e *entry) partKey {
	l := &r.loop
	_, listed := l.disks[e.identity]
	return partKey{
		cfgGen: e.cfgGen, last: e.last, open: e.open, attempts: e.attempts, retryAt: e.retryAt,
		gone: l.haveList && !listed && (e.busy || e.last != nil),
	}
}

// part returns e's part as of now, made again if its inputs changed.
func (r *Reconciler) part(e *entry, now time.Time) *diskPart {
	key := r.partKey(e)
	if p := e.part; p != nil && p.key == key && !p.slow {
		if _, slow := slowActivity(e, now); !slow {
			return p
		}
	}
	e.part = r.makePart(e, key, now)
	return e.part
}

// makePart makes a configured disk's part.
func (r *Reconciler) makePart(e *entry, key partKey, now time.Time) *diskPart {
	p := &diskPart{key: key}
	ds := DiskStatus{ID: e.cfg.ID, Identity: e.identity, PoolID: e.cfg.PoolID, Attempts: e.attempts}
	if !e.retryAt.IsZero() {
		t := e.retryAt
		ds.NextRetry = &t
	}
	adopted := false
	switch {
	case e.last == nil:
		ds.Result = Result{Message: "not yet managed: its first pass has not finished", Pending: true}
	case e.last.disk.err != nil:
		ds.Result = resultOf(e.last.disk.err)
	case e.open != e.cfg.PoolID:
		ds.Result = Result{Message: "not yet managed: the config changed since its last pass", Pending: true}
	default:
		ds.Result, adopted = Result{OK: true}, true
	}
	// The newest listing and a call in flight are newer than the last
	// pass: a disk the listing no longer shows is gone, though a call on
	// it still hangs; one busy with a slow call is that call. Its
	// datasets wait for it.
	var waiting string
	act, slow := slowActivity(e, now)
	switch {
	case key.gone:
		ds.Result = resultOf(fmt.Errorf("disk %s: %w", e.identity, ErrNoDisk))
		if slow {
			ds.Result.Message += "; a call on it is still in flight: " + act.at(now)
		}
	case slow:
		ds.Result = Result{Message: act.at(now)}
		waiting = fmt.Sprintf("waiting for disk %s: %s", e.cfg.ID, ds.Result.Message)
	}
	p.slow = slow
	if e.last != nil {
		t := e.last.at
		ds.CheckedAt = &t
	}
	p.disk = ds
	why := fmt.Sprintf("disk %s: %s", e.cfg.ID, ds.Result.Message)
	p.pool = poolReady{managed: adopted && !key.gone && !slow, why: why}
	if key.gone {
		waiting = fmt.Sprintf("pool %s is not managed: %s", PoolName(e.cfg.PoolID), why)
	}
	// What the last pass read of a pool whose disk is busy is still shown,
	// with when it was read.
	p.shown = adopted && !key.gone
	if p.shown {
		p.observed = make([]ObservedDataset, 0, len(e.last.observed))
		for _, d := range e.last.observed {
			p.observed = append(p.observed, ObservedDataset{PoolID: e.cfg.PoolID, Dataset: d, ReadAt: e.last.readAt})
		}
	}

	p.datasets = make([]DatasetStatus, 0, len(e.datasets))
	p.ready = make([]datasetReady, 0, len(e.datasets))
	for _, nd := range sortedByName(e.datasets) {
		cfg, name := nd.cfg, nd.name
		s := DatasetStatus{ID: cfg.ID, Name: name}
		var o datasetOutcome
		var have bool
		if e.last != nil {
			o, have = e.last.datasets[cfg.ID]
			t := e.last.at
			s.CheckedAt = &t
		}
		switch {
		case waiting != "":
			s.Result = Result{Message: waiting}
		case !have || o.err == nil && (o.dataset == nil || o.dataset.Name != name):
			s.Result = Result{Message: fmt.Sprintf("dataset %s not yet ensured: its pool's pass has not reached it", name), Pending: true}
		default:
			s.Result = resultOf(o.err)
		}
		dr := datasetReady{ok: s.Result.OK, why: s.Result.Message}
		if dr.ok {
			dr.path = o.dataset.Path
		}
		p.datasets = append(p.datasets, s)
		p.ready = append(p.ready, dr)
	}
	return p
}

// named is a configured dataset with its full name.
type named struct {
	cfg  DatasetConfig
	name string
}

// sortedByName returns datasets with their names, sorted by name.
func sortedByName(ds []DatasetConfig) []named {
	out := make([]named, len(ds))
	for i, d := range ds {
		out[i] = named{d, d.Name()}
	}
	byName := func(a, b named) int { return strings.Compare(a.name, b.name) }
	if !slices.IsSortedFunc(out, byName) {
		slices.SortStableFunc(out, byName)
	}
	return out
}

// changedBeyondTimes reports whether b says anything a reader would see
// differently from a, beyond when things were checked.
func changedBeyondTimes(a, b *diskPart) bool {
	if a == nil || b == nil {
		return a != b
	}
	if a.slow || b.slow || a.shown != b.shown || a.pool != b.pool || !sameDiskStatus(a.disk, b.disk) ||
		len(a.observed) != len(b.observed) || len(a.datasets) != len(b.datasets) {
		return true
	}
	for i := range a.observed {
		x, y := a.observed[i], b.observed[i]
		if x.PoolID != y.PoolID || !sameObservedDataset(x.Dataset, y.Dataset) {
			return true
		}
	}
	for i := range a.datasets {
		x, y := a.datasets[i], b.datasets[i]
		if x.ID != y.ID || x.Name != y.Name || x.Result != y.Result || a.ready[i] != b.ready[i] {
			return true
		}
	}
	if !a.shown {
		return false // nothing else of a's last pass is shown, nor of b's
	}
	x, y := a.key.last, b.key.last
	return !samePool(x.pool, y.pool) || !slices.EqualFunc(x.orphans, y.orphans, sameOrphan) || x != y && len(y.destroyed) > 0
}

func sameDiskStatus(a, b DiskStatus) bool {
	return a.ID == b.ID && a.Identity == b.Identity && a.PoolID == b.PoolID && a.Result == b.Result &&
		a.Attempts == b.Attempts && sameTimePtr(a.NextRetry, b.NextRetry)
}

func sameTimePtr(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func samePool(a, b *Pool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameObservedDataset(a, b Dataset) bool {
	return a.Name == b.Name && a.ID == b.ID && a.Path == b.Path && samePtr(a.Quota, b.Quota) &&
		samePtr(a.Reservation, b.Reservation) && a.Compression == b.Compression && a.Used == b.Used &&
		a.Available == b.Available && a.Mounted == b.Mounted
}

// sameOrphan compares two orphans but for when they were found.
func sameOrphan(a, b Orphan) bool {
	return a.Name == b.Name && a.ID == b.ID && a.Kind == b.Kind && a.PoolID == b.PoolID &&
		a.Reason == b.Reason && a.Destroyed == b.Destroyed && sameObservedDataset(a.Dataset, b.Dataset)
}

// order makes the loop's views of the configured disks that a snapshot is
// built in: by disk id, by pool id, their calls in flight, and the
// configured datasets on pools no configured disk carries. It runs after
// every change of the config (setDesired), the only change of these.
func (l *loopState) order() {
	l.byID, l.byPool = l.byID[:0], l.byPool[:0]
	l.activity = map[string]*atomic.Pointer[activity]{}
	carried := map[string]bool{}
	for _, e := range l.entries {
		if e.cfg == nil {
			continue
		}
		l.byID = append(l.byID, e)
		l.byPool = append(l.byPool, e)
		l.activity[e.cfg.ID] = &e.worker.act
		carried[e.cfg.PoolID] = true
	}
	slices.SortFunc(l.byID, func(a, b *entry) int { return strings.Compare(a.cfg.ID, b.cfg.ID) })
	slices.SortFunc(l.byPool, func(a, b *entry) int { return strings.Compare(a.cfg.PoolID, b.cfg.PoolID) })
	l.loose = l.loose[:0]
	for _, ds := range l.datasets {
		if !carried[ds.PoolID] {
			l.loose = append(l.loose, ds)
		}
	}
	l.reshaped = true
}

// observedDisks returns the last good listing sorted by identity as
// written, made once per listing: each identity is written once, not at
// each comparison (a thousand disks are twenty thousand comparisons).
func (l *loopState) observedDisks() []Disk {
	if l.sortedDisks != nil || len(l.disks) == 0 {
		return l.sortedDisks
	}
	type keyed struct {
		key  string
		disk Disk
	}
	disks := make([]keyed, 0, len(l.disks))
	for _, d := range l.disks {
		disks = append(disks, keyed{d.Identity.String(), d})
	}
	slices.SortFunc(disks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	l.sortedDisks = make([]Disk, 0, len(disks))
	for _, k := range disks {
		l.sortedDisks = append(l.sortedDisks, k.disk)
	}
	return l.sortedDisks
}

// sameListing reports whether a listing shows the disks of the last good
// one, as they were.
func (l *loopState) sameListing(disks []Disk) bool {
	if !l.haveList || len(disks) != len(l.disks) {
		return false
	}
	for _, d := range disks {
		old, ok := l.disks[d.Identity]
		if !ok || !sameDisk(old, d) {
			return false
		}
	}
	return true
}

func sameDisk(a, b Disk) bool {
	fa, fb := a.Firmware, b.Firmware
	return a.Identity == b.Identity && a.Variant == b.Variant && a.Slot == b.Slot && a.Path == b.Path &&
		a.Content == b.Content && a.PoolID == b.PoolID && a.Foreign == b.Foreign && a.Size == b.Size &&
		fa.ActiveSlot == fb.ActiveSlot && fa.Slots == fb.Slots && fa.Slot1ReadOnly == fb.Slot1ReadOnly &&
		samePtr(fa.NextActive, fb.NextActive) && slices.EqualFunc(fa.Versions, fb.Versions, samePtr[string])
}

// changed notes a change a reader would see: the status is published now.
// timesMoved notes one of only when things were checked: it is published
// within publishMinGap.
func (r *Reconciler) changed()    { r.loop.pending = true }
func (r *Reconciler) timesMoved() { r.loop.stale = true }

// flush publishes what changed since the last publish: a change a reader
// would see at once; one of when things were checked once publishMinGap has
// passed since the last publish, or once nothing is in flight.
func (r *Reconciler) flush(now time.Time) {
	l := &r.loop
	if l.pending || l.stale && (l.inflight == 0 && !l.listing || now.Sub(l.act.publishedAt) >= publishMinGap) {
		r.publish()
	}
}

// nextFlushIn says how long until what changed only in its times is to be
// published.
func (l *loopState) nextFlushIn(now time.Time) (time.Duration, bool) {
	if !l.stale {
		return 0, false
	}
	return max(l.act.publishedAt.Add(publishMinGap).Sub(now), 0), true
}

// publish builds a new snapshot from the loop's state and hands it to
// readers; it calls OnReadyChange if ZoneStorage's answers may change.
func (r *Reconciler) publish() {
	l := &r.loop
	now := time.Now()
	l.act = activityState{publishedAt: now}
	l.pending, l.stale = false, false
	r.store.mu.Lock()
	old := r.store.snap
	r.store.mu.Unlock()

	snap := &snapshot{activity: l.activity}
	st := &snap.status
	st.Configured = l.haveConfig
	if l.haveList {
		t := l.listedAt
		st.ListedAt = &t
	}
	if l.listErr != nil {
		st.ListError = l.listErr.Error()
	}
	st.Observed.Disks = l.observedDisks()

	// The parts, in the status's orders; changed are those made since the
	// last publish.
	var changed []*diskPart
	if n := len(l.byID) + len(l.conflicts); n > 0 {
		st.Disks = make([]DiskStatus, 0, n)
	}
	for _, e := range l.byID {
		p := r.part(e, now)
		if p != e.published {
			changed = append(changed, p)
			e.published = p
		}
		st.Disks = append(st.Disks, p.disk)
		l.act.shown = l.act.shown || p.slow
	}
	for _, c := range l.conflicts {
		st.Disks = append(st.Disks, DiskStatus{ID: c.cfg.ID, Identity: c.cfg.Identity, PoolID: c.cfg.PoolID, Result: Result{Message: c.why}})
	}
	if len(l.conflicts) > 0 {
		slices.SortFunc(st.Disks, func(a, b DiskStatus) int { return strings.Compare(a.ID, b.ID) })
	}

	nds, npools, nobserved := len(l.loose), 0, 0
	for _, e := range l.byPool {
		nds += len(e.part.datasets)
		if e.part.shown {
			npools, nobserved = npools+1, nobserved+len(e.part.observed)
		}
	}
	if nds > 0 {
		st.Datasets = make([]DatasetStatus, 0, nds)
	}
	if npools > 0 {
		st.Observed.Pools = make([]Pool, 0, npools)
	}
	if nobserved > 0 {
		st.Observed.Datasets = make([]ObservedDataset, 0, nobserved)
	}
	for _, e := range l.byPool {
		p := e.part
		st.Datasets = append(st.Datasets, p.datasets...)
		if !p.shown {
			continue
		}
		if e.last.pool != nil {
			st.Observed.Pools = append(st.Observed.Pools, *e.last.pool)
		}
		st.Observed.Datasets = append(st.Observed.Datasets, p.observed...)
		st.Orphans = append(st.Orphans, e.last.orphans...)
	}
	for _, e := range l.entries {
		st.Orphans = append(st.Orphans, e.destroyed...)
	}

	// Readiness: made again after a change of the config; else the last
	// one's, with the remade parts' pools and datasets in it.
	rd := readiness{configured: l.haveConfig}
	full := l.reshaped || old.ready.pools == nil
	l.reshaped = false
	notify := false
	if full {
		rd.pools = make(map[string]poolReady, len(l.byID)+len(l.conflicts))
		rd.datasets = make(map[string]datasetReady, nds)
		for _, e := range l.byID {
			rd.pools[e.cfg.PoolID] = e.part.pool
		}
		for _, c := range l.conflicts {
			if _, ok := rd.pools[c.cfg.PoolID]; !ok {
				rd.pools[c.cfg.PoolID] = poolReady{why: fmt.Sprintf("disk %s: %s", c.cfg.ID, c.why)}
			}
		}
		for _, e := range l.byPool {
			for i, ds := range e.part.datasets {
				rd.datasets[ds.Name] = e.part.ready[i]
			}
		}
	} else if len(changed) > 0 {
		rd.pools, rd.datasets = maps.Clone(old.ready.pools), maps.Clone(old.ready.datasets)
		for _, p := range changed {
			if was := rd.pools[p.disk.PoolID]; was.managed != p.pool.managed {
				notify = true
			}
			rd.pools[p.disk.PoolID] = p.pool
			for i, ds := range p.datasets {
				if was := rd.datasets[ds.Name]; was.ok != p.ready[i].ok || was.path != p.ready[i].path {
					notify = true
				}
				rd.datasets[ds.Name] = p.ready[i]
			}
		}
	} else {
		rd.pools, rd.datasets = old.ready.pools, old.ready.datasets
	}
	// Datasets on pools no configured disk carries: not managed, with why.
	for _, ds := range l.loose {
		name := ds.Name()
		why := "no disk in the config carries it"
		if p, ok := rd.pools[ds.PoolID]; ok {
			why = p.why
		}
		s := DatasetStatus{ID: ds.ID, Name: name, Result: Result{Message: fmt.Sprintf("pool %s is not managed: %s", PoolName(ds.PoolID), why)}}
		st.Datasets = append(st.Datasets, s)
		if full {
			rd.datasets[name] = datasetReady{why: s.Result.Message}
		}
	}
	notify = notify || full && !old.ready.same(rd)
	byName := func(a, b DatasetStatus) int { return strings.Compare(a.Name, b.Name) }
	if !slices.IsSortedFunc(st.Datasets, byName) {
		slices.SortFunc(st.Datasets, byName)
	}
	slices.SortFunc(st.Orphans, func(a, b Orphan) int { return strings.Compare(a.Name, b.Name) })
	poolByID := func(a, b Pool) int { return strings.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(st.Observed.Pools, poolByID) {
		slices.SortFunc(st.Observed.Pools, poolByID)
	}
	observedByName := func(a, b ObservedDataset) int { return strings.Compare(a.Dataset.Name, b.Dataset.Name) }
	if !slices.IsSortedFunc(st.Observed.Datasets, observedByName) {
		slices.SortFunc(st.Observed.Datasets, observedByName)
	}
	snap.ready = rd

	r.store.mu.Lock()
	snap.status.Version = old.status.Version + 1
	r.store.snap = snap
	r.store.mu.Unlock()
	if notify && r.opts.OnReadyChange != nil {
		r.opts.OnReadyChange()
	}
}
