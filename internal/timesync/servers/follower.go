// Package servers keeps the chrony of every internal NTP zone following the
// rack's boundary NTP servers, which it finds in internal DNS.
package servers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
	"github.com/sled-agent/sled-agent/internal/dns"
)

// ErrNoServers: internal DNS answered, and the name has no AAAA records (or
// does not exist). The last servers found are kept.
var ErrNoServers = errors.New("no boundary NTP servers in internal DNS")

// Resolver finds the addresses of a name; *dns.Resolver is one. An empty
// answer with a nil error means the name has no AAAA records.
type Resolver interface {
	LookupAAAA(ctx context.Context, name string) ([]netip.Addr, error)
}

// Setter makes an internal NTP zone's chrony follow servers (with
// *chrony.Daemon.SetServers behind it). It is called under a deadline,
// for one zone at a time per zone, and may be called for several zones at
// once. Setting the servers a zone already has must succeed.
type Setter interface {
	SetServers(ctx context.Context, zone Zone, servers []netip.Addr) error
}

// Zone is an internal NTP zone that runs.
type Zone struct {
	// ID is the zone's id: the follower keeps what it did per ID.
	ID string
	// Name is the zone's name (oxz_ntp_<id>), for the status and the
	// Setter.
	Name string
	// Instance changes whenever the zone is started again (the agent may
	// use when it last started running): a new instance is a new zone to
	// the follower, and gets the servers even if the last one had them.
	Instance string
}

// Options set a Follower up. Zero durations take the defaults.
type Options struct {
	// Resolver looks Name up. Required.
	Resolver Resolver
	// Name is the name looked up (dns.BoundaryNTPName).
	Name string
	// Zones returns the internal NTP zones that run now. It must not block
	// (the agent reads it from its latest snapshots). Required.
	Zones func() []Zone
	// Setter sets a zone's servers. Required.
	Setter Setter
	// Period is the pause between lookups once one has found servers
	// (10s); StartPeriod the pause while none has yet (1s). Consecutive
	// failed lookups (errors, or no servers) double the pause up to
	// MaxBackoff (30s; never below the pause), or up to Period while no
	// lookup has found servers yet. A zone whose set failed is tried
	// again sooner: after StartPeriod, doubling up to Period.
	Period      time.Duration
	StartPeriod time.Duration
	MaxBackoff  time.Duration
	// LookupTimeout bounds each lookup (5s), SetTimeout each SetServers
	// (10s).
	LookupTimeout time.Duration
	SetTimeout    time.Duration
	Log           *slog.Logger
}

// Status is what the follower last saw and did. Its JSON is our
// inventory's view.
type Status struct {
	// Name is the name looked up.
	Name string `json:"name"`
	// Servers are the servers the last successful lookup found, sorted:
	// what the zones are given. They stay when a later lookup fails or
	// finds none.
	Servers []netip.Addr `json:"servers"`
	// FoundAt is when a lookup last found Servers.
	FoundAt time.Time `json:"found_at,omitzero"`
	// LastLookup is when the last lookup ended; LookupError says why it
	// found no servers, if it did not.
	LastLookup  time.Time `json:"last_lookup,omitzero"`
	LookupError string    `json:"lookup_error,omitempty"`
	// Failures counts consecutive lookups that found no servers.
	Failures int `json:"failures,omitempty"`
	// Zones are the running internal NTP zones, by ID.
	Zones []ZoneStatus `json:"zones"`

	lookupErr error
}

// Err is the last lookup's error (wrapping ErrNoServers when DNS had no
// records), or nil when it found servers.
func (s Status) Err() error { return s.lookupErr }

// ZoneStatus is what the follower did to one zone.
type ZoneStatus struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Servers are the servers the zone was last given successfully, at
	// SetAt; empty until then.
	Servers []netip.Addr `json:"servers"`
	SetAt   time.Time    `json:"set_at,omitzero"`
	// LastAttempt is when servers were last sent; Error says why that
	// failed, Failures how many sends in a row did.
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	Error       string    `json:"error,omitempty"`
	Failures    int       `json:"failures,omitempty"`
}

// Follower looks up the rack's boundary NTP servers on a period and gives
// them to every running internal NTP zone: to a zone new to it (or started
// again), to every zone when they change, and again to a zone whose last
// set failed. The same servers are not sent twice to a zone.
//
// A lookup that fails, or finds no servers (no name, no records), is
// reported in Status and changes no zone's servers: the last servers found
// are kept and given to zones that start meanwhile. An empty list is never
// sent, so a zone's chrony keeps following the last boundary NTP servers it
// knew until DNS names others. Until a lookup has found servers, zones are
// given none (they start with whatever their config has).
type Follower struct {
	opts    Options
	poke    chan struct{}
	running atomic.Bool

	// loop is Run's own state, touched by Run's goroutine only.
	loop loopState

	mu     sync.Mutex
	status Status // guarded by mu
}

