package reconciler

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/zone"
)

// The restore protocol. An agent that restarts finds its zones still running
// (they do not depend on it) and must not destroy them to rebuild its state.
// Before the loop acts on anything, Run:
//
//  1. lists what exists, retrying with a capped backoff until a listing
//     succeeds (nothing acts meanwhile);
//  2. records every zone found: running with the wanted config and answering
//     its health check → adopted as running, untouched; running with the
//     wanted config but not answering → Ensure, which waits for it and
//     restarts nothing; in the config but changed, dead or half-made →
//     the normal path (tear down what is broken, start again); not in the
//     config → the normal path removes it; no config at all (ledger missing
//     or corrupt) → left alone, unmanaged, until a config arrives;
//  3. once there is a config, asks the runtime (if it is a Sweeper) to remove
//     parts that belong to no zone: links, processes, directories;
//  4. closes Restored, so that other reconcilers seed their desired state
//     from the zones adopted here before their first pass; then acts.

// Sweeper is a Runtime that can find leftovers: parts that carry this agent's
// marks but belong to no zone List reports (a link or a process whose zone
// root is gone, a zone root without a valid mark). The reconciler calls Sweep
// once, after restoring its state and only when it has a config, while no
// other runtime call is in flight.
type Sweeper interface {
	// Sweep removes the leftovers and describes each, for people.
	Sweep(ctx context.Context) ([]string, error)
}

// HealthChecker is a Runtime that can tell whether a zone it lists as
// running answers its health check. The restore protocol adopts as running
// only zones that do; the others (a service still starting when the last
// agent died, or hung) go through Ensure, which waits for them without
// tearing anything down, and the normal path takes it from there.
type HealthChecker interface {
	Healthy(ctx context.Context, spec zone.Spec) error
}

// restoreHealthChecks bounds how many health checks the restore protocol
// runs at once.
const restoreHealthChecks = 16

