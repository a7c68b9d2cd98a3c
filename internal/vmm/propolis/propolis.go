// Package propolis is the service that plays propolis inside a VMM zone: a
// simulated guest that boots, runs, reboots and stops on request, the small
// HTTP API the agent drives it through, and the agent's client of that API.
package propolis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// State is a VMM's state, spelled as upstream's VmmState.
type State string

const (
	// StateStarting: the VMM exists and has not run guest CPUs yet; it
	// boots once asked to run.
	StateStarting State = "starting"
	// StateRunning: the guest runs.
	StateRunning State = "running"
	// StateStopping: the guest is shutting down.
	StateStopping State = "stopping"
	// StateStopped: the guest has stopped and will never run again.
	StateStopped State = "stopped"
	// StateRebooting: the guest is rebooting and will run again.
	StateRebooting State = "rebooting"
	// StateFailed: the VMM failed. The simulated guest never reaches it;
	// the agent reports it when a VMM's zone or service is lost.
	StateFailed State = "failed"
	// StateDestroyed: the VMM is gone and its resources are released. The
	// simulated guest never reaches it; the agent reports it.
	StateDestroyed State = "destroyed"
)

// Request is a state a VMM is asked to reach, as upstream's
// VmmStateRequested without migration.
type Request string

const (
	// RequestRunning asks a starting guest to boot; a guest that runs or
	// reboots already has it.
	RequestRunning Request = "running"
	// RequestStopped asks the guest to stop for good.
	RequestStopped Request = "stopped"
	// RequestReboot asks a running guest to reboot.
	RequestReboot Request = "reboot"
)

func (r Request) valid() bool {
	return r == RequestRunning || r == RequestStopped || r == RequestReboot
}

// Status is the guest's state as the service reports it. Gen is 1 for the
// first Status and increases by exactly one with every change of State or
// Detail.
type Status struct {
	Gen         uint64    `json:"gen"`
	State       State     `json:"state"`
	TimeUpdated time.Time `json:"time_updated"`
	// Detail says what State does not: whether a starting guest is booting
	// or waiting to be asked, and what a stop interrupted.
	Detail string `json:"detail,omitempty"`
}

// Details the guest reports.
const (
	detailWaiting = "waiting for a request to run"
	detailBooting = "booting"
)

// ErrInvalidTransition is wrapped by every refusal of a request the guest
// cannot carry out from its current state (HTTP 409).
var ErrInvalidTransition = errors.New("invalid transition")

// errUnknownRequest is a request that names no Request (HTTP 400).
var errUnknownRequest = errors.New("unknown request")

// Default durations of the simulated guest's transitions.
const (
	DefaultBootTime   = 500 * time.Millisecond
	DefaultStopTime   = 300 * time.Millisecond
	DefaultRebootTime = 500 * time.Millisecond
)

// Options sets how long the simulated guest takes for each transition. A
// duration that is zero or negative means its default.
type Options struct {
	BootTime   time.Duration // starting (booting) → running
	StopTime   time.Duration // stopping → stopped
	RebootTime time.Duration // rebooting → running
	// Running starts the guest running, as one found running: the agent's
	// in-process service resumes so a VMM it adopts after a restart.
	Running bool
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.BootTime, DefaultBootTime)
	def(&o.StopTime, DefaultStopTime)
	def(&o.RebootTime, DefaultRebootTime)
	return o
}

// Guest is the simulated guest's state machine. Transitions that take time
// end on timers, so tests drive it with testing/synctest. It is safe for
// concurrent use.
//
//	starting ──running──► starting (booting) ──BootTime──► running
//	running ──reboot──► rebooting ──RebootTime──► running
//	starting, running, rebooting ──stopped──► stopping ──StopTime──► stopped
//
// A request for the state the guest is in or already heading to is a no-op;
// a stop interrupts a boot or a reboot; stopped is final.
type Guest struct {
	opts Options

	mu sync.Mutex
	// Guarded by mu.
	st Status
	// timer ends the transition in progress: until Close, it is set
	// exactly while the guest boots, reboots or stops, and nil otherwise
	// (in particular while a starting guest waits to be asked to run).
	timer *time.Timer
	// changed is closed and replaced at every change of st.
	changed chan struct{}
	closed  bool
}

