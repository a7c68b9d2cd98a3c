package storage

import (
	"context"
	"time"
)

// DiskWatcher is what a Backend may also be: a source of hints that disks
// came or went (a kernel uevent, a file of a vdev dir, a sim fault). A hint
// carries nothing: the reconciler lists the disks again at once and gives
// every disk whose presence changed a pass at once, whatever backoff it was
// waiting out. Hints make hot-plug fast; the period keeps it correct (a
// hint lost, a watcher that could not start).
type DiskWatcher interface {
	// DiskEvents returns a channel that receives a value whenever the
	// disks may have changed, until ctx ends; one value may stand for many
	// events (the channel holds one, sends do not block). The channel is
	// closed once ctx has ended and the watcher has stopped. A watcher
	// that cannot watch (no permission) says so in its log and sends
	// nothing.
	DiskEvents(ctx context.Context) <-chan struct{}
}

// diskEvent asks for a listing started now: the disks whose presence it
// shows changed get their pass (presenceChanged).
func (r *Reconciler) diskEvent(ctx context.Context) {
	r.loop.seq++
	r.startList(ctx)
}

// presenceChanged compares a new listing with the last good one and gives
// every disk that came or went a pass at once. A pass in flight on a disk
// that went is abandoned (its call was for a disk that is not there; a hung
// one would otherwise hold the news back until its deadline), and the next
// pass, which says the disk is not found, needs no other listing.
func (r *Reconciler) presenceChanged(lr listResult) {
	l := &r.loop
	if !l.haveList {
		return
	}
	now := make(map[DiskIdentity]bool, len(lr.disks))
	for _, d := range lr.disks {
		now[d.Identity] = true
	}
	changed := func(id DiskIdentity, present bool) {
		if !present {
			// Back one day, it is a new disk: a pool on it that the
			// config does not name is closed again.
			delete(l.released, id)
		}
		e, ok := l.entries[id]
		if !ok {
			return
		}
		what := "disk arrived"
		if !present {
			what = "disk removed"
		}
		r.log.Info(what+": its pass starts now", "disk", id.String(), "busy", e.busy)
		e.attempts, e.retryAt = 0, time.Time{}
		switch {
		case e.busy && !present && e.cfg != nil:
			e.cancel()
			e.dirty, e.gone = true, lr.seq
		case e.busy:
			e.dirty = true
		case !e.wantPass:
			e.wantPass, e.needSeq = true, lr.seq
			l.scan = true
		}
	}
	for id := range l.disks {
		if !now[id] {
			changed(id, false)
		}
	}
	for id := range now {
		if _, ok := l.disks[id]; !ok {
			changed(id, true)
		}
	}
}
