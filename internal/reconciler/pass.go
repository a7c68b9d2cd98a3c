package reconciler

import (
	"fmt"
	"slices"
	"time"
)

// Passes and the last reconciliation.
//
// A pass begins when there is work (a new config, a zone to start, repair,
// retry or stop) and completes when no runtime call is in flight: Status's
// Phase is running meanwhile, idle after.
//
// The last reconciliation is not held back until a pass completes: a start
// that hangs would then freeze it, showing an older config, for up to the
// start deadline. It is the result, per zone, of the newest config as of the
// last moment every zone that is not busy with a runtime call had settled:
// zones settled as wanted are ok, the others err with why; zones busy with a
// call are err with what the call is doing and for how long ("starting for
// 14s (deadline 2m0s): waiting for tcp [fd00::5]:32345: connection
// refused"). It is rebuilt whenever a zone's state changes (at most every
// lastMinGap while zones keep changing, so a thousand zones starting do not
// rebuild it a thousand times) and every lastRefresh while a call is in
// flight, so that what it says of a call in flight is never more than a
// second old.

const (
	lastMinGap  = 100 * time.Millisecond
	lastRefresh = time.Second
)

func (r *Reconciler) beginPass() {
	l := &r.loop
	l.lastStale = true
	if l.passActive {
		// A newer config joins the pass in progress.
		r.publishStatus()
		return
	}
	l.passActive = true
	l.passStart = time.Now()
	r.publishStatus()
}

// settle runs after every step: it completes the pass when nothing is in
// flight, and rebuilds the last reconciliation when it is out of date.
func (r *Reconciler) settle(now time.Time) {
	l := &r.loop
	if l.passActive && l.inflight == 0 {
		l.passActive = false
		l.passes++
		l.lastRanFor = now.Sub(l.passStart)
		l.lastDone = now
		r.opts.Metrics.passes.Inc()
		r.opts.Metrics.passSecs.Observe(l.lastRanFor.Seconds())
		r.buildLast(now) // at once: the pass's own result
		return
	}
	if !l.haveConfig {
		return
	}
	since := now.Sub(l.lastBuilt)
	if (l.lastStale && since >= lastMinGap) || (l.inflight > 0 && since >= lastRefresh) {
		r.buildLast(now)
	}
}

// nextSettleIn says when settle must run again on its own: when the last
// reconciliation is out of date but was rebuilt too recently, or when a call
// in flight needs its description refreshed.
func (l *loopState) nextSettleIn(now time.Time) (time.Duration, bool) {
	if !l.haveConfig {
		return 0, false
	}
	switch {
	case l.lastStale:
		return max(l.lastBuilt.Add(lastMinGap).Sub(now), 0), true
	case l.inflight > 0:
		return max(l.lastBuilt.Add(lastRefresh).Sub(now), 0), true
	}
	return 0, false
}

// buildLast rebuilds the last reconciliation from every zone's state now,
// and publishes it, with the status and the busy zones' descriptions.
func (r *Reconciler) buildLast(now time.Time) {
	l := &r.loop
	l.lastStale = false
	l.lastBuilt = now
	rec := &Reconciliation{Config: l.config, CompletedAt: now, Zones: make(map[string]Result, len(l.zones))}
	for _, e := range l.zones {
		switch {
		case e.want != nil && !e.busy && e.running && e.runHash == e.want.Hash:
			rec.Zones[e.id] = Result{OK: true}
		case e.want != nil:
			rec.Zones[e.id] = Result{Message: e.problem(now)}
		case e.exists || e.busy:
			// Not wanted and still there: being shut down, or shutting it
			// down failed. A wanted zone of the same id says more.
			if _, wanted := rec.Zones[e.id]; !wanted {
				rec.Zones[e.id] = Result{Message: e.problem(now)}
			}
		}
		if e.busy {
			r.publishZone(e) // its activity, as of now
		}
	}
	l.last = rec
	r.publishStatus()
}

// problem says why a zone is not as wanted, now.
func (e *entry) problem(now time.Time) string {
	switch {
	case e.busy:
		return e.activity(now)
	case e.state == StatePending:
		return "waiting for a zone it replaces to shut down"
	case e.state == StateWaiting && !e.nextTry.IsZero():
		return fmt.Sprintf("%s (looked at again when it changes, or at %s)", e.waitFor, e.nextTry.UTC().Format(time.RFC3339))
	case e.state == StateWaiting:
		return e.waitFor
	case e.state == StateFailed && e.lastErr != "" && !e.nextTry.IsZero():
		// The time, not how long until it: nothing rebuilds this while
		// the zone waits.
		return fmt.Sprintf("%s (attempt %d; next try at %s)", e.lastErr, e.attempts, e.nextTry.UTC().Format(time.RFC3339))
	case e.lastErr != "":
		return e.lastErr
	case e.want != nil && e.running && e.runHash != e.want.Hash:
		return "running an older config; to be restarted with the new one"
	default:
		return "zone is " + string(e.state)
	}
}

