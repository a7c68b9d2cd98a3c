package reconciler

import (
	"slices"
	"time"
)

// A pass begins when there is work (a new config, a zone to repair or retry)
// and completes when no runtime call is in flight. Its result per zone is what
// inventory reports as the last reconciliation.

func (r *Reconciler) beginPass() {
	l := &r.loop
	if l.passActive {
		// A newer config joins the pass in progress.
		r.publishStatus()
		return
	}
	l.passActive = true
	l.passStart = time.Now()
	r.publishStatus()
}

func (r *Reconciler) finishPass(now time.Time) {
	l := &r.loop
	l.passActive = false
	l.passes++
	l.lastRanFor = now.Sub(l.passStart)
	l.lastDone = now
	rec := &Reconciliation{Config: l.config, CompletedAt: now, Zones: make(map[string]Result, len(l.zones))}
	for _, e := range l.zones {
		switch {
		case e.want != nil && e.running && e.runHash == e.want.Hash:
			rec.Zones[e.id] = Result{OK: true}
		case e.want != nil:
			rec.Zones[e.id] = Result{Message: e.problem()}
		case e.exists:
			// Not wanted and still there: shutting it down failed.
			if _, wanted := rec.Zones[e.id]; !wanted {
				rec.Zones[e.id] = Result{Message: e.problem()}
			}
		}
	}
	l.last = rec
	r.opts.Metrics.passes.Inc()
	r.opts.Metrics.passSecs.Observe(l.lastRanFor.Seconds())
	r.publishStatus()
}

// problem says why a zone is not as wanted.
func (e *entry) problem() string {
	switch {
	case e.lastErr != "":
		return e.lastErr
	case e.state == StatePending:
		return "waiting for a zone it replaces to shut down"
	default:
		return "zone is " + string(e.state)
	}
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
	r.publishZone(e)
}

func (r *Reconciler) publishZone(e *entry) {
	if e.state == "" {
		return
	}
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
		History:   slices.Clone(e.history),
	}
	if e.want != nil {
		zs.ConfigHash = e.want.Hash
	} else {
		zs.ConfigHash = e.runHash
	}
	if !e.nextTry.IsZero() && e.state == StateFailed {
		t := e.nextTry
		zs.NextRetry = &t
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
