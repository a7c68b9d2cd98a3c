package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// loopState is owned by the Run goroutine; nothing else touches it.
type loopState struct {
	haveConfig bool
	// swept: leftovers were looked for (once, with the first config).
	swept  bool
	config *sledconfig.Config
	zones  map[string]*entry // keyed by zone name
	// dirty zones are evaluated on the next step.
	dirty map[string]struct{}
	// waiting zones have a retry time (entry.nextTry).
	waiting map[string]struct{}
	// pending zones wait for a zone they replace to shut down.
	pending map[string]struct{}
	// leaving zones exist but are not wanted as they are (removed, or
	// replaced by a changed config); zones sharing their id or an address wait.
	leaving map[string]*entry
	// wanted is the desired spec of every zone, by name.
	wanted map[string]*zone.Spec
	// seq counts changes to what the loop believes exists; a listing that
	// started before a zone's last change says nothing about that zone.
	seq      uint64
	inflight int
	listing  bool
	// listAgain: a relist was asked for while one was in flight.
	listAgain bool
	counts    map[State]int

	passActive bool
	passStart  time.Time
	passes     uint64
	last       *Reconciliation
	lastRanFor time.Duration
	lastDone   time.Time
	// lastStale: a zone changed since last was built, at lastBuilt.
	lastStale bool
	lastBuilt time.Time
	// healthRound: a round of health checks is in flight.
	healthRound bool
}

func (l *loopState) init() {
	l.zones = map[string]*entry{}
	l.dirty = map[string]struct{}{}
	l.waiting = map[string]struct{}{}
	l.pending = map[string]struct{}{}
	l.leaving = map[string]*entry{}
	l.wanted = map[string]*zone.Spec{}
	l.counts = map[State]int{}
}

// entry is the loop's record of one zone name.
type entry struct {
	name string
	id   string
	kind string
	// want is the spec wanted for this name; nil means the zone is to go.
	want *zone.Spec

	// What exists, as far as the loop knows.
	exists  bool // something of the zone may exist and must be destroyed before forgetting it
	running bool // it is up with config runHash
	runHash string
	addrs   []netip.Addr // underlay addresses of what exists
	// cleanup: what exists is broken; destroy it before the next start.
	cleanup bool
	changed uint64 // loopState.seq at the last change of the fields above

	state     State
	since     time.Time
	busy      bool
	op        opKind
	opHash    string // config hash a start in flight is starting
	opCleanup bool   // the start in flight first cleans up what is left
	opStart   time.Time
	opTimeout time.Duration
	// progress is what the runtime last said the call in flight waits for;
	// the call's goroutine writes it, the loop reads it.
	progress     *atomic.Pointer[string]
	cancel       context.CancelFunc
	attempts     int
	lastErr      string
	nextTry      time.Time
	runningSince time.Time
	incidents    int
	health       Health
	// heldBy names the gate (gates.go) that held the last start back,
	// held counts how many times in a row, waitFor is what the gate said;
	// opStorage is where the zone's storage is for the start dispatched.
	heldBy    string
	held      int
	waitFor   string
	opStorage zone.Storage
	history   []Event
	// priorTaken: the history the history file held of the zone, if any,
	// was put before history (history.go).
	priorTaken bool
}

type opKind int

const (
	opStart opKind = iota
	opStop
)

func (k opKind) String() string {
	if k == opStart {
		return "start"
	}
	return "stop"
}

type opResult struct {
	name    string
	kind    opKind
	spec    zone.Spec // for starts
	err     error
	elapsed time.Duration
}

type listResult struct {
	observed []zone.Observed
	err      error
	seq      uint64
}

// setDesired makes cfg the desired state and starts a pass.
func (r *Reconciler) setDesired(cfg *sledconfig.Config) {
	if cfg == nil {
		return
	}
	l := &r.loop
	r.beginPass() // the pass includes working out what changed
	l.haveConfig = true
	l.config = cfg
	wanted := wantedSpecs(cfg, l.zones)
	l.wanted = wanted
	for name, e := range l.zones {
		spec, ok := wanted[name]
		if !ok {
			spec = nil
		}
		if sameWant(e.want, spec) {
			if e.state == StateUnmanaged {
				r.touch(e)
			}
			continue
		}
		if e.want != nil && spec != nil {
			r.record(e, "config changed", fmt.Sprintf("config %s → %s", short(e.want.Hash), short(spec.Hash)))
		} else if spec == nil {
			r.record(e, "removed from config", "")
		}
		e.want = spec
		if spec != nil {
			e.id = spec.ID
			e.kind = spec.Config.ZoneType.Type
		}
		// A start in flight for a config that is no longer wanted is abandoned.
		if e.busy && e.op == opStart && (spec == nil || spec.Hash != e.opHash) {
			e.cancel()
		}
		// New intent, fresh attempts.
		e.attempts, e.held = 0, 0
		e.nextTry = time.Time{}
		delete(l.waiting, name)
		r.touch(e)
	}
	for name, spec := range wanted {
		if _, ok := l.zones[name]; ok {
			continue
		}
		e := &entry{name: name, id: spec.ID, kind: spec.Config.ZoneType.Type, want: spec}
		l.zones[name] = e
		r.setState(e, StatePending, "")
		r.touch(e)
	}
	r.publishStatus() // the running pass now shows the new config
}

