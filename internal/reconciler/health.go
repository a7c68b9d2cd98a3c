package reconciler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/zone"
)

// Health checks after start. A zone's service can be alive and not answer
// (stopped by a signal, deadlocked, its address gone); the relist sees only
// that its parts exist and its supervisor says it is up. So every
// HealthPeriod the loop health-checks every zone that runs as wanted, as a
// liveness probe would: a zone whose checks fail HealthFailures times in a
// row is an incident ("unhealthy: …"), reported at once and repaired through
// the normal path (cleaned up and started again, on the normal backoff).
//
// The checks of one round run outside the loop, healthChecks at once, each
// under HealthTimeout; each result comes back on its own, so one hung check
// delays no other zone's. A round starts only when the last one is done.

// healthChecks bounds how many health checks run at once.
const healthChecks = 16

type healthResult struct {
	name string
	seq  uint64 // loopState.seq when the round began
	at   time.Time
	err  error
	// roundDone: the round is over (no zone in this message).
	roundDone bool
}

// startHealthRound health-checks every zone that runs as wanted and is not
// busy, unless a round is still in flight.
func (r *Reconciler) startHealthRound(ctx context.Context) {
	l := &r.loop
	hc, ok := r.rt.(HealthChecker)
	if !ok || l.healthRound || !l.haveConfig {
		return
	}
	var specs []zone.Spec
	for _, e := range l.zones {
		if !e.busy && e.running && e.want != nil && e.runHash == e.want.Hash {
			specs = append(specs, *e.want)
		}
	}
	if len(specs) == 0 {
		return
	}
	l.healthRound = true
	seq := l.seq
	send := func(hr healthResult) bool {
		select {
		case r.health <- hr:
			return true
		case <-r.done:
			return false
		}
	}
	r.ops.Add(1)
	go func() {
		defer r.ops.Done()
		sem := make(chan struct{}, healthChecks)
		var wg sync.WaitGroup
		for _, spec := range specs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wg.Go(func() {
				defer func() { <-sem }()
				hctx, cancel := context.WithTimeout(ctx, r.opts.HealthTimeout)
				err := hc.Healthy(hctx, spec)
				cancel()
				if ctx.Err() == nil {
					send(healthResult{name: spec.Name, seq: seq, at: time.Now(), err: err})
				}
			})
		}
		wg.Wait()
		send(healthResult{roundDone: true})
	}()
}

// handleHealth applies one health check's result.
func (r *Reconciler) handleHealth(hr healthResult) {
	l := &r.loop
	if hr.roundDone {
		l.healthRound = false
		return
	}
	e, ok := l.zones[hr.name]
	if !ok || e.busy || !e.running || e.changed > hr.seq {
		return // the zone changed since the check began: it says nothing
	}
	at := hr.at
	e.health.LastCheck = &at
	if hr.err == nil {
		if e.health.State == HealthFailing {
			r.record(e, "healthy again", fmt.Sprintf("after %d failed health checks", e.health.Failures))
		}
		e.health.State, e.health.Failures, e.health.LastError = HealthOK, 0, ""
		r.publishZone(e)
		return
	}
	e.health.State = HealthFailing
	e.health.Failures++
	e.health.LastError = hr.err.Error()
	if e.health.Failures < r.opts.HealthFailures {
		if e.health.Failures == 1 {
			r.record(e, "health check failed", hr.err.Error())
		}
		r.publishZone(e)
		return
	}
	l.seq++
	e.changed = l.seq
	r.incident(e, time.Now(), "unhealthy", fmt.Sprintf("%d health checks in a row failed, the last: %v", e.health.Failures, hr.err))
	e.running, e.cleanup = false, true
	r.touch(e)
}
