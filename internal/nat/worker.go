package nat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
)

// worker checks one switch: a pass whenever kicked, each call under its own
// deadline, so that this switch's trouble is nobody else's.
type worker struct {
	r      *Reconciler
	addr   string
	sw     Switch
	kickc  chan struct{}
	cancel context.CancelFunc // ends run

	mu sync.Mutex
	st SwitchStatus // guarded by mu
}

func newWorker(r *Reconciler, addr, foundBy string, sw Switch, cancel context.CancelFunc) *worker {
	return &worker{r: r, addr: addr, sw: sw, kickc: make(chan struct{}, 1), cancel: cancel, st: SwitchStatus{Address: addr, FoundBy: foundBy}}
}

func (w *worker) kick() {
	select {
	case w.kickc <- struct{}{}:
	default:
	}
}

// stop ends the worker: its pass in flight, if any, gives up.
func (w *worker) stop() { w.cancel() }

func (w *worker) setFoundBy(by string) {
	w.mu.Lock()
	w.st.FoundBy = by
	w.mu.Unlock()
}

func (w *worker) snapshot() SwitchStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.st
	s.Conflicts = append([]string(nil), s.Conflicts...)
	return s
}

// run makes passes when kicked, until ctx (the worker's own) ends.
func (w *worker) run(ctx context.Context) {
	defer w.cancel()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kickc:
		}
		err := w.pass(ctx)
		if ctx.Err() != nil {
			return
		}
		w.finish(err)
	}
}

// pass makes the switch hold exactly this sled's desired entries: it lists
// them, deletes those it owns (this sled's, in the services VPC) that are
// not wanted (or differ), then creates the missing ones. An entry refused
// because one not ours overlaps it is a conflict: reported, not
// overwritten.
func (w *worker) pass(ctx context.Context) error {
	want, ignored := desired(w.r.zones.RunningSpecs(), w.r.opts.Underlay)
	w.r.noteIgnored(ignored)
	var all []dpd.NatEntry
	err := w.call(ctx, func(ctx context.Context) (err error) { all, err = w.sw.AllNAT(ctx); return err })
	if err != nil {
		return fmt.Errorf("listing NAT entries: %w", err)
	}
	wanted := map[dpd.NatEntry]bool{}
	for _, e := range want {
		wanted[e] = true
	}
	held := map[dpd.NatEntry]bool{}
	var errs []error
	var kept []string
	unjudged := w.r.zones.Unmanaged()
	for _, e := range all {
		if !w.r.owned(e) {
			continue // another sled's, or outside the services VPC (an instance's)
		}
		if wanted[e] {
			held[e] = true
			continue
		}
		if len(unjudged) > 0 {
			// A zone no config judges may hold it (its external IP is
			// in the config that cannot be read).
			kept = append(kept, describe(e))
			continue
		}
		if err := w.call(ctx, func(ctx context.Context) error { return w.sw.DeleteNAT(ctx, e.External, e.Low) }); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", describe(e), err))
			continue
		}
		w.r.opts.Log.Info("NAT entry deleted", "switch", w.addr, "entry", describe(e))
	}
	var conflicts []string
	for _, e := range want {
		if held[e] {
			continue
		}
		err := w.call(ctx, func(ctx context.Context) error { return w.sw.CreateNAT(ctx, e) })
		switch {
		case errors.Is(err, dpd.ErrConflict):
			conflicts = append(conflicts, describe(e))
			w.r.opts.Log.Warn("NAT entry overlaps one not ours (another sled's or an instance's); not overwritten", "switch", w.addr, "entry", describe(e), "err", err)
		case err != nil:
			errs = append(errs, fmt.Errorf("creating %s: %w", describe(e), err))
		default:
			held[e] = true
			w.r.opts.Log.Info("NAT entry created", "switch", w.addr, "entry", describe(e))
		}
	}
	w.mu.Lock()
	if len(kept) > 0 && !slices.Equal(kept, w.st.Kept) {
		w.r.opts.Log.Warn("NAT entries no zone wants kept: zones run that no readable config judges", "switch", w.addr, "entries", kept, "zones", unjudged)
	}
	w.st.Desired, w.st.Present, w.st.Conflicts, w.st.Kept = len(want), len(held), conflicts, kept
	w.mu.Unlock()
	// Last, so that a switch that does not answer costs one deadline.
	w.identify(ctx)
	return errors.Join(errs...)
}

// identify learns the switch's slot, once.
func (w *worker) identify(ctx context.Context) {
	w.mu.Lock()
	known := w.st.Slot != nil
	w.mu.Unlock()
	if known {
		return
	}
	var ids dpd.SwitchIdentifiers
	if err := w.call(ctx, func(ctx context.Context) (err error) { ids, err = w.sw.SwitchIdentifiers(ctx); return err }); err != nil {
		return // dpd answers 503 until it knows; the next pass asks again
	}
	slot := ids.Slot
	w.mu.Lock()
	w.st.Slot = &slot
	w.mu.Unlock()
}

func (w *worker) call(ctx context.Context, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, w.r.opts.CallTimeout)
	defer cancel()
	return f(cctx)
}

func (w *worker) finish(err error) {
	now := time.Now()
	w.mu.Lock()
	w.st.Passes++
	if err != nil {
		w.st.Failures++
		w.st.LastError, w.st.LastErrorAt = err.Error(), &now
	} else {
		w.st.LastError = ""
		w.st.LastSuccess = &now
	}
	w.mu.Unlock()
	if err != nil {
		w.r.opts.Log.Warn("NAT reconciliation of a switch failed", "switch", w.addr, "err", err)
	}
}
