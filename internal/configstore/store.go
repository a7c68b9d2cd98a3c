// Package configstore accepts sled configs: it validates them, applies the
// generation rules, commits them durably to the ledger and hands them on. It
// never waits for a config to be realised.
package configstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Errors that decide the answer to a PUT. Each returned error wraps one.
var (
	// ErrInvalid: the document is malformed or fails validation.
	ErrInvalid = errors.New("invalid sled config")
	// ErrOldGeneration: the generation is older than the ledgered one.
	ErrOldGeneration = errors.New("generation older than the ledgered config")
	// ErrGenerationConflict: the generation is ledgered with other content.
	ErrGenerationConflict = errors.New("generation already ledgered with different content")
	// ErrUnavailable: the config could not be ledgered (no copy written, or
	// the caller gave up waiting for another commit).
	ErrUnavailable = errors.New("ledger unavailable")
)

// Ledger is the durable store the Store commits to.
type Ledger interface {
	Read() (ledger.Record, []ledger.CopyStatus, error)
	Commit(rec ledger.Record) ([]ledger.CopyStatus, error)
	Repair(rec ledger.Record) (found, now []ledger.CopyStatus, err error)
	Status() []ledger.CopyStatus
}

// DefaultCheckPeriod is how often Run checks the ledger copies by default.
const DefaultCheckPeriod = 10 * time.Second

// Options say how a Store works beyond its ledger.
type Options struct {
	// CheckPeriod is how often Run reads every ledger copy and rewrites the
	// bad ones (0: DefaultCheckPeriod).
	CheckPeriod time.Duration
	// SledUnderlay is the sled's own underlay address, which no zone of a
	// config may take (zero: not checked).
	SledUnderlay netip.Addr
}

// Store holds the ledgered config.
type Store struct {
	ledger Ledger
	log    *slog.Logger
	notify func(*sledconfig.Config)
	opts   Options

	// commit is the commit slot (capacity 1): it serializes Put's commits
	// and Run's rewrites of copies. A Put gives up waiting with its ctx, Run
	// at once.
	commit chan struct{}
	// ledgered is the record of the current config as the ledger holds it
	// (the zero Record when there is none). Guarded by the commit slot.
	ledgered ledger.Record
	// current is the ledgered config, nil if none.
	current atomic.Pointer[sledconfig.Config]
	// loadProblem is LoadProblem's answer, nil for "".
	loadProblem atomic.Pointer[string]
	// claims, if set (UseClaims), holds the ledgered config's ids and
	// addresses; used in the commit slot.
	claims Claims
}

// Open loads the ledgered config, if any, and calls notify with it. A missing
// ledger is normal on a new sled. A ledger that exists but cannot be read or
// is corrupt, or holds a malformed config, is reported loudly and treated as
// "no config yet": nothing is torn down on its account, and the next PUT
// writes a fresh one. A well-formed config that fails validation (a rule
// added since it was accepted) is loaded, and reported.
func Open(l Ledger, log *slog.Logger, notify func(*sledconfig.Config), opts Options) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.CheckPeriod <= 0 {
		opts.CheckPeriod = DefaultCheckPeriod
	}
	s := &Store{ledger: l, log: log, notify: notify, opts: opts, commit: make(chan struct{}, 1)}
	rec, copies, err := l.Read()
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		log.Info("no ledgered sled config; waiting for one")
		return s
	case err != nil:
		s.setProblem(fmt.Sprintf("ledgered sled config could not be loaded; waiting for a new config: %v", err))
		return s
	}
	cfg, err := sledconfig.Parse(rec.Data)
	if err == nil {
		err = s.validate(cfg)
	}
	var verr *sledconfig.ValidationError
	switch {
	case errors.As(err, &verr) && verr.WellFormed():
		// Accepted before, by an agent with fewer rules, and (as far as it
		// could be) realised since. Loading it keeps the sled as it was:
		// the zones without problems stay managed, restarted if they die,
		// and nothing is torn down; the zones with problems keep failing
		// as they did. Refusing it would leave every zone unmanaged until
		// the next PUT. The next PUT must pass every rule. (A malformed
		// config, a generation above upstream's bound included, is still
		// refused below: it means nothing definite, and no config the
		// control plane can send could replace that generation.)
		s.setProblem(fmt.Sprintf("ledgered sled config generation %d was loaded, but fails validation: "+
			"the zones it names keep failing until a config that passes is put: %v", rec.Generation, err))
	case err != nil:
		s.setProblem(fmt.Sprintf("ledgered sled config generation %d is not usable; waiting for a new config: %v", rec.Generation, err))
		return s
	}
	for _, c := range copies {
		if c.State != ledger.StateOK {
			// Rewrite every copy from the good one now rather than at the
			// next PUT, which may be a long time coming.
			log.Warn("ledger copy not current; rewriting it", "path", c.Path, "state", c.State, "err", c.Err)
			if _, err := l.Commit(rec); err != nil {
				log.Error("rewriting ledger copies failed", "err", err)
			}
			break
		}
	}
	log.Info("loaded ledgered sled config", "generation", cfg.Generation, "zones", len(cfg.Zones))
	s.ledgered = rec
	s.current.Store(cfg)
	if notify != nil {
		notify(cfg)
	}
	return s
}

