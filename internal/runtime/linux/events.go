package linux

import (
	"context"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// SetNotify sets the function called when a zone may have died. Set it
// before the first Ensure.
func (r *Runtime) SetNotify(f func()) {
	r.mu.Lock()
	r.opts.Notify = f
	r.mu.Unlock()
}

func (r *Runtime) notify() {
	r.mu.Lock()
	f := r.opts.Notify
	r.mu.Unlock()
	if f != nil {
		f()
	}
}

// Watch reports zones dying until ctx ends: the deletion of a zone's
// namespace or of one of its links, as the kernel tells it. Supervisors
// exiting are watched per zone from Ensure. The reconciler's periodic relist
// catches whatever an event misses.
//
// When Watch returns, the per-zone supervisor watchers stop too: whoever
// ran it (the agent) is going away.
func (r *Runtime) Watch(ctx context.Context) error {
	defer r.stopAllWatching()
	return zonenet.Watch(ctx, r.opts.NetnsPrefix+sledconfig.ZoneNamePrefix, r.opts.Tag, func(ev zonenet.Event) {
		switch ev.Kind {
		case zonenet.EventNetnsDeleted, zonenet.EventLinkDeleted:
			r.opts.Log.Info("zone part deleted", "kind", ev.Kind, "name", ev.Name, "zone_id", ev.ZoneID)
		case zonenet.EventResync:
			r.opts.Log.Warn("zone events were lost; relisting")
		default:
			return
		}
		r.notify()
	})
}

func (r *Runtime) stopAllWatching() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, w := range r.watchers {
		w.cancel()
		delete(r.watchers, name)
	}
}
