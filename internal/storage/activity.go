package storage

import (
	"fmt"
	"time"
)

// A call in flight, in status. A disk whose backend call has taken longer
// than slowCall is err with what the call does, for how long and its
// deadline ("opening pool oxp_… for 12s (deadline 1m0s)"), as a zone being
// started is; its datasets wait for it ("waiting for disk <id>: …"), and its
// pool is not ready for a zone about to start. Until the call ends the status
// is published again every activityRefresh, so what it says of the call is
// never more than a second old, and a reader may still cache what it derives
// by Status.Version. When the call ends, the disk's result is its pass's. A
// call that ends within slowCall changes nothing but the disk's Activity: a
// pass of quick calls does not make its disk flap.
//
// The loop learns that a call has become slow from the worker (a timer armed
// for each call signals Reconciler.slow), and otherwise only wakes while the
// published status shows a slow call: nothing polls.

const (
	slowCall        = time.Second
	activityRefresh = time.Second
	// activityMinGap bounds how often calls becoming slow publish the
	// status: with many disks, their calls turning slow one after another
	// cost one publish per gap, not one each.
	activityMinGap = 100 * time.Millisecond
)

// activity is a backend call in flight.
type activity struct {
	what    string
	since   time.Time
	timeout time.Duration
}

func (a *activity) String() string { return a.at(time.Now()) }

// at describes the call as of now.
func (a *activity) at(now time.Time) string {
	return fmt.Sprintf("%s for %s (deadline %s)", a.what, now.Sub(a.since).Round(time.Second), a.timeout)
}

// activityState is the loop's record of the calls in flight it published.
type activityState struct {
	// publishedAt is when the status was last published.
	publishedAt time.Time
	// shown: the status published then shows a slow call, to be refreshed.
	shown bool
	// due: a worker said a call became slow since.
	due bool
}

// callSlow is a worker's word that its call has just become slow. It never
// blocks.
func (r *Reconciler) callSlow() {
	select {
	case r.slow <- struct{}{}:
	default:
	}
}

// slowActivity returns e's call in flight if it has taken slowCall or more
// at now.
func slowActivity(e *entry, now time.Time) (*activity, bool) {
	if !e.busy {
		return nil, false
	}
	a := e.worker.act.Load()
	if a == nil || now.Sub(a.since) < slowCall {
		return nil, false
	}
	return a, true
}

// refreshActivity publishes the status if what it says of the calls in
// flight is out of date at now.
func (r *Reconciler) refreshActivity(now time.Time) {
	if d, ok := r.loop.act.nextIn(now); ok && d == 0 {
		r.publish()
	}
}

// nextIn says how long until the published calls in flight are out of date.
func (s *activityState) nextIn(now time.Time) (time.Duration, bool) {
	var at time.Time
	switch {
	case s.due:
		at = s.publishedAt.Add(activityMinGap)
	case s.shown:
		at = s.publishedAt.Add(activityRefresh)
	default:
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// nextWakeIn says how long until the loop has work of its own: the earliest
// retry, a refresh of the calls in flight, or a publish of what changed
// only in its times.
func (r *Reconciler) nextWakeIn(now time.Time) (time.Duration, bool) {
	d, ok := r.loop.nextRetryIn(now)
	if a, aok := r.loop.act.nextIn(now); aok && (!ok || a < d) {
		d, ok = a, true
	}
	if f, fok := r.loop.nextFlushIn(now); fok && (!ok || f < d) {
		d, ok = f, true
	}
	return d, ok
}
