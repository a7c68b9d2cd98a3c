package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Errors that say why a disk or a dataset is refused. They are not retried:
// only a change of the config (or of the disk) can change the answer.
var (
	ErrUnexpectedPoolID = errors.New("unexpected pool id")
	ErrForeign          = errors.New("disk holds something this agent did not make")
	ErrInternalDisk     = errors.New("internal (M.2) disks are not managed by the control plane")
)

// job is one pass of one disk.
type job struct {
	ctx context.Context
	// disk is the disk's config; nil: close the pool open on it (open).
	disk     *DiskConfig
	observed *Disk // as last listed; nil: not present
	datasets []DatasetConfig
	// open is the pool open on the disk, as far as the loop knows.
	open string
}

type outcome struct {
	err       error // nil: ok
	retryable bool
}

type datasetOutcome struct {
	outcome
	dataset *Dataset // when ok: the dataset as it is now
}

// passResult is what one pass did and found.
type passResult struct {
	key   DiskIdentity
	close bool // a close, not a pass
	at    time.Time
	// open is the pool open on the disk after the pass ("" none).
	open string
	// disk is the adoption's outcome (the close's, for a close).
	disk outcome
	pool *Pool
	// datasets are the configured datasets' outcomes, by id.
	datasets map[string]datasetOutcome
	// observed are the pool's datasets as read (listed) at readAt.
	listed   bool
	observed []Dataset
	readAt   time.Time
	// orphans are those found and kept; destroyed, those destroyed.
	orphans    []Orphan
	destroyed  []Orphan
	orphanFail bool // a destroy failed and is to be retried
}

func (p *passResult) retryable() bool {
	if p.disk.err != nil && p.disk.retryable || p.orphanFail {
		return true
	}
	for _, o := range p.datasets {
		if o.err != nil && o.retryable {
			return true
		}
	}
	return false
}

func (p *passResult) firstErr() error {
	if p.disk.err != nil {
		return p.disk.err
	}
	for _, o := range p.datasets {
		if o.err != nil {
			return o.err
		}
	}
	return nil
}

// worker makes one disk's backend calls, one at a time, so that this
// disk's trouble is nobody else's.
type worker struct {
	r     *Reconciler
	id    DiskIdentity
	jobs  chan job
	stopc chan struct{}
	// act is the call in flight, for status; written by the worker, read
	// by Status and the loop.
	act atomic.Pointer[activity]
	// slow tells the loop when a call has taken slowCall (activity.go);
	// armed for each call, stopped when it returns.
	slow *time.Timer
}

func (r *Reconciler) startWorker(id DiskIdentity) *worker {
	w := &worker{r: r, id: id, jobs: make(chan job, 1), stopc: make(chan struct{})}
	w.slow = time.AfterFunc(time.Hour, r.callSlow)
	w.slow.Stop()
	r.wg.Go(w.run)
	return w
}

func (w *worker) stop() { close(w.stopc) }

func (w *worker) run() {
	for {
		select {
		case <-w.stopc:
			return
		case <-w.r.done:
			return
		case j := <-w.jobs:
			res := w.do(j)
			res.at = time.Now()
			select {
			case w.r.results <- res:
			case <-w.r.done:
				return
			}
		}
	}
}

// hungError is a call that did not answer within its deadline. The rest of
// its disk's pass is not attempted: the disk would most likely not answer
// either, and each call would cost another deadline.
type hungError struct {
	what    string
	timeout time.Duration
	err     error
}

func (e *hungError) Error() string {
	return fmt.Sprintf("%s: no answer within %s: %v", e.what, e.timeout, e.err)
}
func (e *hungError) Unwrap() error { return e.err }

