package configstore

import (
	"context"
	"errors"
	"time"

	"github.com/sled-agent/sled-agent/internal/ledger"
)

// Run checks the ledger copies every CheckPeriod until ctx ends, so that
// their status stays true and a copy deleted, corrupted or left behind is
// rewritten from the ledgered config. It returns nil when ctx ends.
//
// A check takes the commit slot, so it never interleaves with a Put's
// commit; if a commit holds the slot it does not wait but leaves this round
// out (the commit publishes fresh statuses itself). It holds the slot only
// across the ledger's own reads and writes of its copies.
func (s *Store) Run(ctx context.Context) error {
	tick := time.NewTicker(s.opts.CheckPeriod)
	defer tick.Stop()
	// reported is what was last logged about each copy that is not ok,
	// so that a copy that stays bad is logged once, not every round.
	reported := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			s.checkCopies(reported)
		}
	}
}

// checkCopies is one round of Run.
func (s *Store) checkCopies(reported map[string]string) {
	select {
	case s.commit <- struct{}{}:
	default:
		s.log.Debug("a commit is in progress; checking the ledger copies next round")
		return
	}
	defer func() { <-s.commit }()

	if s.current.Load() == nil {
		// Nothing ledgered by this agent to rewrite from (a new sled, or a
		// ledger that could not be loaded, whose copies must be left as
		// they are): read the copies so that their status stays true.
		s.ledger.Read()
		return
	}
	found, now, err := s.ledger.Repair(s.ledgered)
	for i, c := range now {
		f := found[i]
		if f.State != ledger.StateOK && c.State == ledger.StateOK {
			s.log.Warn("ledger copy was not current; rewrote it from the ledgered config", "path", c.Path,
				"was", f.State, "err", f.Err, "generation", s.ledgered.Generation)
		}
		if c.State == ledger.StateOK {
			delete(reported, c.Path)
			continue
		}
		// By states, not messages: a message may name a temp file.
		if what := string(f.State) + " -> " + string(c.State); reported[c.Path] != what {
			reported[c.Path] = what
			s.log.Error("ledger copy degraded and could not be rewritten; trying again every period", "path", c.Path,
				"state", c.State, "err", c.Err, "generation", s.ledgered.Generation, "period", s.opts.CheckPeriod)
		}
	}
	if err != nil && !errors.Is(err, ledger.ErrNoCopyWritten) { // that one is in the copies' reports
		s.log.Error("checking the ledger copies failed", "generation", s.ledgered.Generation, "err", err)
	}
}