// RestoreStatus says what the reconciler found when it started and what it
// did about it.
type RestoreStatus struct {
	// Done: the first listing succeeded and the reconciler acts. Until then it
	// does nothing at all.
	Done       bool      `json:"done"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// ListAttempts counts listings tried; LastError is why the last failed.
	ListAttempts int    `json:"list_attempts"`
	LastError    string `json:"last_error,omitempty"`
	// HadConfig: a ledgered config existed when the listing came back.
	HadConfig bool `json:"had_config"`
	// Found counts the zones that existed. Of them, Adopted ran with the
	// wanted config, answered their health check and were left running;
	// Waited ran with the wanted config but did not answer yet, and go
	// through Ensure, which waits for them and restarts nothing; Repair were
	// wanted but changed or half-made, and go through the normal path
	// (teardown, start); Remove were not in the config; Unmanaged were found
	// while there was no config, and are left alone until one arrives.
	Found     int `json:"found"`
	Adopted   int `json:"adopted"`
	Waited    int `json:"waited"`
	Repair    int `json:"repair"`
	Remove    int `json:"remove"`
	Unmanaged int `json:"unmanaged"`
	// Swept: leftovers were looked for (it waits for a config); Leftovers
	// lists what was removed, SweepError why some could not be.
	Swept      bool     `json:"swept"`
	Leftovers  []string `json:"leftovers,omitempty"`
	SweepError string   `json:"sweep_error,omitempty"`
}

// Restore returns what the restore protocol found and did.
func (r *Reconciler) Restore() RestoreStatus {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	rs := r.store.restore
	rs.Leftovers = append([]string(nil), rs.Leftovers...)
	return rs
}

// Restored is closed once the reconciler has rebuilt its state from what
// exists, before it acts: from then on RunningZones includes every adopted
// zone.
func (r *Reconciler) Restored() <-chan struct{} { return r.restored }

func (r *Reconciler) setRestore(f func(*RestoreStatus)) {
	r.store.mu.Lock()
	f(&r.store.restore)
	r.store.mu.Unlock()
}

// restore runs steps 1 to 3. It returns ctx's error if ctx ends first.
func (r *Reconciler) restore(ctx context.Context) error {
	r.setRestore(func(s *RestoreStatus) { s.StartedAt = time.Now() })
	var obs []zone.Observed
	for attempt := 1; ; attempt++ {
		lctx, cancel := context.WithTimeout(ctx, r.opts.ListTimeout)
		var err error
		obs, err = r.rt.List(lctx)
		cancel()
		r.setRestore(func(s *RestoreStatus) {
			s.ListAttempts = attempt
			s.LastError = ""
			if err != nil {
				s.LastError = err.Error()
			}
		})
		if err == nil {
			obs = serviceZones(obs)
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		delay := r.opts.Backoff.Delay(attempt)
		r.log.Warn("listing zones to restore state failed; nothing acts until it succeeds", "err", err, "attempt", attempt, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}

	// The newest config: any Update before now is in latest.
	select {
	case <-r.update:
	default:
	}
	cfg := r.latest.Load()
	l := &r.loop
	if cfg != nil {
		l.wanted = wantedSpecs(cfg, nil)
	}
	var rs RestoreStatus
	sort.Slice(obs, func(i, j int) bool { return obs[i].Name < obs[j].Name })
	unhealthy := r.unhealthy(ctx, obs)
	for i := range obs {
		o := &obs[i]
		spec, wanted := l.wanted[o.Name]
		switch {
		case cfg == nil:
			rs.Unmanaged++
		case !wanted:
			rs.Remove++
		case !o.Running || o.Hash != spec.Hash:
			rs.Repair++
		case unhealthy[o.Name] != nil:
			rs.Waited++
			r.adoptUnhealthy(o, unhealthy[o.Name])
			continue
		default:
			rs.Adopted++
		}
		r.adoptNew(o)
	}
	r.setRestore(func(s *RestoreStatus) {
		s.HadConfig = cfg != nil
		s.Found, s.Adopted, s.Waited, s.Repair, s.Remove, s.Unmanaged = len(obs), rs.Adopted, rs.Waited, rs.Repair, rs.Remove, rs.Unmanaged
	})
	r.log.Info("restored state from the runtime", "found", len(obs), "adopted", rs.Adopted, "waited", rs.Waited, "repair", rs.Repair, "remove", rs.Remove, "unmanaged", rs.Unmanaged, "config", cfg != nil)
	if cfg != nil {
		r.setDesired(cfg)
		r.sweep(ctx)
	}
	r.setRestore(func(s *RestoreStatus) { s.Done, s.FinishedAt = true, time.Now() })
	close(r.restored)
	return nil
}

// unhealthy health-checks, at most restoreHealthChecks at once, every
// listed zone that runs with the wanted config, if the runtime can, and
// returns why each that failed did.
func (r *Reconciler) unhealthy(ctx context.Context, obs []zone.Observed) map[string]error {
	hc, ok := r.rt.(HealthChecker)
	if !ok {
		return nil
	}
	var mu sync.Mutex
	out := map[string]error{}
	sem := make(chan struct{}, restoreHealthChecks)
	var wg sync.WaitGroup
	for i := range obs {
		o := obs[i]
		spec, wanted := r.loop.wanted[o.Name]
		if !wanted || !o.Running || o.Hash != spec.Hash {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			hctx, cancel := context.WithTimeout(ctx, r.opts.ListTimeout)
			defer cancel()
			if err := hc.Healthy(hctx, *spec); err != nil {
				mu.Lock()
				out[o.Name] = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// adoptUnhealthy records a zone found running with the wanted config that
// did not answer its health check: it is neither torn down nor taken as
// running, but given to Ensure, which waits for it.
func (r *Reconciler) adoptUnhealthy(o *zone.Observed, err error) {
	l := &r.loop
	l.seq++
	spec := l.wanted[o.Name]
	e := &entry{name: o.Name, id: o.ID, kind: spec.Config.ZoneType.Type, want: spec, exists: true, runHash: o.Hash, addrs: spec.Config.UnderlayAddrs(), changed: l.seq}
	l.zones[o.Name] = e
	r.setState(e, StatePending, "")
	r.record(e, "found", "running with the wanted config but not answering its health check ("+err.Error()+"): waiting for it, without a restart")
	r.touch(e)
}

// sweep removes leftovers once, when there is a config. It runs in the loop
// goroutine before any runtime call is dispatched, under its own deadline.
func (r *Reconciler) sweep(ctx context.Context) {
	l := &r.loop
	if l.swept || !l.haveConfig {
		return
	}
	l.swept = true
	sw, ok := r.rt.(Sweeper)
	if !ok {
		r.setRestore(func(s *RestoreStatus) { s.Swept = true })
		return
	}
	sctx, cancel := context.WithTimeout(ctx, r.opts.StopTimeout)
	defer cancel()
	removed, err := sw.Sweep(sctx)
	for _, what := range removed {
		r.log.Warn("removed a leftover that belonged to no zone", "what", what)
	}
	if err != nil {
		r.log.Error("removing leftovers failed", "err", err)
	}
	r.setRestore(func(s *RestoreStatus) {
		s.Swept = true
		s.Leftovers = removed
		if err != nil {
			s.SweepError = fmt.Sprint(err)
		}
	})
}