// call runs one backend call under its deadline.
func (w *worker) call(ctx context.Context, timeout time.Duration, what string, f func(context.Context) error) error {
	w.act.Store(&activity{what: what, since: time.Now(), timeout: timeout})
	w.slow.Reset(slowCall)
	defer func() {
		w.slow.Stop()
		w.act.Store(nil)
	}()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := f(cctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil && cctx.Err() == context.DeadlineExceeded:
		return &hungError{what: what, timeout: timeout, err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (w *worker) do(j job) passResult {
	res := passResult{key: w.id, open: j.open}
	if j.disk == nil {
		res.close = true
		if j.open != "" {
			err := w.call(j.ctx, w.r.opts.PoolTimeout, "closing pool "+PoolName(j.open), func(ctx context.Context) error {
				return w.r.backend.ClosePool(ctx, j.open)
			})
			if err != nil {
				res.disk = outcome{err: err, retryable: true}
				return res
			}
			w.r.log.Info("pool closed: it is no longer managed (nothing destroyed)", "disk", w.id.String(), "pool", PoolName(j.open))
			res.open = ""
		}
		return res
	}
	res.datasets = make(map[string]datasetOutcome, len(j.datasets))
	if !w.adopt(j, &res) {
		for _, ds := range j.datasets {
			err := fmt.Errorf("pool %s is not managed: disk %s: %w", PoolName(ds.PoolID), j.disk.ID, res.disk.err)
			res.datasets[ds.ID] = datasetOutcome{outcome: outcome{err: err, retryable: res.disk.retryable}}
		}
		return res
	}
	w.datasets(j, &res)
	return res
}

// adopt makes the configured disk's pool managed: it creates it on a blank
// disk and opens it; it refuses (and leaves as it is) anything else.
func (w *worker) adopt(j job, res *passResult) bool {
	cfg, obs := j.disk, j.observed
	want, name := cfg.PoolID, PoolName(cfg.PoolID)
	fail := func(err error, retryable bool) bool {
		res.disk = outcome{err: err, retryable: retryable}
		return false
	}
	closeOpen := func() error {
		err := w.call(j.ctx, w.r.opts.PoolTimeout, "closing pool "+PoolName(res.open), func(ctx context.Context) error {
			return w.r.backend.ClosePool(ctx, res.open)
		})
		if err == nil {
			res.open = ""
		}
		return err
	}
	if res.open != "" && res.open != want {
		// The config now puts another pool on this disk: the one open is
		// no longer managed.
		if err := closeOpen(); err != nil {
			return fail(err, true)
		}
	}
	switch {
	case obs == nil:
		if res.open != "" {
			// The disk vanished under its pool: stop using it.
			if err := closeOpen(); err != nil {
				w.r.log.Warn("closing the pool of a vanished disk failed", "disk", cfg.Identity.String(), "err", err)
			}
		}
		return fail(fmt.Errorf("disk %s: %w", cfg.Identity, ErrNoDisk), true)
	case res.open == want:
		// Ours and open: open it again (a no-op unless something undid
		// it behind our back).
	case obs.Variant == VariantM2:
		return fail(fmt.Errorf("disk %s: %w", cfg.Identity, ErrInternalDisk), false)
	case obs.Content == ContentForeign:
		return fail(fmt.Errorf("disk %s holds %s: %w; it is never formatted", cfg.Identity, cmp.Or(obs.Foreign, "something"), ErrForeign), false)
	case obs.Content == ContentPool && obs.PoolID != want:
		return fail(fmt.Errorf("disk %s holds pool %s, not the configured %s: %w; it is left as it is", cfg.Identity, PoolName(obs.PoolID), name, ErrUnexpectedPoolID), false)
	case obs.Content == ContentBlank:
		err := w.call(j.ctx, w.r.opts.PoolTimeout, "creating pool "+name, func(ctx context.Context) error {
			return w.r.backend.CreatePool(ctx, cfg.Identity, want)
		})
		if err != nil {
			return fail(fmt.Errorf("disk %s: %w", cfg.Identity, err), true)
		}
		w.r.log.Info("pool created on a blank disk", "disk", cfg.Identity.String(), "pool", name)
	case obs.Content == ContentPool:
	default:
		return fail(fmt.Errorf("disk %s: the backend says it holds %q, which this agent does not know", cfg.Identity, obs.Content), false)
	}
	var pool Pool
	err := w.call(j.ctx, w.r.opts.PoolTimeout, "opening pool "+name, func(ctx context.Context) (err error) {
		pool, err = w.r.backend.OpenPool(ctx, cfg.Identity, want)
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("disk %s: %w", cfg.Identity, err), true)
	}
	if res.open != want {
		w.r.log.Info("pool managed", "disk", cfg.Identity.String(), "pool", name)
	}
	res.open, res.pool = want, &pool
	return true
}

// datasets destroys the pool's orphaned datasets (or reports why not) and
// ensures its configured ones.
func (w *worker) datasets(j job, res *passResult) {
	poolID, name := j.disk.PoolID, PoolName(j.disk.PoolID)
	var list []Dataset
	err := w.call(j.ctx, w.r.opts.DatasetTimeout, "listing the datasets of pool "+name, func(ctx context.Context) (err error) {
		list, err = w.r.backend.Datasets(ctx, poolID)
		return err
	})
	if err != nil {
		for _, ds := range j.datasets {
			res.datasets[ds.ID] = datasetOutcome{outcome: outcome{err: fmt.Errorf("dataset %s not ensured: %w", ds.Name(), err), retryable: true}}
		}
		return
	}
	res.listed, res.readAt = true, time.Now()
	byName := make(map[string]Dataset, len(list))
	for _, d := range list {
		byName[d.Name] = d
	}
	order := ensureOrder(j.datasets)
	wanted := make(map[string]bool, len(order))
	for _, o := range order {
		wanted[o.name] = true
	}

	// stop is a call that did not answer; the rest is not attempted.
	var stop error
	slices.SortFunc(list, func(a, b Dataset) int { return strings.Compare(a.Name, b.Name) })
	for _, d := range list {
		// Upstream tells orphans by id; we go by name: a durable dataset
		// found with another id is reported (ErrOtherID) and left, not
		// destroyed and made again, since destroying data cannot be
		// undone and an id mismatch is the config's to resolve.
		kind, ours := kindOf(poolID, d.Name)
		if !ours || wanted[d.Name] {
			continue
		}
		o := Orphan{Name: d.Name, ID: d.ID, Kind: kind, PoolID: poolID, At: time.Now(), Dataset: d}
		destroy, reason := orphanPolicy(kind)
		switch {
		case !destroy:
			o.Reason = reason
		case stop != nil:
			o.Reason, res.orphanFail = "not destroyed yet: "+stop.Error(), true
		case w.r.opts.InUse != nil && w.r.opts.InUse(d.Name):
			o.Reason = "not destroyed yet: in use by a zone that still exists"
		default:
			err := w.call(j.ctx, w.r.opts.DestroyTimeout, "destroying orphaned dataset "+d.Name, func(ctx context.Context) error {
				return w.r.backend.DestroyDataset(ctx, poolID, d.Name)
			})
			if err != nil {
				o.Reason, res.orphanFail = "destroy failed: "+err.Error(), true
				if errors.As(err, new(*hungError)) {
					stop = err
				}
				break
			}
			w.r.log.Info("orphaned dataset destroyed: the config no longer names it", "dataset", d.Name, "id", d.ID)
			o.Destroyed, o.Reason = true, "destroyed: the config no longer names it"
			delete(byName, d.Name)
			res.destroyed = append(res.destroyed, o)
			continue
		}
		res.orphans = append(res.orphans, o)
	}

	for _, od := range order {
		ds := od.cfg
		o := w.ensure(j, ds, od.name, byName, res.datasets, stop)
		if errors.As(o.err, new(*hungError)) && stop == nil {
			stop = o.err
		}
		if o.dataset != nil {
			byName[o.dataset.Name] = *o.dataset
		}
		res.datasets[ds.ID] = o
	}
	res.observed = make([]Dataset, 0, len(byName))
	for _, d := range byName {
		res.observed = append(res.observed, d)
	}
	slices.SortFunc(res.observed, func(a, b Dataset) int { return strings.Compare(a.Name, b.Name) })
}

// ordered is a configured dataset with its name and its place in
// ensureOrder.
type ordered struct {
	cfg  DatasetConfig
	name string
	rank int
}

// ensureOrder puts the transient zone root ("zone") first and the zones'
// roots inside it last, each dataset's name written once.
func ensureOrder(ds []DatasetConfig) []ordered {
	out := make([]ordered, len(ds))
	for i, d := range ds {
		out[i] = ordered{cfg: d, name: d.Name(), rank: 1}
		switch {
		case d.Kind == "zone":
			out[i].rank = 0
		case IsZoneRoot(d.Kind):
			out[i].rank = 2
		}
	}
	slices.SortStableFunc(out, func(a, b ordered) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), strings.Compare(a.name, b.name))
	})
	return out
}