// loopState is what Run remembers between passes.
type loopState struct {
	known     []netip.Addr // the last servers found
	succeeded bool         // a lookup has found servers
	failures  int          // consecutive failed lookups
	lastErr   error
	zones     map[string]*zoneState
}

// zoneState is what was done to one zone instance.
type zoneState struct {
	zone     Zone
	set      []netip.Addr // what the last successful set sent
	ok       bool         // the last set succeeded
	setAt    time.Time
	attempt  time.Time
	err      error
	failures int
}

// New checks opts and returns a follower; Run runs it.
func New(opts Options) (*Follower, error) {
	switch {
	case opts.Resolver == nil:
		return nil, errors.New("ntp servers: no resolver")
	case opts.Zones == nil:
		return nil, errors.New("ntp servers: no Zones function")
	case opts.Setter == nil:
		return nil, errors.New("ntp servers: no setter")
	}
	opts.Name = cmp.Or(opts.Name, dns.BoundaryNTPName)
	opts.Period = cmp.Or(opts.Period, 10*time.Second)
	opts.StartPeriod = cmp.Or(opts.StartPeriod, time.Second)
	opts.MaxBackoff = cmp.Or(opts.MaxBackoff, 30*time.Second)
	opts.LookupTimeout = cmp.Or(opts.LookupTimeout, 5*time.Second)
	opts.SetTimeout = cmp.Or(opts.SetTimeout, 10*time.Second)
	for _, d := range []time.Duration{opts.Period, opts.StartPeriod, opts.MaxBackoff, opts.LookupTimeout, opts.SetTimeout} {
		if d < 0 {
			return nil, fmt.Errorf("ntp servers: negative duration %s", d)
		}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	opts.Log = opts.Log.With("component", "ntp-servers", "name", opts.Name)
	return &Follower{
		opts:   opts,
		poke:   make(chan struct{}, 1),
		loop:   loopState{zones: map[string]*zoneState{}},
		status: Status{Name: opts.Name, Zones: []ZoneStatus{}},
	}, nil
}

// Status returns what the follower last saw and did; it never waits for a
// lookup or a set.
func (f *Follower) Status() Status {
	f.mu.Lock()
	st := f.status
	f.mu.Unlock()
	st.Servers = slices.Clone(st.Servers)
	st.Zones = slices.Clone(st.Zones)
	for i := range st.Zones {
		st.Zones[i].Servers = slices.Clone(st.Zones[i].Servers)
	}
	return st
}

// Poke asks for a pass now (as when an internal NTP zone has started). It
// never blocks.
func (f *Follower) Poke() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// Run looks up and sets at once, then after every pause or Poke, until ctx
// ends; it returns nil then. It may run only once at a time.
func (f *Follower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return errors.New("ntp servers: already running")
	}
	defer f.running.Store(false)
	for {
		pause := f.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-f.poke:
			t.Stop()
		case <-t.C:
		}
	}
}

// pass looks the servers up once, sends them to the zones that need them,
// publishes the status and returns the pause before the next pass.
func (f *Follower) pass(ctx context.Context) time.Duration {
	l := &f.loop
	found, err := f.lookup(ctx)
	if ctx.Err() != nil {
		return 0 // Run is ending: nothing was learned
	}
	lookupAt := time.Now()
	f.noteLookup(found, err)

	// The zones that run now; forget the others.
	zones := map[string]Zone{}
	for _, z := range f.opts.Zones() {
		if z.ID != "" {
			zones[z.ID] = z
		}
	}
	for id, st := range l.zones {
		if z, ok := zones[id]; !ok || z.Instance != st.zone.Instance {
			delete(l.zones, id)
		}
	}
	var todo []*zoneState
	for _, id := range slices.Sorted(maps.Keys(zones)) {
		st := l.zones[id]
		if st == nil {
			st = &zoneState{}
			l.zones[id] = st
		}
		st.zone = zones[id]
		if len(l.known) > 0 && (!st.ok || !slices.Equal(st.set, l.known)) {
			todo = append(todo, st)
		}
	}
	// What the lookup found is readable while the sets run.
	f.publish(lookupAt)
	f.set(ctx, todo, l.known)
	f.publish(lookupAt)
	return f.pause()
}

