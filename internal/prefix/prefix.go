// Package prefix keeps the routing prefixes this sled originates in the
// rack's routing daemon (maghemite DDM) exactly right. DDM does not know who
// originated a prefix, so the agent owns its sled's whole originated set and
// reconciles it like the zones: desired (the sled's bootstrap and underlay
// /64s, and the /64 of the gz_address of every running internal DNS zone)
// against actual (DDM's GET /originated), diffed and applied, advertising
// before withdrawing, on every change of the zones and every period. An
// internal DNS zone's prefix is wanted while the zone is present: from its
// adoption or the start of its creation until it is torn down or removed
// from the config, so that a zone still coming up after an agent restart
// keeps it.
// A prefix nobody wants, including one this agent never advertised, is
// withdrawn and reported; what this agent advertised is remembered in a
// state file, so that after a restart its own prefixes are still known as
// its own. The upstream agent advertised an internal DNS
// zone's prefix at zone start and never withdrew it; here a removed zone's
// prefix goes with the zone, and after a crash with the next pass.
package prefix

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// DDM is what the reconciler needs of the routing daemon's admin API
// (internal/ddm.Client).
type DDM interface {
	Originated(ctx context.Context) ([]netip.Prefix, error)
	Advertise(ctx context.Context, ps []netip.Prefix) error
	Withdraw(ctx context.Context, ps []netip.Prefix) error
}

// Zones is what the reconciler needs of the zone reconciler.
type Zones interface {
	// PresentSpecs are the zones present now: from the start of their
	// creation or their adoption until they are torn down or no longer
	// wanted (reconciler.PresentSpecs).
	PresentSpecs() []zone.Spec
	// Restored is closed once the zones found at start-up are adopted: the
	// first pass waits for it, so it never withdraws the prefix of a live
	// zone the agent has not yet seen.
	Restored() <-chan struct{}
	// Unmanaged names the zones no config judges (reconciler.Unmanaged):
	// while there are any, a prefix no zone wants may be one of theirs (an
	// internal DNS zone's), and none is withdrawn.
	Unmanaged() []string
}

// Options set the reconciler up. Zero values take the defaults.
type Options struct {
	// Bootstrap is the sled's bootstrap prefix (a /64); the zero value
	// advertises none.
	Bootstrap netip.Prefix
	// Underlay is the sled's underlay address; its /64 is advertised. The
	// zero value advertises none.
	Underlay netip.Addr
	// Period is how often DDM is checked even when nothing changed (30s).
	Period time.Duration
	// RetryInitial is the first wait after a failed pass; it doubles up to
	// RetryMax (1s and 5s; neither beyond Period). A short cap keeps the
	// time from DDM's return to convergence short.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// CallTimeout bounds each call to DDM (5s).
	CallTimeout time.Duration
	// HistoryLen is how many changes Status keeps (32).
	HistoryLen int
	// StateFile, if set, keeps the prefixes this agent advertised and has
	// not yet withdrawn, so that the next agent knows them as its own.
	StateFile string
	Log       *slog.Logger
}

// Status is what the reconciler reports.
type Status struct {
	// Desired is the set this sled should originate, Observed what DDM
	// said it originates at the last successful look (ObservedAt), before
	// that pass changed anything.
	Desired    []string   `json:"desired"`
	Observed   []string   `json:"observed"`
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	// InSync: DDM held exactly Desired after the last pass.
	InSync bool `json:"in_sync"`
	// LastSuccess is when a pass last completed; LastError says why the
	// last pass failed, if it did (cleared by a success).
	LastSuccess *time.Time `json:"last_success,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Passes and Failures count passes since start.
	Passes   uint64 `json:"passes"`
	Failures uint64 `json:"failures"`
	// History lists the latest changes made to DDM, newest last.
	History []Change `json:"history"`
	// Kept are the prefixes no zone of the config wants, not withdrawn
	// because zones run that no readable config judges (the ledger lost
	// or corrupt): they may be theirs.
	Kept []string `json:"kept,omitempty"`
}

// Change is one advertisement or withdrawal.
type Change struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"` // "advertised" or "withdrew"
	Prefix string    `json:"prefix"`
	// Why: "wanted", "no longer wanted", or "not this sled's" for a prefix
	// found in DDM that this agent did not advertise.
	Why string `json:"why"`
}

// Reconciler keeps DDM's originated set equal to the desired set.
type Reconciler struct {
	ddm   DDM
	zones Zones
	opts  Options
	poke  chan struct{}

	mu     sync.Mutex
	status Status                // guarded by mu
	ours   map[netip.Prefix]bool // guarded by mu; what this agent wants or advertised and has not withdrawn
	// saved is the set last written to the state file; only the Run
	// goroutine touches it.
	saved []netip.Prefix
}

