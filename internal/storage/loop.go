package storage

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// loopState is owned by the Run goroutine; nothing else touches it.
type loopState struct {
	haveConfig bool
	// datasets is the configured datasets, all of them (status reports
	// those on pools no disk carries).
	datasets []DatasetConfig
	// conflicts are configured disks given no work because another
	// configured disk has the same identity or pool id, by disk id.
	conflicts map[string]conflict
	// entries are the disks being worked on, by identity: configured ones,
	// and unconfigured ones holding a pool that is to be closed.
	entries map[DiskIdentity]*entry
	// released are unconfigured disks whose pool was closed (or found
	// closed) once; they are left alone from then on.
	released map[DiskIdentity]bool

	// seq orders wants and listings: a listing started at seq s can serve
	// a pass wanted at seq ≤ s.
	seq uint64
	// The last good listing of the disks, by identity.
	disks    map[DiskIdentity]Disk
	haveList bool
	listedAt time.Time
	// listSeq is the seq of the newest listing that returned (good, or
	// failed while an older good one is kept).
	listSeq uint64
	listErr error
	// listing is a listing in flight, started at listingSeq.
	listing    bool
	listingSeq uint64
	listAgain  bool

	// act is what the last published status said of calls in flight.
	act activityState
	// inflight counts the passes in flight.
	inflight int
	// scan: a disk may be able to start a pass (step); nextRetry is the
	// earliest retry as of the last step, or earlier.
	scan      bool
	nextRetry time.Time

	// What snapshots are built from (publish.go). desired is the config
	// of the last setDesired. byID and byPool are the configured disks'
	// entries by disk id and by pool id, activity their calls in flight,
	// loose the configured datasets on pools no configured disk carries;
	// reshaped: they changed since the last publish. sortedDisks is the
	// last good listing sorted (nil: to be sorted).
	desired     *desired
	byID        []*entry
	byPool      []*entry
	activity    map[string]*atomic.Pointer[activity]
	loose       []DatasetConfig
	reshaped    bool
	sortedDisks []Disk
	// pending: a change a reader would see is not yet published; stale:
	// one of only when things were checked is not.
	pending, stale bool
}

type conflict struct {
	cfg DiskConfig
	why string
}

func (l *loopState) init() {
	l.conflicts = map[string]conflict{}
	l.entries = map[DiskIdentity]*entry{}
	l.released = map[DiskIdentity]bool{}
	l.disks = map[DiskIdentity]Disk{}
}

// entry is the loop's record of one disk.
type entry struct {
	identity DiskIdentity
	// cfg is the disk's config; nil: no longer configured, its pool is to
	// be closed and the entry forgotten.
	cfg      *DiskConfig
	datasets []DatasetConfig // configured on cfg's pool
	worker   *worker

	busy    bool
	cancel  context.CancelFunc
	jobPool string // configured pool id of the pass in flight ("" for a close)
	// dirty: the config, or the disk's presence, changed while a pass was
	// in flight.
	dirty bool
	// gone is the seq of the listing that found the disk gone while a pass
	// was in flight (abandoned then); the next pass needs no newer one.
	gone uint64

	wantPass bool
	needSeq  uint64 // a pass wants a listing started at or after this
	// passStart is when the last pass (or close) began.
	passStart time.Time
	retryAt   time.Time
	attempts  int

	// open is the pool this reconciler has open on the disk, as far as
	// it knows ("" none).
	open string
	// The last pass.
	last *passResult
	// destroyed are the orphans this pool's passes destroyed, newest last.
	destroyed []Orphan

	// cfgGen counts changes of cfg and datasets; part is what the disk
	// contributes to a snapshot as last made, published as the last
	// publish used (publish.go).
	cfgGen    uint64
	part      *diskPart
	published *diskPart
}

// want asks for a pass of e after a fresh listing.
func (r *Reconciler) want(e *entry) {
	r.loop.seq++
	e.wantPass, e.needSeq = true, r.loop.seq
	r.loop.scan = true
}

// recheckMinGap is how recent a disk's pass may be for an update of the
// config that leaves its storage as it was not to ask for another.
const recheckMinGap = time.Second