// ensure makes one configured dataset, named name, as configured, calling
// the backend only if what is there differs.
func (w *worker) ensure(j job, ds DatasetConfig, name string, byName map[string]Dataset, done map[string]datasetOutcome, stop error) datasetOutcome {
	fail := func(err error, retryable bool) datasetOutcome {
		return datasetOutcome{outcome: outcome{err: err, retryable: retryable}}
	}
	if IsZoneRoot(ds.Kind) {
		root := DatasetName(ds.PoolID, "zone")
		var rootOutcome *datasetOutcome
		for _, other := range j.datasets {
			if other.Kind == "zone" {
				o := done[other.ID]
				rootOutcome = &o
			}
		}
		switch {
		case rootOutcome == nil:
			return fail(fmt.Errorf("dataset %s not ensured: the transient zone root %s is not in the config", name, root), false)
		case rootOutcome.err != nil:
			return fail(fmt.Errorf("dataset %s not ensured: the transient zone root %s is not: %w", name, root, rootOutcome.err), rootOutcome.retryable)
		}
	}
	if stop != nil {
		return fail(fmt.Errorf("dataset %s not attempted: %w", name, stop), true)
	}
	obs, found := byName[name]
	if found && obs.ID != "" && obs.ID != ds.ID {
		return fail(fmt.Errorf("dataset %s has id %s, not the configured %s: %w; it is left as it is", name, obs.ID, ds.ID, ErrOtherID), false)
	}
	if found && obs.ID == ds.ID && samePtr(obs.Quota, ds.Quota) && samePtr(obs.Reservation, ds.Reservation) && obs.Compression == ds.Compression {
		return datasetOutcome{dataset: &obs}
	}
	var d Dataset
	err := w.call(j.ctx, w.r.opts.DatasetTimeout, "ensuring dataset "+name, func(ctx context.Context) (err error) {
		d, err = w.r.backend.EnsureDataset(ctx, ds)
		return err
	})
	if err != nil {
		return fail(err, !errors.Is(err, ErrOtherID))
	}
	if found {
		w.r.log.Info("dataset properties set", "dataset", name, "id", ds.ID)
	} else {
		w.r.log.Info("dataset created", "dataset", name, "id", ds.ID)
	}
	return datasetOutcome{dataset: &d}
}