// wantedSpecs returns the spec of every zone in cfg, by name, reusing the
// spec of a known zone whose config did not change.
func wantedSpecs(cfg *sledconfig.Config, known map[string]*entry) map[string]*zone.Spec {
	wanted := make(map[string]*zone.Spec, len(cfg.Zones))
	for id := range cfg.Zones {
		z := cfg.Zones[id]
		name := z.Name()
		if e, ok := known[name]; ok && e.want != nil && e.want.Hash == z.Hash() {
			wanted[name] = e.want // unchanged: keep the spec we have
			continue
		}
		spec := zone.SpecFor(&z)
		wanted[name] = &spec
	}
	return wanted
}

func sameWant(a, b *zone.Spec) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Hash == b.Hash
}

// step evaluates every dirty zone and every zone whose retry time has come,
// then closes the pass if nothing is left in flight.
func (r *Reconciler) step(ctx context.Context) {
	l := &r.loop
	now := time.Now()
	for name := range l.waiting {
		if e, ok := l.zones[name]; !ok || !now.Before(e.nextTry) {
			delete(l.waiting, name)
			l.dirty[name] = struct{}{}
		}
	}
	for name := range l.dirty {
		delete(l.dirty, name)
		if e, ok := l.zones[name]; ok {
			r.evaluate(ctx, e, now)
		}
	}
	r.settle(now)
}

// nextWakeIn returns how long until the loop must step on its own: the
// earliest retry, or a rebuild of the last reconciliation.
func (l *loopState) nextWakeIn(now time.Time) (time.Duration, bool) {
	d, ok := l.nextRetryIn(now)
	if s, sok := l.nextSettleIn(now); sok && (!ok || s < d) {
		d, ok = s, true
	}
	return d, ok
}

// nextRetryIn returns how long until the earliest retry.
func (l *loopState) nextRetryIn(now time.Time) (time.Duration, bool) {
	var earliest time.Time
	for name := range l.waiting {
		e, ok := l.zones[name]
		if ok && (earliest.IsZero() || e.nextTry.Before(earliest)) {
			earliest = e.nextTry
		}
	}
	if earliest.IsZero() {
		return 0, false
	}
	return max(earliest.Sub(now), 0), true
}

// evaluate decides the next action for one zone and starts it.
func (r *Reconciler) evaluate(ctx context.Context, e *entry, now time.Time) {
	l := &r.loop
	if e.busy {
		return
	}
	if !l.haveConfig {
		if e.state != StateUnmanaged {
			r.setState(e, StateUnmanaged, "")
		}
		return
	}
	delete(l.pending, e.name)
	if e.want == nil {
		if !e.exists {
			r.forget(e)
			return
		}
		if r.waitRetry(e, now) {
			return
		}
		r.dispatch(ctx, e, opStop, "removed from config")
		return
	}
	if e.exists && e.runHash != e.want.Hash {
		if r.waitRetry(e, now) {
			return
		}
		r.dispatch(ctx, e, opStop, "config changed")
		return
	}
	if e.exists && e.running {
		if e.state != StateRunning {
			r.setState(e, StateRunning, "")
		}
		return
	}
	if r.waitRetry(e, now) {
		return
	}
	if blocker := r.blocker(e); blocker != "" {
		l.pending[e.name] = struct{}{}
		if e.state != StatePending {
			r.setState(e, StatePending, "")
			r.record(e, "waiting", "for "+blocker+" to shut down first")
		}
		return
	}
	st, err := r.zoneStorage(e.want)
	if err != nil {
		r.hold(e, now, gateStorage, err)
		return
	}
	if err := r.zoneTimeSync(e.want); err != nil {
		r.hold(e, now, gateTimeSync, err)
		return
	}
	e.heldBy, e.held, e.waitFor, e.opStorage = "", 0, "", st
	r.dispatch(ctx, e, opStart, "")
}