// setDesired makes d the desired storage and asks every disk for a pass.
// When d is the storage already desired, only disks whose last pass began
// recheckMinGap ago or more are asked: a control plane that puts configs
// back to back (their zones changing, their storage not) has every disk
// looked at again within a second, not a thousand passes per put.
func (r *Reconciler) setDesired(d *desired) {
	l := &r.loop
	if l.haveConfig && l.desired != nil && sameDesired(l.desired, d) {
		l.desired = d
		now := time.Now()
		for _, e := range l.entries {
			if e.retryAt.IsZero() && !e.wantPass && (e.passStart.IsZero() || now.Sub(e.passStart) >= recheckMinGap) {
				r.want(e)
			}
		}
		return // nothing a reader sees changed: the passes will say
	}
	l.haveConfig, l.desired = true, d
	l.datasets = d.datasets
	clear(l.conflicts)

	byPool := map[string][]DatasetConfig{}
	for _, ds := range d.datasets {
		byPool[ds.PoolID] = append(byPool[ds.PoolID], ds)
	}
	disks := slices.Clone(d.disks)
	slices.SortFunc(disks, func(a, b DiskConfig) int { return cmpStrings(a.ID, b.ID) })
	configured := map[DiskIdentity]bool{}
	poolOwner := map[string]string{}
	for _, cfg := range disks {
		if configured[cfg.Identity] {
			l.conflicts[cfg.ID] = conflict{cfg, fmt.Sprintf("disk %s is configured more than once; only the first is managed", cfg.Identity)}
			continue
		}
		if other, ok := poolOwner[cfg.PoolID]; ok {
			l.conflicts[cfg.ID] = conflict{cfg, fmt.Sprintf("pool %s is configured on disk %s too; only that one is managed", PoolName(cfg.PoolID), other)}
			continue
		}
		configured[cfg.Identity], poolOwner[cfg.PoolID] = true, cfg.ID
		e := r.entry(cfg.Identity)
		cfg := cfg
		changed := e.cfg == nil || *e.cfg != cfg || !sameDatasets(e.datasets, byPool[cfg.PoolID])
		if e.busy && (e.jobPool != cfg.PoolID) {
			e.cancel() // the pass in flight works for a pool no longer wanted
		}
		e.cfg, e.datasets = &cfg, byPool[cfg.PoolID]
		if changed {
			e.attempts, e.retryAt, e.dirty = 0, time.Time{}, e.busy
			e.cfgGen++
		}
		if e.retryAt.IsZero() {
			r.want(e)
		}
	}
	for id, e := range l.entries {
		if configured[id] {
			continue
		}
		if e.cfg != nil {
			r.log.Info("disk removed from the config: its pool stops being managed and is not destroyed", "disk", id.String(), "pool", e.open)
		}
		wasConfigured := e.cfg != nil
		e.cfg, e.datasets = nil, nil
		e.cfgGen++
		if e.busy && e.jobPool != "" {
			e.cancel()
		}
		if wasConfigured {
			e.attempts, e.retryAt, e.dirty = 0, time.Time{}, e.busy
		}
		if !e.busy && e.open == "" {
			r.forget(e)
			continue
		}
		if e.retryAt.IsZero() {
			r.want(e)
		}
	}
	l.order()
	r.changed()
}

// sameDesired reports whether two configs are the same storage.
func sameDesired(a, b *desired) bool {
	return slices.Equal(a.disks, b.disks) && sameDatasets(a.datasets, b.datasets)
}

// entry returns the entry of a disk, making it (and its worker) if needed.
func (r *Reconciler) entry(id DiskIdentity) *entry {
	if e, ok := r.loop.entries[id]; ok {
		return e
	}
	e := &entry{identity: id}
	e.worker = r.startWorker(id)
	r.loop.entries[id] = e
	return e
}

// forget drops an entry that is neither configured nor holding an open pool.
func (r *Reconciler) forget(e *entry) {
	e.worker.stop()
	delete(r.loop.entries, e.identity)
}

func sameDatasets(a, b []DatasetConfig) bool {
	return slices.EqualFunc(a, b, sameDataset)
}

func sameDataset(a, b DatasetConfig) bool {
	return a.ID == b.ID && a.PoolID == b.PoolID && a.Kind == b.Kind &&
		samePtr(a.Quota, b.Quota) && samePtr(a.Reservation, b.Reservation) && a.Compression == b.Compression
}

// samePtr says whether a and b are both nil or point to equal values.
func samePtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// periodic asks every disk not waiting out a backoff for a pass.
func (r *Reconciler) periodic(ctx context.Context) {
	r.startList(ctx)
	for _, e := range r.loop.entries {
		if e.retryAt.IsZero() && !e.wantPass {
			r.want(e)
		}
	}
}