// New returns a reconciler; Run runs it.
func New(ddm DDM, zones Zones, opts Options) *Reconciler {
	opts.Period = cmp.Or(opts.Period, 30*time.Second)
	opts.RetryInitial = cmp.Or(opts.RetryInitial, time.Second)
	opts.RetryMax = min(cmp.Or(opts.RetryMax, 5*time.Second), opts.Period)
	opts.CallTimeout = cmp.Or(opts.CallTimeout, 5*time.Second)
	opts.HistoryLen = cmp.Or(opts.HistoryLen, 32)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{ddm: ddm, zones: zones, opts: opts, poke: make(chan struct{}, 1), ours: map[netip.Prefix]bool{}}
	r.loadOurs()
	return r
}

// ownState is the state file: what this agent advertised.
type ownState struct {
	Advertised []netip.Prefix `json:"advertised"`
}

// loadOurs reads the prefixes an earlier agent advertised. A missing file
// is a first start; an unreadable one is logged, and the prefixes in it are
// then taken for somebody else's, as before there was a file.
func (r *Reconciler) loadOurs() {
	if r.opts.StateFile == "" {
		return
	}
	data, err := os.ReadFile(r.opts.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var st ownState
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	if err != nil {
		r.opts.Log.Error("reading the prefixes this agent advertised", "file", r.opts.StateFile, "err", err)
		return
	}
	for _, p := range st.Advertised {
		r.ours[p.Masked()] = true
	}
	r.saved = sortedPrefixes(r.ours)
}

// saveOurs writes the set of our prefixes when it changed. It is called
// from the Run goroutine, with no lock held; a failure is logged and the
// write tried again at the next pass.
func (r *Reconciler) saveOurs() {
	if r.opts.StateFile == "" {
		return
	}
	r.mu.Lock()
	ours := sortedPrefixes(r.ours)
	r.mu.Unlock()
	if slices.Equal(ours, r.saved) {
		return
	}
	data, err := json.Marshal(ownState{Advertised: ours})
	if err == nil {
		err = atomicfile.WriteFile(r.opts.StateFile, data, atomicfile.Options{})
	}
	if err != nil {
		r.opts.Log.Error("recording the prefixes this agent advertised", "file", r.opts.StateFile, "err", err)
		return
	}
	r.saved = ours
}

// Poke asks for a pass as soon as possible. It never blocks; pokes during a
// pass coalesce into one more pass.
func (r *Reconciler) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Status returns a snapshot. It never waits for a pass.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	// Empty lists, not nulls, for readers of the JSON.
	s.Desired = append([]string{}, s.Desired...)
	s.Observed = append([]string{}, s.Observed...)
	s.History = append([]Change{}, s.History...)
	return s
}

// Run reconciles until ctx ends. Its first pass waits for the zones to be
// restored.
func (r *Reconciler) Run(ctx context.Context) error {
	select {
	case <-r.zones.Restored():
	case <-ctx.Done():
		return nil
	}
	r.setDesired(Desired(r.opts.Bootstrap, r.opts.Underlay, r.zones.PresentSpecs()))
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	fails, waits := 0, 0
	for {
		next := r.opts.Period
		if err := r.pass(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fails++
			next = min(r.retryDelay(fails), r.opts.RetryMax, r.opts.Period)
			r.opts.Log.Warn("prefix reconciliation failed", "err", err, "failures", fails, "retry_in", next)
		} else {
			fails = 0
		}
		// Prefixes kept for zones no config judged yet are looked at
		// again soon: the zones' judgement (a config read, the zones
		// removed) need not change the present zones, which is what
		// pokes this loop.
		if r.keeping() {
			waits++
			next = min(next, r.retryDelay(waits), r.opts.RetryMax)
		} else {
			waits = 0
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-r.poke:
			if !t.Stop() {
				<-t.C
			}
		case <-t.C:
		}
	}
}

// keeping reports whether the last pass kept prefixes for zones that no
// readable config judges.
func (r *Reconciler) keeping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.status.Kept) > 0
}

func (r *Reconciler) retryDelay(fails int) time.Duration {
	d := r.opts.RetryInitial
	for i := 1; i < fails && d < r.opts.RetryMax; i++ {
		d *= 2
	}
	return d
}

// Desired returns the prefixes a sled should originate: its bootstrap /64,
// the /64 of its underlay address, and the /64 of the gz_address of every
// present internal DNS zone; normalised (host bits zero) and sorted.
func Desired(bootstrap netip.Prefix, underlay netip.Addr, present []zone.Spec) []netip.Prefix {
	set := map[netip.Prefix]bool{}
	if bootstrap.IsValid() {
		set[bootstrap.Masked()] = true
	}
	if underlay.IsValid() {
		set[netip.PrefixFrom(underlay, 64).Masked()] = true
	}
	for _, s := range present {
		if s.Config.ZoneType.Type != "internal_dns" {
			continue
		}
		if a, err := netip.ParseAddr(s.Config.ZoneType.GZAddress); err == nil && a.Is6() {
			set[netip.PrefixFrom(a, 64).Masked()] = true
		}
	}
	return sortedPrefixes(set)
}