// waitRetry reports whether e must wait for its retry time, and schedules it.
func (r *Reconciler) waitRetry(e *entry, now time.Time) bool {
	if e.nextTry.IsZero() || !now.Before(e.nextTry) {
		return false
	}
	r.loop.waiting[e.name] = struct{}{}
	return true
}

// blocker names a zone that must shut down before e may start: another
// incarnation of the same zone id, or a zone holding one of e's addresses.
func (r *Reconciler) blocker(e *entry) string {
	if len(r.loop.leaving) == 0 {
		return ""
	}
	addrs := e.want.Config.UnderlayAddrs()
	for _, o := range r.loop.leaving {
		if o == e {
			continue
		}
		if o.id == e.id {
			return o.name
		}
		for _, a := range o.addrs {
			for _, b := range addrs {
				if a == b {
					return o.name
				}
			}
		}
	}
	return ""
}

// dispatch runs one runtime call for e in its own goroutine, under a deadline.
func (r *Reconciler) dispatch(ctx context.Context, e *entry, kind opKind, why string) {
	l := &r.loop
	r.beginPass()
	timeout := r.opts.StopTimeout
	state := StateStopping
	var spec zone.Spec
	if kind == opStart {
		timeout = r.opts.StartTimeout
		state = StateStarting
		spec = *e.want
		spec.Storage = e.opStorage
		e.opHash = spec.Hash
	}
	cleanup := e.cleanup && kind == opStart
	progress := new(atomic.Pointer[string])
	opCtx, cancel := context.WithTimeout(zone.WithProgress(ctx, func(s string) { progress.Store(&s) }), timeout)
	e.busy, e.op, e.cancel = true, kind, cancel
	e.opCleanup, e.opStart, e.opTimeout, e.progress = cleanup, time.Now(), timeout, progress
	l.inflight++
	r.setState(e, state, "")
	r.record(e, kind.String(), why)
	r.syncPresent(e)
	name := e.name
	r.ops.Add(1)
	go func() {
		defer r.ops.Done()
		defer cancel()
		t0 := time.Now()
		var err error
		if kind == opStop || cleanup {
			err = r.rt.Destroy(opCtx, name)
			if err != nil && cleanup {
				err = fmt.Errorf("cleaning up before start: %w", err)
			}
		}
		if kind == opStart && err == nil {
			err = r.rt.Ensure(opCtx, spec)
		}
		if err != nil && opCtx.Err() == context.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (deadline of %s exceeded)", err, timeout)
		} else if err != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%s did not finish within %s: %w", kind, timeout, err)
		}
		res := opResult{name: name, kind: kind, spec: spec, err: err, elapsed: time.Since(t0)}
		select {
		case r.results <- res:
		case <-r.done:
		}
	}()
}

// handleResult applies a finished runtime call.
func (r *Reconciler) handleResult(res opResult) {
	l := &r.loop
	l.inflight--
	l.seq++
	e := l.zones[res.name]
	e.busy, e.cancel, e.progress = false, nil, nil
	e.changed = l.seq
	defer r.touch(e)
	now := time.Now()
	result := "ok"
	if res.err != nil {
		result = "error"
	}
	r.opts.Metrics.ops.WithLabelValues(res.kind.String(), result).Inc()
	r.opts.Metrics.opSeconds.WithLabelValues(res.kind.String()).Observe(res.elapsed.Seconds())

	switch {
	case res.kind == opStart && res.err == nil:
		e.exists, e.running, e.cleanup = true, true, false
		e.runHash = res.spec.Hash
		e.addrs = res.spec.Config.UnderlayAddrs()
		e.lastErr, e.nextTry = "", time.Time{}
		e.runningSince = now
		e.health = Health{}
		r.setState(e, StateRunning, "")
		r.record(e, "running", "started in "+res.elapsed.Round(time.Millisecond).String())
		r.log.Debug("zone running", "zone", e.name, "took", res.elapsed)
	case res.kind == opStart:
		// Something of the zone may exist now: clean it up before trying again.
		e.exists, e.running, e.cleanup = true, false, true
		e.runHash = res.spec.Hash
		e.addrs = res.spec.Config.UnderlayAddrs()
		if e.want == nil || e.want.Hash != res.spec.Hash {
			// Abandoned because the config changed; not a failure of the zone.
			r.record(e, "start abandoned", "config changed")
			return
		}
		r.fail(e, now, res.err, "start failed")
	case res.err == nil: // stop
		e.exists, e.running, e.cleanup = false, false, false
		e.runHash, e.addrs = "", nil
		e.lastErr, e.nextTry, e.attempts = "", time.Time{}, 0
		e.health = Health{}
		r.record(e, "stopped", "in "+res.elapsed.Round(time.Millisecond).String())
		// Zones waiting for this one may go now.
		for name := range l.pending {
			l.dirty[name] = struct{}{}
		}
	default: // stop failed
		r.fail(e, now, res.err, "stop failed")
	}
}