// step starts the passes that can start: wanted, not busy, with a listing
// at least as new as the want. It starts a listing if one is needed. It
// looks at the disks only when one may be able to start (scan) or a retry
// is due, not after every finished pass.
func (r *Reconciler) step(ctx context.Context, now time.Time) {
	l := &r.loop
	if !l.scan && (l.nextRetry.IsZero() || now.Before(l.nextRetry)) {
		return
	}
	needList := false
	l.nextRetry = time.Time{}
	for _, e := range l.entries {
		if !e.wantPass && !e.retryAt.IsZero() && !now.Before(e.retryAt) {
			e.retryAt = time.Time{}
			r.want(e)
		}
		if !e.wantPass || e.busy {
			continue
		}
		if l.haveList && l.listSeq >= e.needSeq {
			r.dispatch(ctx, e)
			continue
		}
		needList = true
	}
	for _, e := range l.entries {
		if !e.retryAt.IsZero() {
			l.retryBy(e.retryAt)
		}
	}
	l.scan = false
	if needList {
		r.startList(ctx)
	}
}

// retryBy notes that a disk's retry is due at t.
func (l *loopState) retryBy(t time.Time) {
	if l.nextRetry.IsZero() || t.Before(l.nextRetry) {
		l.nextRetry = t
	}
}

// nextRetryIn returns how long until the earliest retry (or one that may
// have been cancelled since).
func (l *loopState) nextRetryIn(now time.Time) (time.Duration, bool) {
	if l.nextRetry.IsZero() {
		return 0, false
	}
	return max(l.nextRetry.Sub(now), 0), true
}

type listResult struct {
	disks []Disk
	err   error
	seq   uint64
	at    time.Time
}

// startList lists the disks in the background, unless a listing is in
// flight (then another follows it if this one would be too old).
func (r *Reconciler) startList(ctx context.Context) {
	l := &r.loop
	if l.listing {
		if l.listingSeq < l.seq {
			l.listAgain = true
		}
		return
	}
	l.listing, l.listAgain, l.listingSeq = true, false, l.seq
	seq := l.seq
	r.wg.Go(func() {
		lctx, cancel := context.WithTimeout(ctx, r.opts.ListTimeout)
		defer cancel()
		disks, err := r.backend.Disks(lctx)
		if err != nil && lctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("listing disks: no answer within %s: %w", r.opts.ListTimeout, err)
		} else if err != nil {
			err = fmt.Errorf("listing disks: %w", err)
		}
		select {
		case r.listed <- listResult{disks: disks, err: err, seq: seq, at: time.Now()}:
		case <-r.done:
		}
	})
}

// handleList takes a listing of the disks.
func (r *Reconciler) handleList(ctx context.Context, lr listResult) {
	l := &r.loop
	l.listing = false
	switch {
	case lr.err == nil:
		if l.listErr == nil && l.sameListing(lr.disks) {
			r.timesMoved() // only ListedAt
		} else {
			r.changed()
			l.sortedDisks = nil
		}
		r.presenceChanged(lr)
		clear(l.disks)
		for _, d := range lr.disks {
			l.disks[d.Identity] = d
		}
		l.haveList, l.listedAt, l.listErr, l.listSeq = true, lr.at, nil, lr.seq
		l.scan = true // passes waiting for this listing can start
	case l.haveList:
		// Keep the older listing and go on with it: a disk whose pool
		// is open needs no listing to be worked on, and CreatePool
		// refuses a disk that is not blank.
		r.log.Warn("listing disks failed; going on with the last listing", "err", lr.err, "listed_at", l.listedAt)
		l.listErr, l.listSeq = lr.err, lr.seq
		l.scan = true
		r.changed()
	default:
		r.log.Warn("listing disks failed", "err", lr.err)
		l.listErr = lr.err
		r.failUnlisted(lr)
		r.changed()
	}
	if l.listAgain {
		r.startList(ctx)
	}
	if l.haveList && l.haveConfig {
		r.releaseUnconfigured()
	}
}

// failUnlisted records, for every disk waiting for a listing, that the
// disks could not be listed, and schedules a retry.
func (r *Reconciler) failUnlisted(lr listResult) {
	now := time.Now()
	for _, e := range r.loop.entries {
		if !e.wantPass || e.busy || e.needSeq > lr.seq {
			continue
		}
		e.wantPass = false
		e.last = &passResult{key: e.identity, at: now, open: e.open, disk: outcome{err: lr.err, retryable: true}}
		e.attempts++
		e.retryAt = now.Add(r.opts.Backoff.Delay(e.attempts))
		r.loop.retryBy(e.retryAt)
	}
}

