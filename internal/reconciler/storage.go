package reconciler

import (
	"errors"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Storage says whether a zone's storage is ready: its filesystem pool
// managed, its transient root and its durable dataset, if any, ensured. It
// is the storage reconciler (internal/storage) seen from here. It answers
// from published state and must not block.
type Storage interface {
	ZoneStorage(z *sledconfig.Zone) (zone.Storage, error)
}

// ErrStorageNotReady wraps what Storage says is missing, in a zone's error.
var ErrStorageNotReady = errors.New("storage not ready")

type storageError struct{ err error }

func (e storageError) Error() string   { return "storage not ready: " + e.err.Error() }
func (e storageError) Unwrap() []error { return []error{ErrStorageNotReady, e.err} }

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

// StorageChanged tells the reconciler that storage readiness may have
// changed: zones waiting for their storage are looked at again at once,
// rather than at their next retry. It never blocks.
func (r *Reconciler) StorageChanged() {
	select {
	case r.storageChanged <- struct{}{}:
	default:
	}
}

// gateStorage is the gate of a zone's storage.
const gateStorage = "storage"

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