// fail records a failed attempt and schedules the next one.
func (r *Reconciler) fail(e *entry, now time.Time, err error, what string) {
	e.attempts++
	n := e.attempts
	if errors.Is(err, zone.ErrGone) {
		// The zone was deleted behind our back: nothing to wait out, clean up
		// and create it again, backing off only if it keeps happening.
		n--
	}
	e.nextTry = now.Add(r.opts.Backoff.Delay(n))
	e.lastErr = err.Error()
	r.loop.waiting[e.name] = struct{}{}
	r.setState(e, StateFailed, err.Error())
	r.record(e, what, fmt.Sprintf("%v (attempt %d; next try in %s)", err, e.attempts, e.nextTry.Sub(now)))
	r.log.Warn("zone "+what, "zone", e.name, "err", err, "attempt", e.attempts, "retry_in", e.nextTry.Sub(now))
}

// hold keeps e from starting because a gate (gates.go) is not ready. The
// zone is waiting, with the gate's reason (err in upstream's inventory), and
// is looked at again at once when the gate says something changed, else on
// the normal backoff of its own count: a held zone has not failed, so its
// attempts and the backoff of its start failures are not consumed by
// waiting, and its last error stays what it was.
func (r *Reconciler) hold(e *entry, now time.Time, gate string, err error) {
	e.heldBy = gate
	e.held++
	e.nextTry = now.Add(r.opts.Backoff.Delay(e.held))
	r.loop.waiting[e.name] = struct{}{}
	msg := err.Error()
	if msg == e.waitFor && e.state == StateWaiting {
		// Said already; only when it is looked at again changed.
		r.loop.lastStale = true
		r.store.setNextRetry(e.name, e.nextTry)
		return
	}
	e.waitFor = msg
	r.setState(e, StateWaiting, "")
	r.record(e, "start held back", msg)
	r.log.Info("zone start held back", "zone", e.name, "gate", gate, "reason", msg)
}

// forget drops a zone that is neither wanted nor present.
func (r *Reconciler) forget(e *entry) {
	l := &r.loop
	r.setState(e, "", "")
	r.syncPresent(e)
	delete(l.zones, e.name)
	delete(l.waiting, e.name)
	delete(l.pending, e.name)
	delete(l.leaving, e.name)
	r.store.deleteZone(e.name, time.Now(), r.opts.RemovedLen, r.opts.HistoryLen)
}

// touch marks e for evaluation on the next step and keeps the set of leaving
// zones up to date. Every change to what e wants or what exists of it ends
// with touch.
func (r *Reconciler) touch(e *entry) {
	l := &r.loop
	l.dirty[e.name] = struct{}{}
	if e.exists && (e.want == nil || e.runHash != e.want.Hash) {
		l.leaving[e.name] = e
	} else {
		delete(l.leaving, e.name)
	}
	r.syncPresent(e)
}

// syncPresent keeps the published present specs (PresentSpecs) up to date
// for e: a wanted zone is present from the moment its start is dispatched or
// it is found (adopted, waited for, half-made) until it is torn down or no
// longer wanted.
func (r *Reconciler) syncPresent(e *entry) {
	var want *zone.Spec
	if e.want != nil && e.state != "" && (e.exists || e.busy && e.op == opStart) {
		want = e.want
	}
	r.store.mu.Lock()
	cur, ok := r.store.present[e.name]
	changed := cur != want && (want != nil || ok)
	if changed {
		if want == nil {
			delete(r.store.present, e.name)
		} else {
			r.store.present[e.name] = want
		}
	}
	r.store.mu.Unlock()
	if changed && r.opts.OnPresentChange != nil {
		r.opts.OnPresentChange()
	}
}

// startList lists the runtime in the background, unless a listing is already
// in flight.
func (r *Reconciler) startList(ctx context.Context) {
	l := &r.loop
	if l.listing {
		// What prompted this may have happened after the listing in flight
		// looked: list again when it is done.
		l.listAgain = true
		return
	}
	l.listing, l.listAgain = true, false
	seq := l.seq
	r.ops.Add(1)
	go func() {
		defer r.ops.Done()
		lctx, cancel := context.WithTimeout(ctx, r.opts.ListTimeout)
		defer cancel()
		obs, err := r.rt.List(lctx)
		obs = serviceZones(obs)
		select {
		case r.listed <- listResult{observed: obs, err: err, seq: seq}:
		case <-r.done:
		}
	}()
}

