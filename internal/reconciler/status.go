package reconciler

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// State is where one zone stands.
type State string

const (
	// StatePending: wanted, waiting for a zone it replaces to be shut down.
	StatePending State = "pending"
	// StateStarting: being created and started.
	StateStarting State = "starting"
	// StateRunning: up, with the wanted config.
	StateRunning State = "running"
	// StateStopping: being shut down (removed from the config, or restarting
	// with a changed config).
	StateStopping State = "stopping"
	// StateFailed: the last attempt failed; the next one is at NextRetry.
	StateFailed State = "failed"
	// StateWaiting: its start is held back by a gate (gates.go): its
	// storage is not ready, or time is not yet synchronized. WaitingFor
	// says why. It is looked at again as soon as the gate says something
	// changed, else at NextRetry. Waiting is not failing: it counts no
	// failed attempt.
	StateWaiting State = "waiting"
	// StateUnmanaged: exists but there is no valid config yet to judge it
	// against; left alone.
	StateUnmanaged State = "unmanaged"
)

// Event is one line of a zone's history.
type Event struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
}

// ZoneStatus is one zone as the reconciler sees it.
type ZoneStatus struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Wanted is false for a zone that is being removed.
	Wanted bool  `json:"wanted"`
	State  State `json:"state"`
	// Since is when the zone entered State.
	Since time.Time `json:"since"`
	// ConfigHash identifies the config the zone runs (or is being started with).
	ConfigHash string `json:"config_hash,omitempty"`
	// Attempts counts consecutive failed attempts (starts, stops, and deaths of a
	// zone that had not yet been running stably).
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
	// WaitingFor is why a waiting zone (StateWaiting) does not start yet,
	// as its gate says ("storage not ready: …", "time not yet
	// synchronized: …"); "" in any other state.
	WaitingFor string `json:"waiting_for,omitempty"`
	// NextRetry is when a failed zone is tried again, or a waiting one
	// looked at again.
	NextRetry *time.Time `json:"next_retry,omitempty"`
	// Incidents counts how often the zone died, vanished or turned unhealthy
	// while running.
	Incidents int `json:"incidents"`
	// Activity describes the runtime call in flight, if any: what, for how
	// long, its deadline, and what the runtime last said it waits for.
	Activity string `json:"activity,omitempty"`
	// Progress is what the runtime last said the call in flight waits for.
	Progress string `json:"progress,omitempty"`
	// Health is what the periodic health checks of the running zone found.
	Health Health `json:"health"`
	// Exists says that something of the zone exists in the runtime: it is
	// being created, runs, was adopted, or a failed start left part of it.
	Exists bool `json:"exists"`
	// RemovedAt is when a zone removed from the config was torn down and
	// forgotten (Removed); nil for the zones the reconciler knows.
	RemovedAt *time.Time `json:"removed_at,omitempty"`
	History   []Event    `json:"history"`
}

// HealthState is the outcome of a running zone's health checks.
type HealthState string

const (
	// HealthUnknown: not checked since the zone last started running.
	HealthUnknown HealthState = "unknown"
	// HealthOK: the last check passed.
	HealthOK HealthState = "ok"
	// HealthFailing: the last check failed; Failures say how many in a row.
	HealthFailing HealthState = "failing"
)

// Health is what the periodic health checks of a running zone found.
type Health struct {
	State HealthState `json:"state"`
	// Failures counts consecutive failed checks; the zone is repaired when
	// it reaches Options.HealthFailures.
	Failures  int        `json:"consecutive_failures"`
	LastCheck *time.Time `json:"last_check,omitempty"`
	LastError string     `json:"last_error,omitempty"`
}

// Phase is the reconciler's overall state, as upstream reports it.
type Phase string

const (
	PhaseNotYetRun Phase = "not_yet_run"
	PhaseRunning   Phase = "running"
	PhaseIdle      Phase = "idle"
)

// Result is the outcome for one zone of the last completed pass.
type Result struct {
	OK      bool
	Message string
}

// Reconciliation is the outcome of the last completed pass.
type Reconciliation struct {
	Config      *sledconfig.Config
	CompletedAt time.Time
	// Zones maps zone id to result. Zones that were shut down successfully are
	// absent.
	Zones map[string]Result
}

// Status is a snapshot of the reconciler for readers.
type Status struct {
	Phase Phase
	// Config is the config being realised (Phase running).
	Config    *sledconfig.Config
	StartedAt time.Time
	// CompletedAt and RanFor describe the last completed pass (Phase idle).
	CompletedAt time.Time
	RanFor      time.Duration
	Last        *Reconciliation
	// Passes counts completed passes since start.
	Passes uint64
}

// store holds what the loop publishes for readers. The loop writes to it with
// short critical sections; readers copy out. Nothing blocking ever happens
// under mu.
type store struct {
	mu     sync.Mutex
	status Status                // guarded by mu
	zones  map[string]ZoneStatus // guarded by mu; keyed by zone name
	// restore is what the restore protocol found and did; guarded by mu.
	restore RestoreStatus
	// running holds the spec of every running zone, by name; guarded by mu.
	running map[string]*zone.Spec
	// present holds the wanted spec of every zone that is present (see
	// PresentSpecs), by name; guarded by mu.
	present map[string]*zone.Spec
	// removed are the last statuses of the zones removed, oldest first,
	// bounded (history.go); prior the histories the history file held of
	// zones not published since the start, by name. Guarded by mu.
	removed []ZoneStatus
	prior   map[string][]Event
}