// activity describes the runtime call in flight for e, and what the runtime
// last said it waits for.
func (e *entry) activity(now time.Time) string {
	if !e.busy {
		return ""
	}
	verb := "stopping"
	switch {
	case e.op == opStart && e.opCleanup:
		verb = "cleaning up and starting"
	case e.op == opStart:
		verb = "starting"
	case e.want != nil:
		verb = "stopping to apply a changed config"
	}
	s := fmt.Sprintf("%s for %s (deadline %s)", verb, now.Sub(e.opStart).Round(time.Second), e.opTimeout)
	if p := e.progress.Load(); p != nil && *p != "" {
		s += ": " + *p
	}
	if e.lastErr != "" {
		s += "; after: " + e.lastErr
	}
	return s
}

func (r *Reconciler) publishStatus() {
	l := &r.loop
	st := Status{Passes: l.passes, Last: l.last, CompletedAt: l.lastDone, RanFor: l.lastRanFor}
	switch {
	case l.passActive:
		st.Phase = PhaseRunning
		st.Config = l.config
		st.StartedAt = l.passStart
	case l.passes > 0:
		st.Phase = PhaseIdle
	default:
		st.Phase = PhaseNotYetRun
	}
	r.store.setStatus(st)
}

// setState moves e to state s ("" when it is forgotten) and publishes it.
func (r *Reconciler) setState(e *entry, s State, lastErr string) {
	l := &r.loop
	if was, is := e.state == StateRunning, s == StateRunning; was != is {
		r.publishRunning(e, is)
	}
	if e.state != s {
		if e.state != "" {
			l.counts[e.state]--
			r.opts.Metrics.zones.WithLabelValues(string(e.state)).Set(float64(l.counts[e.state]))
		}
		if s != "" {
			l.counts[s]++
			r.opts.Metrics.zones.WithLabelValues(string(s)).Set(float64(l.counts[s]))
		}
		e.state = s
		e.since = time.Now()
	}
	if lastErr != "" {
		e.lastErr = lastErr
	}
	l.lastStale = true
	if s != "" {
		r.publishZone(e)
	}
}

// publishRunning adds e to the running specs, or takes it out, and says so.
func (r *Reconciler) publishRunning(e *entry, running bool) {
	r.store.mu.Lock()
	// A zone counts as running the spec it was started with; one whose
	// wanted config changed meanwhile is about to be restarted.
	if running && e.want != nil && e.want.Hash == e.runHash {
		r.store.running[e.name] = e.want
	} else {
		delete(r.store.running, e.name)
	}
	r.store.mu.Unlock()
	if r.opts.OnRunningChange != nil {
		r.opts.OnRunningChange()
	}
}

// record appends an event to e's history and publishes it.
func (r *Reconciler) record(e *entry, event, detail string) {
	if len(e.history) >= r.opts.HistoryLen {
		e.history = slices.Delete(e.history, 0, len(e.history)-r.opts.HistoryLen+1)
	}
	e.history = append(e.history, Event{At: time.Now(), Event: event, Detail: detail})
	r.loop.lastStale = true
	r.publishZone(e)
}

func (r *Reconciler) publishZone(e *entry) {
	if e.state == "" {
		return
	}
	if !e.priorTaken {
		e.priorTaken = true
		if h := r.store.takePrior(e.name); len(h) > 0 {
			e.history = append(h, e.history...)
			if n := len(e.history) - r.opts.HistoryLen; n > 0 {
				e.history = slices.Delete(e.history, 0, n)
			}
		}
	}
	now := time.Now()
	zs := ZoneStatus{
		Name:      e.name,
		ID:        e.id,
		Kind:      e.kind,
		Wanted:    e.want != nil,
		State:     e.state,
		Since:     e.since,
		Attempts:  e.attempts,
		LastError: e.lastErr,
		Incidents: e.incidents,
		Activity:  e.activity(now),
		Health:    e.health,
		Exists:    e.exists || e.busy && e.op == opStart,
		History:   slices.Clone(e.history),
	}
	if zs.Health.State == "" {
		zs.Health.State = HealthUnknown
	}
	if e.busy {
		if p := e.progress.Load(); p != nil {
			zs.Progress = *p
		}
	}
	if e.want != nil {
		zs.ConfigHash = e.want.Hash
	} else {
		zs.ConfigHash = e.runHash
	}
	if !e.nextTry.IsZero() && (e.state == StateFailed || e.state == StateWaiting) {
		t := e.nextTry
		zs.NextRetry = &t
	}
	if e.state == StateWaiting {
		zs.WaitingFor = e.waitFor
	}
	r.store.setZone(zs)
}

// short abbreviates a config hash for people.
func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
