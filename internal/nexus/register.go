package nexus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
)

// Sleds is what the Registrar needs of Nexus (*Client).
type Sleds interface {
	GetSled(ctx context.Context, sledID string) (SledAgentInfo, error)
	PutSled(ctx context.Context, sledID string, info SledAgentInfo) error
}

// RegistrarOptions tune a Registrar; zero values are the defaults.
type RegistrarOptions struct {
	// Retry is the wait after consecutive failures (default 2 s, as
	// upstream retries, doubling up to 10 s).
	Retry backoff.Backoff
	// Verify is how often the record Nexus holds is read again while
	// nothing changed (default 1 min). Upstream's agent never reads it
	// again once it matched; this one does, so that a Nexus that lost the
	// record (a database restored, a simulator restarted) is told again.
	Verify time.Duration
	Log    *slog.Logger
}

// Registration is what the Registrar knows, for people.
type Registration struct {
	// State is "finding" (nothing learned yet), "registered" (Nexus's
	// record is ours), "registering" (ours differs and is being sent),
	// "retrying" (the last request failed) or "decommissioned" (Nexus
	// decommissioned the sled: nothing more is sent).
	State string `json:"state"`
	// Known is the record Nexus holds, as last learned; null when not
	// known. NexusHasNone is true when Nexus said it holds none.
	Known        *SledAgentInfo `json:"known"`
	NexusHasNone bool           `json:"nexus_has_none,omitempty"`
	// Outstanding is the request in flight ("GET", "POST"), and since when.
	Outstanding      string     `json:"outstanding,omitempty"`
	OutstandingSince *time.Time `json:"outstanding_since,omitempty"`
	LastSuccess      *time.Time `json:"last_success,omitempty"`
	LastError        string     `json:"last_error,omitempty"`
	LastErrorAt      *time.Time `json:"last_error_at,omitempty"`
	NextTry          *time.Time `json:"next_try,omitempty"`
	Gets             int        `json:"gets"`
	Posts            int        `json:"posts"`
}

// Registrar registers the sled with Nexus and keeps its record current,
// following upstream's notifier: one request at a time; first learn the
// record Nexus holds (GET); whenever the sled's info differs from it, POST
// it with the generation bumped past Nexus's; after any failure forget what
// Nexus holds and ask again; once Nexus says the sled is decommissioned,
// stop for good.
type Registrar struct {
	nexus  Sleds
	sledID string
	info   func() SledAgentInfo
	opts   RegistrarOptions
	poke   chan struct{}

	mu sync.Mutex
	st Registration
}

// NewRegistrar returns a registrar for sledID; info gives the sled's info
// as of now (its Generation and Decommissioned are ignored).
func NewRegistrar(nexus Sleds, sledID string, info func() SledAgentInfo, opts RegistrarOptions) *Registrar {
	if opts.Retry == (backoff.Backoff{}) {
		opts.Retry = backoff.Backoff{Initial: 2 * time.Second, Max: 10 * time.Second}
	}
	if opts.Verify <= 0 {
		opts.Verify = time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Registrar{nexus: nexus, sledID: sledID, info: info, opts: opts, poke: make(chan struct{}, 1), st: Registration{State: "finding"}}
}

// Poke says the sled's info may have changed. It never blocks.
func (r *Registrar) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Status is what the registrar knows now.
func (r *Registrar) Status() Registration {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	if st.Known != nil {
		k := *st.Known
		st.Known = &k
	}
	return st
}

// Run registers and follows changes until ctx ends or Nexus decommissions
// the sled.
func (r *Registrar) Run(ctx context.Context) {
	var (
		known    *SledAgentInfo // the record Nexus holds
		learned  bool           // known (or its absence) is what Nexus said
		failures int
	)
	for ctx.Err() == nil {
		if known != nil && known.Decommissioned {
			r.update(func(st *Registration) { st.State = "decommissioned"; st.NextTry = nil })
			r.opts.Log.Info("Nexus decommissioned this sled: no more registration requests")
			return
		}
		var err error
		wait := time.Duration(0)
		if !learned {
			var info SledAgentInfo
			info, err = r.get(ctx)
			switch {
			case err == nil:
				known, learned = &info, true
			case errors.Is(err, ErrNotFound):
				known, learned, err = nil, true, nil
			}
		} else {
			want := r.info()
			want.Decommissioned = false
			want.Generation = 1 // upstream's Generation::new() for a sled Nexus holds none of
			if known != nil {
				want.Generation = known.Generation
			}
			if known != nil && want == *known {
				r.update(func(st *Registration) { st.State = "registered"; st.NextTry = nil })
				// Matches: wait for a change, or the next check.
				select {
				case <-ctx.Done():
					return
				case <-r.poke:
				case <-time.After(r.opts.Verify):
					learned = false
				}
				continue
			}
			if known != nil {
				want.Generation = known.Generation + 1
			}
			r.update(func(st *Registration) { st.State = "registering" })
			if err = r.put(ctx, want); err == nil {
				known = &want
				r.opts.Log.Info("Nexus knows the sled", "generation", want.Generation)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Whatever failed, Nexus's record is no longer known: a
			// POST may have been refused because it is newer than ours,
			// or taken before its answer was lost.
			known, learned = nil, false
			failures++
			wait = r.opts.Retry.Delay(failures)
			r.opts.Log.Warn("registering with Nexus failed; retrying", "err", err, "retry_in", wait)
		} else {
			failures = 0
		}
		r.update(func(st *Registration) {
			st.Known, st.NexusHasNone = known, learned && known == nil
			if err != nil {
				next := time.Now().Add(wait)
				st.State, st.NextTry = "retrying", &next
			}
		})
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}
}

// get asks Nexus for its record of the sled.
func (r *Registrar) get(ctx context.Context) (SledAgentInfo, error) {
	r.start("GET")
	info, err := r.nexus.GetSled(ctx, r.sledID)
	if err == nil && info.Generation == 0 {
		// Generations start at 1: a record at 0 is not one Nexus keeps.
		err = fmt.Errorf("nexus GET /sled-agents/%s: answer has generation 0, which no record has", r.sledID)
	}
	r.end(err == nil || errors.Is(err, ErrNotFound), err)
	return info, err
}

// put sends the sled's record.
func (r *Registrar) put(ctx context.Context, info SledAgentInfo) error {
	r.start("POST")
	err := r.nexus.PutSled(ctx, r.sledID, info)
	r.end(err == nil, err)
	return err
}

func (r *Registrar) start(method string) {
	now := time.Now()
	r.update(func(st *Registration) {
		st.Outstanding, st.OutstandingSince, st.NextTry = method, &now, nil
		if method == "GET" {
			st.Gets++
		} else {
			st.Posts++
		}
	})
}

func (r *Registrar) end(ok bool, err error) {
	now := time.Now()
	r.update(func(st *Registration) {
		st.Outstanding, st.OutstandingSince = "", nil
		if ok {
			st.LastSuccess = &now
			return
		}
		st.LastError, st.LastErrorAt = err.Error(), &now
	})
}

func (r *Registrar) update(f func(*Registration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.st)
}