func (s *Store) setProblem(p string) {
	s.log.Error(p)
	s.loadProblem.Store(&p)
}

// Current returns the ledgered config, or nil.
func (s *Store) Current() *sledconfig.Config { return s.current.Load() }

// LoadProblem says what was wrong with the ledgered config at start: why
// none was loaded, or how the one loaded fails validation; "" when there was
// none or it loaded cleanly. It is cleared by the first successful Put.
func (s *Store) LoadProblem() string {
	if p := s.loadProblem.Load(); p != nil {
		return *p
	}
	return ""
}

// CopyStatus reports every ledger copy.
func (s *Store) CopyStatus() []ledger.CopyStatus { return s.ledger.Status() }

// Put validates a config document, checks its generation against the ledgered
// one and commits it. It returns once the config is durably ledgered (or
// recognised as already ledgered); it does not wait for the config to be
// realised. A rejected config changes nothing.
func (s *Store) Put(ctx context.Context, doc []byte) error {
	cfg, err := sledconfig.Parse(doc)
	if err != nil {
		return invalidError{fmt.Errorf("invalid sled config: %w", err)}
	}
	if err := s.validate(cfg); err != nil {
		return invalidError{err} // its message says "invalid sled config: …"
	}
	select {
	case s.commit <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for another commit: %w", ErrUnavailable, ctx.Err())
	}
	defer func() { <-s.commit }()

	if cur := s.current.Load(); cur != nil {
		switch {
		case cfg.Generation < cur.Generation:
			return fmt.Errorf("%w: generation %d is older than the ledgered generation %d", ErrOldGeneration, cfg.Generation, cur.Generation)
		case cfg.Generation == cur.Generation && !cfg.SameMeaning(cur):
			return fmt.Errorf("%w: generation %d is already ledgered with different content; a changed config needs a higher generation", ErrGenerationConflict, cfg.Generation)
		case cfg.Generation == cur.Generation:
			// Already ledgered, perhaps written otherwise (members left
			// out that mean null or their default, as upstream compares
			// decoded values): nothing to do, and the ledgered document
			// stays as it is.
			return nil
		}
	}
	// The canonical form is made from the parsed document: a single JSON
	// object, which the ledger need not read again.
	rec := ledger.Record{Generation: cfg.Generation, Data: cfg.Canonical(), Checked: true}
	settle, err := s.claim(cfg)
	if err != nil {
		return err // collides with a VMM or the sled
	}
	copies, err := s.ledger.Commit(rec)
	if err != nil {
		// No copy holds the config: a restart would not load it either.
		settle(false)
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	settle(true)
	// At least one copy holds the config, so a restart loads it: the PUT
	// succeeds, as upstream's does with one copy written, and the other
	// copies are reported degraded (in inventory, from the ledger's
	// status) until Run rewrites them.
	for _, c := range copies {
		if c.State != ledger.StateOK {
			s.log.Error("sled config ledgered, but a ledger copy is degraded", "generation", cfg.Generation,
				"path", c.Path, "state", c.State, "err", c.Err)
		}
	}
	s.ledgered = rec
	s.current.Store(cfg)
	s.loadProblem.Store(nil)
	s.log.Info("ledgered sled config", "generation", cfg.Generation, "zones", len(cfg.Zones))
	if s.notify != nil {
		s.notify(cfg)
	}
	return nil
}

func (s *Store) validate(cfg *sledconfig.Config) error {
	return sledconfig.ValidateWith(cfg, sledconfig.ValidateOptions{SledUnderlay: s.opts.SledUnderlay})
}

// invalidError is an ErrInvalid that reads as its cause alone.
type invalidError struct{ err error }

func (e invalidError) Error() string   { return e.err.Error() }
func (e invalidError) Unwrap() []error { return []error{ErrInvalid, e.err} }
