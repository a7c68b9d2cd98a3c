package storage

// The storage reconciler makes a Backend hold the configured disks' pools and
// the configured datasets, level-triggered: on every Update and every
// Options.Period it lists the disks and gives each configured disk a pass
// (an Update that leaves the storage as it was skips the disks whose pass
// began less than a second ago).
// A backend that reports hardware events (DiskWatcher: uevents, a vdev
// dir, the sim's faults) has the disks listed again at once on each, and
// a disk that came or went gets its pass at once; the period is the
// safety net.
//
// One goroutine (Run) owns the state. Every disk has a worker of its own that
// makes that disk's backend calls (its pool's, and those of the datasets on
// its pool), each under a deadline, and reports back to Run; so one disk's
// hung call delays no other disk's work, and Status and ZoneStorage read a
// published snapshot that never waits on a backend call. Upstream's config
// reconciler makes every disk's calls in one task, one pass at a time, which
// is how one `zfs get` on a dead disk wedged a whole sled.
//
// Within one disk's pass the order is upstream's: a pool no longer wanted is
// closed; the disk is adopted (a blank disk gets a pool, our pool with the
// configured id is opened, anything else is refused and left as it is); the
// pool's orphaned datasets are destroyed or reported; the pool's configured
// datasets are ensured, the transient zone root ("zone") before the zones'
// roots inside it. A disk dropped from the config is closed, never
// destroyed.

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
)

// Options tune the reconciler. Zero values take the defaults.
type Options struct {
	// Period is how often everything is checked again when nothing asks
	// sooner (default 30s). A pass is cheap (one listing of the disks, one of
	// each pool's datasets: reads only, when nothing differs), and 30s is
	// well inside how long a zone's restart takes, so a dataset deleted
	// behind the agent's back is noticed before anyone waits for it; a disk
	// inserted or pulled is noticed at once on a backend that reports it
	// (DiskWatcher), at the period otherwise; config changes are acted on
	// at once, and failures retry on Backoff, sooner.
	Period time.Duration
	// ListTimeout bounds one listing of the disks (default 30s).
	ListTimeout time.Duration
	// PoolTimeout bounds one CreatePool, OpenPool or ClosePool (default
	// 1m: making a filesystem on a large disk and mounting it take
	// seconds; a minute is a disk that does not answer).
	PoolTimeout time.Duration
	// DatasetTimeout bounds one Datasets or EnsureDataset (default 30s).
	DatasetTimeout time.Duration
	// DestroyTimeout bounds one DestroyDataset (default 1m: destroying a
	// large dataset takes longer than making one).
	DestroyTimeout time.Duration
	// Backoff spaces out passes of a disk whose last pass failed in a way
	// that may succeed later (default 1s doubling to 1m). Failures that
	// cannot (unexpected pool id, foreign content, a dataset with another
	// id) are not retried: they are decided again from each periodic
	// listing, without a call that could change anything.
	Backoff Backoff
	// InUse, if set, says whether a dataset (by full name) is in use by a
	// zone that still exists. An orphaned durable dataset in use is not
	// destroyed until it is no longer in use. It is called from the disk's
	// worker and must not block.
	InUse func(dataset string) bool
	// OnReadyChange, if set, is called whenever what ZoneStorage would
	// answer may have changed (a pool became managed or stopped being, a
	// dataset was ensured or failed, a call on a disk became slow or
	// ended, a disk left the listing). It is called from the reconciler's
	// loop with no lock held and must not block: a Poke fits.
	OnReadyChange func()
	// OrphanHistory is how many destroyed orphans each pool's status
	// keeps (default 32).
	OrphanHistory int
	Log           *slog.Logger
}

