package reconciler

import (
	"errors"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Gates hold a zone's start until something outside the zone reconciler is
// ready for it: its storage (the storage reconciler), synchronized time (the
// time-sync watcher). A held zone is waiting (StateWaiting) with the gate's
// reason, err with it in upstream's inventory, is looked at again at once
// when the gate says something changed, and otherwise on a backoff of its
// own (hold): waiting is not failing.

// Storage says whether a zone's storage is ready: its filesystem pool
// managed, its transient root and its durable dataset, if any, ensured. It
// is the storage reconciler (internal/storage) seen from here. It answers
// from published state and must not block.
type Storage interface {
	ZoneStorage(z *sledconfig.Zone) (zone.Storage, error)
}

// TimeSync says whether a zone may start as far as time goes: nil for a
// kind that does not need synchronized time, or once the sled's time is
// synchronized; else why not. It is the time-sync watcher
// (internal/timesync) seen from here. It answers from published state and
// must not block.
type TimeSync interface {
	ZoneTimeSync(z *sledconfig.Zone) error
}

// ErrStorageNotReady wraps what Storage says is missing, in a zone's error.
var ErrStorageNotReady = errors.New("storage not ready")

type storageError struct{ err error }

func (e storageError) Error() string   { return "storage not ready: " + e.err.Error() }
func (e storageError) Unwrap() []error { return []error{ErrStorageNotReady, e.err} }

// The gates, by name (entry.heldBy).
const (
	gateStorage  = "storage"
	gateTimeSync = "timesync"
)

// zoneStorage asks Storage, if set, where the zone's datasets are.
func (r *Reconciler) zoneStorage(spec *zone.Spec) (zone.Storage, error) {
	if r.opts.Storage == nil {
		return zone.Storage{}, nil
	}
	st, err := r.opts.Storage.ZoneStorage(&spec.Config)
	if err != nil {
		return zone.Storage{}, storageError{err}
	}
	return st, nil
}

// zoneTimeSync asks TimeSync, if set, whether the zone may start.
func (r *Reconciler) zoneTimeSync(spec *zone.Spec) error {
	if r.opts.TimeSync == nil {
		return nil
	}
	return r.opts.TimeSync.ZoneTimeSync(&spec.Config)
}

// StorageChanged tells the reconciler that storage readiness may have
// changed: zones waiting for their storage are looked at again at once,
// rather than at their next retry. It never blocks.
func (r *Reconciler) StorageChanged() { signal(r.storageChanged) }

// TimeSyncChanged tells the reconciler that time synchronization may have
// changed: zones waiting for it are looked at again at once. It never
// blocks.
func (r *Reconciler) TimeSyncChanged() { signal(r.timeSyncChanged) }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// retryHeld makes every zone whose last start the gate held back due now.
func (r *Reconciler) retryHeld(gate string) {
	l := &r.loop
	for name, e := range l.zones {
		if e.heldBy == gate && !e.busy {
			e.nextTry = time.Time{}
			delete(l.waiting, name)
			l.dirty[name] = struct{}{}
		}
	}
}