// releaseUnconfigured closes, once, the pools of disks the config does not
// name: a disk removed from the config while the agent was down has its
// pool closed (never destroyed), as if it had been removed while it ran.
func (r *Reconciler) releaseUnconfigured() {
	l := &r.loop
	for id, d := range l.disks {
		if d.Content != ContentPool || l.released[id] {
			continue
		}
		if _, ok := l.entries[id]; ok {
			continue
		}
		e := r.entry(id)
		e.open = d.PoolID
		r.log.Info("closing a pool whose disk is not in the config", "disk", id.String(), "pool", PoolName(d.PoolID))
		r.want(e)
	}
}

// dispatch hands e's worker a pass (or, for a disk no longer configured, a
// close of its pool).
func (r *Reconciler) dispatch(ctx context.Context, e *entry) {
	j := job{open: e.open}
	if e.cfg != nil {
		cfg := *e.cfg
		j.disk = &cfg
		j.datasets = slices.Clone(e.datasets)
		if d, ok := r.loop.disks[e.identity]; ok {
			j.observed = &d
		}
		e.jobPool = cfg.PoolID
	} else {
		e.jobPool = ""
	}
	jctx, cancel := context.WithCancel(ctx)
	j.ctx = jctx
	e.busy, e.cancel, e.wantPass, e.dirty = true, cancel, false, false
	e.passStart = time.Now()
	r.loop.inflight++
	e.worker.jobs <- j // capacity 1, and the worker is idle: never blocks
}

// handleResult takes a finished pass (handleResults says what to publish).
func (r *Reconciler) handleResult(res passResult) {
	l := &r.loop
	e, ok := l.entries[res.key]
	if !ok {
		return
	}
	e.cancel()
	e.busy, e.cancel = false, nil
	l.inflight--
	l.seq++
	e.open = res.open
	now := time.Now()
	if res.close {
		if res.disk.err == nil && e.cfg == nil {
			l.released[e.identity] = true
			r.forget(e)
			return
		}
	} else {
		e.last = &res
		e.destroyed = append(e.destroyed, res.destroyed...)
		if n := len(e.destroyed) - r.opts.OrphanHistory; n > 0 {
			e.destroyed = slices.Delete(e.destroyed, 0, n)
		}
	}
	if res.retryable() && !e.dirty {
		// A pass wanted meanwhile waits for the retry too.
		e.wantPass = false
		e.attempts++
		e.retryAt = now.Add(r.opts.Backoff.Delay(e.attempts))
		l.retryBy(e.retryAt)
		r.log.Warn("storage pass of a disk failed; will retry", "disk", e.identity.String(), "err", res.firstErr(), "attempt", e.attempts, "retry_in", e.retryAt.Sub(now))
	} else {
		e.attempts, e.retryAt = 0, time.Time{}
	}
	if e.dirty || (e.cfg == nil) != res.close {
		// The config (or the disk's presence) changed meanwhile: a pass
		// for the new one, now.
		e.attempts, e.retryAt, e.dirty = 0, time.Time{}, false
		r.want(e)
		if e.gone != 0 {
			// The listing that found the disk gone serves it.
			e.needSeq = min(e.needSeq, e.gone)
		}
	}
	e.gone = 0
	if e.wantPass {
		l.scan = true // wanted while it was busy: it can start now
	}
}

// maxBatch bounds how many finished passes one publish covers.
const maxBatch = 64

// handleResults takes res and every other pass that has finished meanwhile
// (up to maxBatch), noting what is to be published (publish.go): with many
// disks becoming ready, one snapshot per pass was most of a pass's cost.
func (r *Reconciler) handleResults(res passResult) {
	r.takeResult(res)
	for range maxBatch - 1 {
		select {
		case res := <-r.results:
			r.takeResult(res)
		default:
			return
		}
	}
}

// takeResult takes a finished pass and notes what is to be published: a
// change a reader would see at once, a pass that found its disk as the last
// one left it within publishMinGap.
func (r *Reconciler) takeResult(res passResult) {
	e := r.loop.entries[res.key]
	var was *diskPart
	if e != nil && e.cfg != nil {
		was = e.part
	}
	r.handleResult(res)
	if e == nil || e.cfg == nil || r.loop.entries[res.key] != e {
		r.changed()
		return
	}
	if changedBeyondTimes(was, r.part(e, time.Now())) {
		r.changed()
	} else {
		r.timesMoved()
	}
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
