// Package reconciler makes the zones on a sled match the ledgered sled config.
//
// One goroutine (Run) owns the zone map. Every runtime call runs in its own
// goroutine under a deadline and reports back over a channel, so one stuck zone
// never delays any other, and no lock is ever held across a runtime call.
// Readers get published snapshots (Status, Zones) and never wait on
// reconciliation. A periodic relist of the runtime notices zones that died or
// vanished behind the agent's back.
package reconciler

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Runtime creates, destroys and lists zones. It is the only code that touches
// the OS. Every method must honour ctx's deadline.
type Runtime interface {
	// Ensure makes the zone exist with spec's config and returns once its
	// service is up. It returns an error wrapping zone.ErrGone if the zone
	// disappears while Ensure waits for it.
	Ensure(ctx context.Context, spec zone.Spec) error
	// Destroy removes every part of the named zone. A zone that does not exist
	// is not an error.
	Destroy(ctx context.Context, name string) error
	// List returns every zone that exists and is owned by this agent.
	List(ctx context.Context) ([]zone.Observed, error)
}

// Options tune the reconciler. Zero values take the defaults.
type Options struct {
	// StartTimeout bounds one Ensure call (default 2m).
	StartTimeout time.Duration
	// StopTimeout bounds one Destroy call (default 1m).
	StopTimeout time.Duration
	// ListTimeout bounds one List call (default 10s).
	ListTimeout time.Duration
	// RelistPeriod is how often the runtime is listed to catch zones that died
	// or vanished (default 5s).
	RelistPeriod time.Duration
	// Backoff spaces out attempts on a failing zone (default 1s doubling to 1m).
	Backoff Backoff
	// StablePeriod is how long a zone must run before its failure count is
	// forgotten (default 1m).
	StablePeriod time.Duration
	// HealthPeriod is how often every running zone is health-checked, when
	// the runtime is a HealthChecker (default 5s; negative: never).
	HealthPeriod time.Duration
	// HealthTimeout bounds one health check (default 5s).
	HealthTimeout time.Duration
	// HealthFailures is how many checks in a row must fail before a running
	// zone is taken as unhealthy and repaired: stopped and started again,
	// on the normal backoff (default 3).
	HealthFailures int
	// HistoryLen is how many events each zone's history keeps (default 32).
	HistoryLen int
	// RemovedLen is how many removed zones' last statuses are kept for
	// Removed (default 64; history.go).
	RemovedLen int
	// HistoryFile, if set, is where the zones' histories and the removed
	// zones are kept across restarts, written at most every
	// HistoryWriteEvery (default 5s) and when Run returns (history.go).
	HistoryFile       string
	HistoryWriteEvery time.Duration
	// Metrics receives the reconciler's metrics; nil records nothing.
	Metrics *Metrics
	// OnRunningChange, if set, is called whenever a zone starts or stops
	// running (RunningSpecs changes). It is called from the reconciler's
	// loop with no lock held and must not block: a Poke fits.
	OnRunningChange func()
	// OnPresentChange, if set, is called whenever PresentSpecs changes, in
	// the same way as OnRunningChange.
	OnPresentChange func()
	// Storage, if set, says whether a zone's storage is ready; a zone
	// starts only when it is (see gates.go).
	Storage Storage
	// TimeSync, if set, says whether a zone may start as far as
	// synchronized time goes (see gates.go).
	TimeSync TimeSync
}

func (o *Options) setDefaults() {
	o.StartTimeout = cmp.Or(o.StartTimeout, 2*time.Minute)
	o.StopTimeout = cmp.Or(o.StopTimeout, time.Minute)
	o.ListTimeout = cmp.Or(o.ListTimeout, 10*time.Second)
	o.RelistPeriod = cmp.Or(o.RelistPeriod, 5*time.Second)
	o.Backoff.Initial = cmp.Or(o.Backoff.Initial, time.Second)
	o.Backoff.Max = cmp.Or(o.Backoff.Max, time.Minute)
	o.StablePeriod = cmp.Or(o.StablePeriod, time.Minute)
	o.HealthPeriod = cmp.Or(o.HealthPeriod, 5*time.Second)
	o.HealthTimeout = cmp.Or(o.HealthTimeout, 5*time.Second)
	o.HealthFailures = max(cmp.Or(o.HealthFailures, 3), 1)
	o.HistoryLen = cmp.Or(o.HistoryLen, 32)
	o.RemovedLen = cmp.Or(o.RemovedLen, 64)
	o.HistoryWriteEvery = cmp.Or(o.HistoryWriteEvery, 5*time.Second)
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
}