func sortedPrefixes(set map[netip.Prefix]bool) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// pass makes DDM originate exactly the desired set.
func (r *Reconciler) pass(ctx context.Context) (err error) {
	defer func() {
		r.saveOurs() // what was withdrawn is ours no more
		r.finish(err)
	}()
	want := Desired(r.opts.Bootstrap, r.opts.Underlay, r.zones.PresentSpecs())
	r.setDesired(want)
	r.saveOurs() // before advertising: a crash never leaves ours unrecorded
	have, err := r.call(ctx, func(ctx context.Context) ([]netip.Prefix, error) { return r.ddm.Originated(ctx) })
	if err != nil {
		return fmt.Errorf("asking DDM what it originates: %w", err)
	}
	r.observed(have)
	wantSet := map[netip.Prefix]bool{}
	for _, p := range want {
		wantSet[p] = true
	}
	haveSet := map[netip.Prefix]bool{}
	for _, p := range have {
		haveSet[p] = true
	}
	var add, del []netip.Prefix
	for _, p := range want {
		if !haveSet[p] {
			add = append(add, p)
		}
	}
	for _, p := range sortedPrefixes(haveSet) {
		if !wantSet[p] {
			del = append(del, p)
		}
	}
	var kept []string
	if unjudged := r.zones.Unmanaged(); len(unjudged) > 0 && len(del) > 0 {
		for _, p := range del {
			kept = append(kept, p.String())
		}
		del = nil
		r.mu.Lock()
		again := slices.Equal(kept, r.status.Kept)
		r.mu.Unlock()
		if !again {
			r.opts.Log.Warn("prefixes no zone wants kept: zones run that no readable config judges", "prefixes", kept, "zones", unjudged)
		}
	}
	r.mu.Lock()
	r.status.Kept = kept
	r.mu.Unlock()
	// Advertise first: a prefix that moves never has a gap.
	if len(add) > 0 {
		if _, err := r.call(ctx, func(ctx context.Context) ([]netip.Prefix, error) { return nil, r.ddm.Advertise(ctx, add) }); err != nil {
			return fmt.Errorf("advertising %v: %w", add, err)
		}
		r.changed("advertised", add, func(netip.Prefix) string { return "wanted" })
	}
	if len(del) > 0 {
		if _, err := r.call(ctx, func(ctx context.Context) ([]netip.Prefix, error) { return nil, r.ddm.Withdraw(ctx, del) }); err != nil {
			return fmt.Errorf("withdrawing %v: %w", del, err)
		}
		r.changed("withdrew", del, func(p netip.Prefix) string {
			if r.ours[p] {
				delete(r.ours, p) // withdrawn: ours no more
				return "no longer wanted"
			}
			return "not this sled's"
		})
	}
	r.mu.Lock()
	r.status.InSync = len(kept) == 0
	r.mu.Unlock()
	return nil
}

// call runs one DDM call under CallTimeout.
func (r *Reconciler) call(ctx context.Context, f func(context.Context) ([]netip.Prefix, error)) ([]netip.Prefix, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	return f(cctx)
}

func (r *Reconciler) setDesired(want []netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Desired = prefixStrings(want)
	for _, p := range want {
		r.ours[p] = true
	}
}

func (r *Reconciler) observed(have []netip.Prefix) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Observed = prefixStrings(have)
	r.status.ObservedAt = &now
	r.status.InSync = false
}

// changed records what a pass did to DDM. The log line is a warning for a
// withdrawal: a prefix going away is what operators look for.
func (r *Reconciler) changed(action string, ps []netip.Prefix, why func(netip.Prefix) string) {
	now := time.Now()
	var done []Change
	r.mu.Lock()
	for _, p := range ps {
		c := Change{At: now, Action: action, Prefix: p.String(), Why: why(p)}
		if len(r.status.History) >= r.opts.HistoryLen {
			r.status.History = slices.Delete(r.status.History, 0, len(r.status.History)-r.opts.HistoryLen+1)
		}
		r.status.History = append(r.status.History, c)
		done = append(done, c)
	}
	r.mu.Unlock()
	for _, c := range done { // logged with no lock held
		if action == "withdrew" {
			r.opts.Log.Warn("withdrew a prefix from DDM", "prefix", c.Prefix, "why", c.Why)
		} else {
			r.opts.Log.Info("advertised a prefix to DDM", "prefix", c.Prefix)
		}
	}
}

func (r *Reconciler) finish(err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Passes++
	if err != nil {
		r.status.Failures++
		r.status.LastError = err.Error()
		r.status.LastErrorAt = &now
		r.status.InSync = false
		return
	}
	r.status.LastError = ""
	r.status.LastSuccess = &now
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