// serviceZones drops the VMM zones from a listing: they are the VMM
// manager's.
func serviceZones(obs []zone.Observed) []zone.Observed {
	return slices.DeleteFunc(obs, func(o zone.Observed) bool { return zone.IsVMM(o.Name) })
}

// handleList compares a listing of the runtime with what the loop believes,
// and repairs the difference: zones that died or vanished are noted and
// started again, zones nobody wants are removed, zones found running with the
// wanted config are taken as running.
func (r *Reconciler) handleList(ctx context.Context, lr listResult) {
	l := &r.loop
	l.listing = false
	if l.listAgain {
		r.startList(ctx)
	}
	if lr.err != nil {
		r.opts.Metrics.relists.WithLabelValues("error").Inc()
		r.log.Warn("listing zones failed; will retry", "err", lr.err)
		return
	}
	r.opts.Metrics.relists.WithLabelValues("ok").Inc()
	now := time.Now()
	seen := make(map[string]*zone.Observed, len(lr.observed))
	for i := range lr.observed {
		o := &lr.observed[i]
		seen[o.Name] = o
		if _, ok := l.zones[o.Name]; !ok {
			r.adoptNew(o)
		}
	}
	for name, e := range l.zones {
		if e.busy || e.changed > lr.seq {
			continue // the listing predates what we know
		}
		o, ok := seen[name]
		switch {
		case !ok && e.exists:
			if e.running && e.want != nil {
				r.incident(e, now, "vanished", "no longer exists in the runtime")
			}
			// Whatever is left of a wanted zone (links, processes) goes
			// before it is created again.
			e.exists, e.running, e.runHash, e.addrs, e.cleanup = false, false, "", nil, e.want != nil
			r.touch(e)
		case !ok:
		case e.running && !o.Running:
			r.incident(e, now, "died", o.Detail)
			e.running, e.cleanup = false, true
			r.touch(e)
		case o.Hash != e.runHash || !e.exists:
			e.exists, e.runHash, e.running = true, o.Hash, o.Running
			e.cleanup = !o.Running
			r.touch(e)
		case !e.running && o.Running && e.want != nil && o.Hash == e.want.Hash:
			// A start that timed out came up after all.
			e.running, e.cleanup, e.nextTry = true, false, time.Time{}
			delete(l.waiting, name)
			r.record(e, "found running", "")
			r.touch(e)
		case e.running && e.attempts > 0 && now.Sub(e.runningSince) >= r.opts.StablePeriod:
			e.attempts = 0
		}
	}
}

// adoptNew records a zone found in the runtime that the loop did not know.
func (r *Reconciler) adoptNew(o *zone.Observed) {
	l := &r.loop
	l.seq++
	e := &entry{name: o.Name, id: o.ID, exists: true, running: o.Running, runHash: o.Hash, cleanup: !o.Running, changed: l.seq}
	if spec, ok := l.wanted[o.Name]; ok {
		e.want, e.kind = spec, spec.Config.ZoneType.Type
		e.addrs = spec.Config.UnderlayAddrs()
	}
	l.zones[o.Name] = e
	if e.want != nil && o.Running && o.Hash == e.want.Hash {
		e.runningSince = time.Now()
		r.setState(e, StateRunning, "")
		r.record(e, "adopted", "found running with the wanted config; left running")
	} else {
		r.setState(e, StateUnmanaged, "")
		r.record(e, "found", "exists in the runtime; not yet reconciled")
	}
	r.touch(e)
}

// incident records a running zone that died, vanished or turned unhealthy.
// It begins a pass: there is a zone to repair, and the last reconciliation
// must say so from now on, even while the zone waits out its backoff.
func (r *Reconciler) incident(e *entry, now time.Time, what, detail string) {
	r.beginPass()
	e.incidents++
	r.opts.Metrics.incidents.Inc()
	// A zone that ran stably starts again at once; one that keeps dying backs off.
	if e.attempts > 0 {
		e.nextTry = now.Add(r.opts.Backoff.Delay(e.attempts))
	}
	e.attempts++
	r.setState(e, StateFailed, "zone "+what+": "+detail)
	r.record(e, what, detail)
	r.log.Warn("zone "+what, "zone", e.name, "detail", detail)
}