// lookup asks DNS for the servers under the lookup deadline. No servers is
// ErrNoServers.
func (f *Follower) lookup(ctx context.Context) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, f.opts.LookupTimeout)
	defer cancel()
	addrs, err := f.opts.Resolver.LookupAAAA(ctx, f.opts.Name)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", f.opts.Name, err)
	}
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: %s has no AAAA records", ErrNoServers, f.opts.Name)
	}
	return addrs, nil
}

// noteLookup keeps what a lookup found, and logs what changed.
func (f *Follower) noteLookup(found []netip.Addr, err error) {
	l := &f.loop
	log := f.opts.Log
	if err != nil {
		l.failures++
		if l.lastErr == nil || errors.Is(err, ErrNoServers) != errors.Is(l.lastErr, ErrNoServers) {
			log.Warn("boundary NTP servers not found; zones keep the last ones", "err", err, "kept", l.known)
		}
		l.lastErr = err
		return
	}
	if l.lastErr != nil && l.succeeded {
		log.Info("boundary NTP servers found again", "servers", found)
	}
	if !slices.Equal(found, l.known) {
		log.Info("boundary NTP servers", "servers", found, "before", l.known)
	}
	l.known, l.succeeded, l.failures, l.lastErr = found, true, 0, nil
}

// set sends servers to every zone of todo at once, each under its own
// deadline, and keeps the results.
func (f *Follower) set(ctx context.Context, todo []*zoneState, servers []netip.Addr) {
	errs := make([]error, len(todo))
	var wg sync.WaitGroup
	for i, st := range todo {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, f.opts.SetTimeout)
			defer cancel()
			err := f.opts.Setter.SetServers(sctx, st.zone, slices.Clone(servers))
			if err != nil && errors.Is(sctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
				err = fmt.Errorf("no answer within %s: %w", f.opts.SetTimeout, err)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // Run is ending: the sets were cut short, not failed
	}
	now := time.Now()
	for i, st := range todo {
		st.attempt = now
		log := f.opts.Log.With("zone", st.zone.Name, "servers", servers)
		if err := errs[i]; err != nil {
			if st.err == nil || st.err.Error() != err.Error() {
				log.Warn("setting the zone's NTP servers failed; retrying", "err", err)
			}
			st.ok, st.err = false, err
			st.failures++
			continue
		}
		log.Info("the zone's NTP servers are set")
		st.set, st.ok, st.setAt, st.err, st.failures = servers, true, now, nil, 0
	}
}

// publish makes the loop's state the status.
func (f *Follower) publish(lookupAt time.Time) {
	l := &f.loop
	zs := make([]ZoneStatus, 0, len(l.zones))
	for _, id := range slices.Sorted(maps.Keys(l.zones)) {
		st := l.zones[id]
		z := ZoneStatus{
			ID: id, Name: st.zone.Name, Servers: st.set, SetAt: st.setAt,
			LastAttempt: st.attempt, Failures: st.failures,
		}
		if st.err != nil {
			z.Error = st.err.Error()
		}
		zs = append(zs, z)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.status
	s.LastLookup, s.Failures, s.lookupErr, s.LookupError = lookupAt, l.failures, l.lastErr, ""
	if l.lastErr != nil {
		s.LookupError = l.lastErr.Error()
	} else {
		s.FoundAt = lookupAt
	}
	s.Servers = l.known
	s.Zones = zs
}

// pause is the wait before the next pass: the period (the start period
// until servers were first found), doubled per consecutive failed lookup up
// to MaxBackoff (up to the period until servers were first found); sooner,
// from the start period doubling up to the period, when a zone's last set
// failed.
func (f *Follower) pause() time.Duration {
	l := &f.loop
	base := f.opts.StartPeriod
	if l.succeeded {
		base = f.opts.Period
	}
	pause := base
	if l.failures > 0 {
		limit := max(f.opts.MaxBackoff, base)
		if !l.succeeded {
			// The sled waits on these servers to synchronize its
			// time: look again at least every period.
			limit = max(min(limit, f.opts.Period), base)
		}
		pause = backoff.Backoff{Initial: base, Max: limit}.Delay(l.failures)
	}
	setFailures := 0
	for _, st := range l.zones {
		setFailures = max(setFailures, st.failures)
	}
	if setFailures > 0 {
		retry := backoff.Backoff{Initial: f.opts.StartPeriod, Max: max(f.opts.Period, f.opts.StartPeriod)}.Delay(setFailures)
		pause = min(pause, retry)
	}
	return pause
}