// Reconciler drives a Runtime towards the newest config given to Update.
type Reconciler struct {
	rt   Runtime
	log  *slog.Logger
	opts Options

	// latest holds the newest config; update has capacity 1 and says "latest
	// changed". Bursts of updates coalesce: the loop only ever reads the newest.
	latest atomic.Pointer[sledconfig.Config]
	update chan struct{}
	// poke asks for a relist soon (runtime events use it).
	poke chan struct{}
	// storageChanged and timeSyncChanged say a gate may have changed.
	storageChanged, timeSyncChanged chan struct{}

	// results and listed carry finished runtime calls back to the loop.
	results chan opResult
	listed  chan listResult
	health  chan healthResult
	// done is closed when Run returns, so late op goroutines never block.
	done chan struct{}
	// restored is closed when the restore protocol is done (restore.go).
	restored chan struct{}
	ops      sync.WaitGroup

	store store

	// Everything below is owned by the Run goroutine.
	loop loopState
}

// New returns a reconciler for rt. Call Run to start it.
func New(rt Runtime, log *slog.Logger, opts Options) *Reconciler {
	opts.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{
		rt:              rt,
		log:             log,
		opts:            opts,
		update:          make(chan struct{}, 1),
		poke:            make(chan struct{}, 1),
		storageChanged:  make(chan struct{}, 1),
		timeSyncChanged: make(chan struct{}, 1),
		results:         make(chan opResult),
		listed:          make(chan listResult),
		health:          make(chan healthResult),
		done:            make(chan struct{}),
		restored:        make(chan struct{}),
	}
	r.store.zones = map[string]ZoneStatus{}
	r.store.running = map[string]*zone.Spec{}
	r.store.present = map[string]*zone.Spec{}
	r.store.status = Status{Phase: PhaseNotYetRun}
	r.loadHistory()
	r.loop.init()
	return r
}

// Update hands the reconciler a new desired config. It never blocks; the
// newest config wins.
func (r *Reconciler) Update(cfg *sledconfig.Config) {
	r.latest.Store(cfg)
	select {
	case r.update <- struct{}{}:
	default:
	}
}

// Poke asks for a relist of the runtime as soon as possible. It never blocks.
// Runtimes call it when they notice a zone dying.
func (r *Reconciler) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Run reconciles until ctx is cancelled. It first rebuilds its state from what
// the runtime lists (the restore protocol, restore.go), adopting running zones
// rather than restarting them. On return, every runtime call it started has
// returned: their contexts are cancelled and each honours its deadline. Zones
// are left as they are (shutting down the agent is not destroying its zones).
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	histCtx, histStop := context.WithCancel(context.Background())
	histDone := make(chan struct{})
	go func() {
		defer close(histDone)
		r.keepHistory(histCtx)
	}()
	defer func() {
		cancel()
		close(r.done)
		r.ops.Wait()
		// The histories as they are at the end, written once more.
		histStop()
		<-histDone
	}()

	relist := time.NewTicker(r.opts.RelistPeriod)
	defer relist.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var healthTick <-chan time.Time
	if _, ok := r.rt.(HealthChecker); ok && r.opts.HealthPeriod > 0 {
		t := time.NewTicker(r.opts.HealthPeriod)
		defer t.Stop()
		healthTick = t.C
	}

	// Learn what exists before acting on anything.
	if err := r.restore(ctx); err != nil {
		return nil // stopped before it could list
	}
	for {
		r.step(ctx)
		if d, ok := r.loop.nextWakeIn(time.Now()); ok {
			retry.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.update:
			r.setDesired(r.latest.Load())
			r.sweep(ctx) // once, with the first config
		case res := <-r.results:
			r.handleResult(res)
		case lr := <-r.listed:
			r.handleList(ctx, lr)
		case <-relist.C:
			r.startList(ctx)
		case <-r.poke:
			r.startList(ctx)
		case <-r.storageChanged:
			r.retryHeld(gateStorage)
		case <-r.timeSyncChanged:
			r.retryHeld(gateTimeSync)
		case <-healthTick:
			r.startHealthRound(ctx)
		case hr := <-r.health:
			r.handleHealth(hr)
		case <-retry.C:
		}
	}
}