// NewGuest returns a guest in state starting, waiting for a request to run
// (or running, with Options.Running).
func NewGuest(opts Options) *Guest {
	st := Status{Gen: 1, State: StateStarting, TimeUpdated: time.Now().UTC(), Detail: detailWaiting}
	if opts.Running {
		st.State, st.Detail = StateRunning, "resumed"
	}
	return &Guest{opts: opts.withDefaults(), st: st, changed: make(chan struct{})}
}

// Status returns the guest's current status.
func (g *Guest) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st
}

// Request takes r and returns the status right after it was taken; the
// transition it starts completes later. A request the guest already has is
// a no-op that returns the unchanged status. A request the guest cannot
// carry out changes nothing and returns an error wrapping
// ErrInvalidTransition that names the current state and the request.
func (g *Guest) Request(r Request) (Status, error) {
	if !r.valid() {
		return Status{}, fmt.Errorf("%w %q: want %q, %q or %q", errUnknownRequest, r, RequestRunning, RequestStopped, RequestReboot)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.st.State
	refuse := func(why string) (Status, error) {
		return g.st, fmt.Errorf("%w: guest is %s, cannot take request %q: %s", ErrInvalidTransition, s, r, why)
	}
	switch r {
	case RequestRunning:
		switch s {
		case StateStarting:
			if g.timer == nil { // not booting yet
				g.setLocked(StateStarting, detailBooting)
				g.armLocked(g.opts.BootTime, StateRunning, "")
			}
		case StateRunning, StateRebooting:
			// Running, or about to run again.
		case StateStopping:
			return refuse("a stopping guest does not run again")
		default:
			return refuse("a stopped guest does not run again")
		}
	case RequestStopped:
		switch s {
		case StateStarting, StateRunning, StateRebooting:
			what := string(s)
			if s == StateStarting && g.timer != nil {
				what = detailBooting
			}
			g.stopTimerLocked() // a stop wins over a boot or a reboot
			g.setLocked(StateStopping, "stop requested while "+what)
			g.armLocked(g.opts.StopTime, StateStopped, "")
		default:
			// Stopping already, or not running at all.
		}
	case RequestReboot:
		switch s {
		case StateRunning:
			g.setLocked(StateRebooting, "")
			g.armLocked(g.opts.RebootTime, StateRunning, "")
		case StateRebooting:
			// In progress.
		case StateStarting:
			return refuse("the guest is not running yet")
		case StateStopping:
			return refuse("a stopping guest does not run again")
		default:
			return refuse("a stopped guest does not run again")
		}
	}
	return g.st, nil
}

// Wait returns the status as soon as its generation is greater than
// afterGen. When ctx ends first it returns the current status and ctx's
// error.
func (g *Guest) Wait(ctx context.Context, afterGen uint64) (Status, error) {
	for {
		g.mu.Lock()
		st, changed := g.st, g.changed
		g.mu.Unlock()
		if st.Gen > afterGen {
			return st, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			st := g.Status()
			if st.Gen > afterGen {
				return st, nil
			}
			return st, ctx.Err()
		}
	}
}

// Close stops the transition in progress, if any, and every later one: the
// guest keeps the state it has. Requests are still taken after Close, but
// the transitions they start never complete.
func (g *Guest) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.stopTimerLocked()
}

// setLocked moves the guest to state s with detail as one change.
func (g *Guest) setLocked(s State, detail string) {
	g.st = Status{Gen: g.st.Gen + 1, State: s, TimeUpdated: time.Now().UTC(), Detail: detail}
	close(g.changed)
	g.changed = make(chan struct{})
}

// armLocked ends the current transition after d by moving to next. The
// timer does nothing if the guest changed in the meantime (a stop that
// interrupted the transition, or Close).
func (g *Guest) armLocked(d time.Duration, next State, detail string) {
	if g.closed {
		return
	}
	gen := g.st.Gen
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.timer != t || g.st.Gen != gen {
			return
		}
		g.timer = nil
		g.setLocked(next, detail)
	})
	g.timer = t
}

func (g *Guest) stopTimerLocked() {
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
}