func (s *store) setZone(zs ZoneStatus) {
	s.mu.Lock()
	s.zones[zs.Name] = zs
	s.mu.Unlock()
}

// setNextRetry changes when a published zone is looked at again, and
// nothing else of it: cheaper than publishing it again.
func (s *store) setNextRetry(name string, t time.Time) {
	s.mu.Lock()
	if zs, ok := s.zones[name]; ok {
		zs.NextRetry = &t
		s.zones[name] = zs
	}
	s.mu.Unlock()
}

// deleteZone forgets a zone, keeping its last status among the removed
// (at most most of them) with a last event that says so.
func (s *store) deleteZone(name string, now time.Time, most int, historyLen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	zs, ok := s.zones[name]
	delete(s.zones, name)
	if !ok {
		return
	}
	zs.RemovedAt = &now
	zs.Activity, zs.Progress, zs.NextRetry = "", "", nil
	zs.History = append(slices.Clone(zs.History), Event{At: now, Event: "removed", Detail: "no longer in the config; torn down"})
	if n := len(zs.History) - historyLen; n > 0 {
		zs.History = zs.History[n:]
	}
	s.addRemoved(zs, most)
}

func (s *store) setStatus(st Status) {
	s.mu.Lock()
	s.status = st
	s.mu.Unlock()
}

// Status returns the reconciler's current status. It never waits for
// reconciliation.
func (r *Reconciler) Status() Status {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	return r.store.status
}

// Zones returns the status of every zone the reconciler knows, sorted by name.
func (r *Reconciler) Zones() []ZoneStatus {
	r.store.mu.Lock()
	out := slices.Collect(maps.Values(r.store.zones))
	r.store.mu.Unlock()
	slices.SortFunc(out, func(a, b ZoneStatus) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// ZonesWhere returns, sorted by name, the status of the zones for which keep
// is true. keep is called with the store locked: it must only look at the
// status. Cheaper than Zones when few match.
func (r *Reconciler) ZonesWhere(keep func(ZoneStatus) bool) []ZoneStatus {
	var out []ZoneStatus
	r.store.mu.Lock()
	for _, zs := range r.store.zones {
		if keep(zs) {
			out = append(out, zs)
		}
	}
	r.store.mu.Unlock()
	slices.SortFunc(out, func(a, b ZoneStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Zone returns the status of one zone, by name or id.
func (r *Reconciler) Zone(nameOrID string) (ZoneStatus, bool) {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	if zs, ok := r.store.zones[nameOrID]; ok {
		return zs, true
	}
	var found ZoneStatus
	ok := false
	for _, zs := range r.store.zones {
		// Prefer the wanted incarnation when a zone id is both being removed
		// under an old name and started under a new one.
		if zs.ID == nameOrID && (!ok || zs.Wanted) {
			found, ok = zs, true
		}
	}
	return found, ok
}

// RunningSpecs returns the specs of the zones that are running, sorted by
// name: what other reconcilers (NAT) derive their desired state from.
// Options.OnRunningChange says when it changes.
func (r *Reconciler) RunningSpecs() []zone.Spec { return r.specs(r.store.running) }

// RunningSpec returns the spec of the running zone named name, without
// copying the others.
func (r *Reconciler) RunningSpec(name string) (zone.Spec, bool) {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	if s, ok := r.store.running[name]; ok {
		return *s, true
	}
	return zone.Spec{}, false
}

// Unmanaged returns the sorted names of the zones that exist but that no
// config judges (no valid config was loaded: the ledger missing or
// corrupt). What they hold for the rack (NAT entries, routing prefixes)
// cannot be told from what no zone wants, so nothing is removed on their
// account while there are any: not knowing is not knowing a thing is
// unwanted.
func (r *Reconciler) Unmanaged() []string {
	r.store.mu.Lock()
	var out []string
	for name, zs := range r.store.zones {
		if zs.State == StateUnmanaged {
			out = append(out, name)
		}
	}
	r.store.mu.Unlock()
	slices.Sort(out)
	return out
}

// PresentSpecs returns, sorted by name, the wanted specs of the zones that
// are present: from the moment the agent starts creating one, or finds it
// existing (adopted, waited for, half-made), until it is torn down or no
// longer wanted. A zone that is present may not answer yet, or may be
// restarting after a death. What a zone holds for the rack while it lives,
// such as an internal DNS zone's routing prefix, derives from this rather
// than from RunningSpecs, so that a zone slow to answer after an agent
// restart does not lose it. Options.OnPresentChange says when it changes.
func (r *Reconciler) PresentSpecs() []zone.Spec { return r.specs(r.store.present) }

// specs copies out one of the store's spec maps, sorted by name.
func (r *Reconciler) specs(m map[string]*zone.Spec) []zone.Spec {
	r.store.mu.Lock()
	out := make([]zone.Spec, 0, len(m))
	for _, s := range m {
		out = append(out, *s)
	}
	r.store.mu.Unlock()
	slices.SortFunc(out, func(a, b zone.Spec) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RunningZones returns the sorted names of zones that are running.
func (r *Reconciler) RunningZones() []string {
	r.store.mu.Lock()
	var out []string
	for name, zs := range r.store.zones {
		if zs.State == StateRunning {
			out = append(out, name)
		}
	}
	r.store.mu.Unlock()
	slices.Sort(out)
	return out
}