func (o *Options) setDefaults() {
	o.Period = cmp.Or(o.Period, 30*time.Second)
	o.ListTimeout = cmp.Or(o.ListTimeout, 30*time.Second)
	o.PoolTimeout = cmp.Or(o.PoolTimeout, time.Minute)
	o.DatasetTimeout = cmp.Or(o.DatasetTimeout, 30*time.Second)
	o.DestroyTimeout = cmp.Or(o.DestroyTimeout, time.Minute)
	o.Backoff.Initial = cmp.Or(o.Backoff.Initial, time.Second)
	o.Backoff.Max = cmp.Or(o.Backoff.Max, time.Minute)
	o.OrphanHistory = cmp.Or(o.OrphanHistory, 32)
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Backoff chooses the delay before a disk's next pass after consecutive
// failed passes (internal/backoff).
type Backoff = backoff.Backoff

// desired is one Update's storage config.
type desired struct {
	disks    []DiskConfig
	datasets []DatasetConfig
}

// Reconciler drives a Backend towards the newest storage config given to
// Update.
type Reconciler struct {
	backend Backend
	opts    Options
	log     *slog.Logger

	// latest holds the newest config; update (capacity 1) says it changed.
	latest atomic.Pointer[desired]
	update chan struct{}
	// poke asks for a pass of every disk soon.
	poke chan struct{}

	// results and listed carry finished backend work back to the loop;
	// slow says a call has become slow (activity.go).
	results chan passResult
	listed  chan listResult
	slow    chan struct{}
	// done is closed when Run returns, so late goroutines never block.
	done chan struct{}
	wg   sync.WaitGroup

	store store

	// Owned by the Run goroutine.
	loop loopState
}

// New returns a reconciler for backend. Call Run to start it.
func New(backend Backend, opts Options) *Reconciler {
	opts.setDefaults()
	r := &Reconciler{
		backend: backend,
		opts:    opts,
		log:     opts.Log,
		update:  make(chan struct{}, 1),
		poke:    make(chan struct{}, 1),
		results: make(chan passResult),
		listed:  make(chan listResult),
		slow:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	r.loop.init()
	r.store.snap = &snapshot{ready: readiness{pools: map[string]poolReady{}, datasets: map[string]datasetReady{}}}
	return r
}

// Update hands the reconciler the storage half of a new config. It never
// blocks; the newest config wins.
func (r *Reconciler) Update(disks []DiskConfig, datasets []DatasetConfig) {
	d := &desired{disks: append([]DiskConfig(nil), disks...), datasets: append([]DatasetConfig(nil), datasets...)}
	r.latest.Store(d)
	select {
	case r.update <- struct{}{}:
	default:
	}
}

// Poke asks for a pass of every disk not waiting out a backoff, as the
// period would: when a zone stops, an orphaned dataset it used may now be
// destroyed. It never blocks.
func (r *Reconciler) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Run reconciles until ctx ends. On return every backend call it started
// has returned (their contexts are cancelled; each honours its deadline).
// Pools and datasets are left as they are: stopping the agent closes and
// destroys nothing.
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		close(r.done)
		r.wg.Wait()
	}()
	tick := time.NewTicker(r.opts.Period)
	defer tick.Stop()
	wake := time.NewTimer(time.Hour)
	wake.Stop()
	defer wake.Stop()

	var events <-chan struct{}
	if w, ok := r.backend.(DiskWatcher); ok {
		events = w.DiskEvents(ctx)
	}
	r.startList(ctx) // what is there, for status, before any config
	for {
		r.step(ctx, time.Now())
		r.flush(time.Now())
		r.refreshActivity(time.Now())
		if d, ok := r.nextWakeIn(time.Now()); ok {
			wake.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.update:
			r.setDesired(r.latest.Load())
		case <-tick.C:
			r.periodic(ctx)
		case <-r.poke:
			r.periodic(ctx)
		case _, ok := <-events:
			if !ok {
				events = nil // the watcher stopped: the period goes on
				break
			}
			r.diskEvent(ctx)
		case lr := <-r.listed:
			r.handleList(ctx, lr)
		case res := <-r.results:
			r.handleResults(res)
		case <-r.slow:
			r.loop.act.due = true
		case <-wake.C:
		}
	}
}
