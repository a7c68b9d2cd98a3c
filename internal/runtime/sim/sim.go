// Package sim is an in-memory zone runtime with fault injection, for tests and
// the development mode. Zones are records in a map; starting one takes a
// configurable time; faults make starts or stops hang, fail or take long, and
// make running zones vanish as if deleted behind the agent's back. It is also
// the storage reconciler's simulated machine (storage.go): disks, their pools
// and datasets, with faults of their own.
package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// ErrInjected is the error of a "fail" fault.
var ErrInjected = errors.New("injected fault")

// Call is one runtime call, as recorded.
type Call struct {
	Op   string // "ensure", "destroy", "list"; storage's: "disks", "create_pool", …
	Zone string // zone name; empty for list and storage calls
	// Target is what a storage call is about: a pool or dataset name.
	Target string
}

// Options tune the runtime.
type Options struct {
	// StartDelay returns how long a zone's service takes to come up when no
	// fault says otherwise (nil: at once).
	StartDelay func(spec zone.Spec) time.Duration
	// RecordCalls keeps a transcript of calls for Calls (tests).
	RecordCalls bool
	// StateFile, if set, keeps the simulated OS in this file, so that it
	// outlives the agent (see Open).
	StateFile string
}

// Runtime is the simulated runtime. It is safe for concurrent use; no lock is
// held while a call waits.
type Runtime struct {
	opts Options

	mu         sync.Mutex
	zones      map[string]*simZone               // guarded by mu; by zone name
	faults     map[string]zoneFaults             // guarded by mu; by zone id
	timeHeld   bool                              // guarded by mu: the NTP zones are held unsynchronized
	diskFaults map[string]diskFaults             // guarded by mu; by disk serial
	diskWatch  []chan struct{}                   // guarded by mu; DiskEvents' channels
	disks      map[storage.DiskIdentity]*simDisk // guarded by mu
	pools      map[string]*simPool               // guarded by mu; by pool id
	// listing is Disks' answer as last made, valid while listed: made
	// again only after disks, pools or faults change (listingChangedLocked).
	listing     []storage.Disk // guarded by mu
	listed      bool           // guarded by mu
	calls       []Call         // guarded by mu
	notify      func()         // guarded by mu
	incarnation uint64         // guarded by mu
	leftovers   []Leftover     // guarded by mu
	version     uint64         // guarded by mu; counts changes to what is saved

	saveMu sync.Mutex // orders writes of the state file
	saved  uint64     // guarded by saveMu; the version last written
}

type simZone struct {
	name, id, hash string
	running        bool
	startedAt      time.Time
	incarnation    uint64
	gone           chan struct{} // closed when the zone is removed
	vanish         *time.Timer
}

// New returns an empty simulated runtime that keeps no state file (Open
// reads and keeps one).
func New(opts Options) *Runtime {
	return &Runtime{opts: opts, zones: map[string]*simZone{}, faults: map[string]zoneFaults{},
		diskFaults: map[string]diskFaults{}, disks: map[storage.DiskIdentity]*simDisk{}, pools: map[string]*simPool{}}
}

// SetFaults replaces the whole fault map. An invalid map changes nothing.
func (r *Runtime) SetFaults(f Faults) error {
	c, err := f.compile()
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if presenceChanged(r.diskFaults, c.disks) {
		r.diskEventLocked()
	}
	r.faults, r.diskFaults = c.zones, c.disks
	r.listingChangedLocked()
	r.timeHeld = f.TimeSync != nil && f.TimeSync.Synced != nil && !*f.TimeSync.Synced
	// Running zones follow the new map too: a zone running for longer than
	// its new vanish_after vanishes now.
	for _, z := range r.zones {
		if z.vanish != nil {
			z.vanish.Stop()
			z.vanish = nil
		}
		if f := c.zones[z.id]; z.running && f.vanishAfter > 0 {
			r.scheduleVanishLocked(z, f.vanishAfter)
		}
	}
	return nil
}

// scheduleVanishLocked makes z vanish d after it started.
func (r *Runtime) scheduleVanishLocked(z *simZone, d time.Duration) {
	z.vanish = time.AfterFunc(max(time.Until(z.startedAt.Add(d)), 0), func() { r.vanish(z) })
}

// SetNotify sets a function called (without locks held) whenever a zone
// disappears on its own, like an OS event. The reconciler's Poke fits.
func (r *Runtime) SetNotify(f func()) {
	r.mu.Lock()
	r.notify = f
	r.mu.Unlock()
}

// Calls returns the recorded transcript (Options.RecordCalls).
func (r *Runtime) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *Runtime) recordLocked(op, name string) {
	if r.opts.RecordCalls {
		r.calls = append(r.calls, Call{Op: op, Zone: name})
	}
}

// Ensure creates the zone (if it does not exist) and waits for its service.
func (r *Runtime) Ensure(ctx context.Context, spec zone.Spec) error {
	r.mu.Lock()
	r.recordLocked("ensure", spec.Name)
	f := r.faults[spec.ID]
	z := r.zones[spec.Name]
	if z != nil && z.hash != spec.Hash {
		r.mu.Unlock()
		return fmt.Errorf("zone %s exists with another config", spec.Name)
	}
	if z != nil && z.running {
		r.mu.Unlock()
		return r.waitHealthy(ctx, spec, z)
	}
	if z == nil {
		r.incarnation++
		z = &simZone{name: spec.Name, id: spec.ID, hash: spec.Hash, incarnation: r.incarnation, gone: make(chan struct{})}
		r.zones[spec.Name] = z
		r.changedLocked()
	}
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		return err
	}

	// Wait for the service to come up, noticing the zone vanishing meanwhile.
	if err := r.behave(ctx, "start", f.start, z.gone, spec.Name, func() time.Duration {
		if r.opts.StartDelay == nil {
			return 0
		}
		return r.opts.StartDelay(spec)
	}); err != nil {
		return err
	}

	r.mu.Lock()
	if cur := r.zones[spec.Name]; cur != z {
		r.mu.Unlock()
		return &zone.GoneError{Name: spec.Name, Reason: "deleted while its service was starting"}
	}
	z.running = true
	z.startedAt = time.Now()
	r.changedLocked()
	if f := r.faults[spec.ID]; f.vanishAfter > 0 {
		r.scheduleVanishLocked(z, f.vanishAfter)
	}
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		return err
	}
	return r.waitHealthy(ctx, spec, z)
}

// waitHealthy waits, as a real runtime's readiness wait does, until the
// zone's service answers: at once, unless a health fault says it does not.
// The fault map is looked at again every healthPoll, so clearing the fault
// ends the wait.
func (r *Runtime) waitHealthy(ctx context.Context, spec zone.Spec, z *simZone) error {
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		err := r.Healthy(hctx, spec)
		cancel()
		if err == nil || errors.Is(err, zone.ErrGone) {
			return err
		}
		zone.ReportProgress(ctx, "waiting for its service to answer: "+err.Error())
		t := time.NewTimer(healthPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("zone %s not ready: %v: %w", spec.Name, err, ctx.Err())
		case <-z.gone:
			t.Stop()
			return &zone.GoneError{Name: spec.Name, Reason: "deleted while its service was starting"}
		case <-t.C:
		}
	}
}

// healthPoll is how often a readiness wait checks again.
const healthPoll = 100 * time.Millisecond

// doing names an operation in progress, for progress reports.
var doing = map[string]string{"start": "starting", "stop": "stopping"}

// behave applies one fault behaviour (or the default delay) to a call, op
// ("start" or "stop"), and says what it is doing through ctx's progress
// reporter, as a real runtime would.
func (r *Runtime) behave(ctx context.Context, op string, b behavior, gone <-chan struct{}, name string, defaultDelay func() time.Duration) error {
	switch {
	case b.fail:
		return fmt.Errorf("zone %s: %w", name, ErrInjected)
	case b.hang:
		zone.ReportProgress(ctx, op+" hangs (sim fault)")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-gone:
			return &zone.GoneError{Name: name, Reason: "deleted while its service was starting"}
		}
	}
	d := b.delay
	if d == 0 {
		d = defaultDelay()
	}
	if d <= 0 {
		return nil
	}
	zone.ReportProgress(ctx, fmt.Sprintf("%s (simulated delay %v)", doing[op], d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-gone:
		return &zone.GoneError{Name: name, Reason: "deleted while its service was starting"}
	case <-t.C:
		return nil
	}
}

// vanish removes z if it is still the current incarnation, as if somebody
// deleted the zone behind the agent's back.
func (r *Runtime) vanish(z *simZone) {
	r.mu.Lock()
	cur := r.zones[z.name]
	if cur == z {
		r.removeLocked(z)
	}
	notify := r.notify
	r.mu.Unlock()
	r.persist() // best effort: nobody waits for a vanishing
	if cur == z && notify != nil {
		notify()
	}
}

// Vanish deletes a zone behind the agent's back (tests, debugging). It
// reports whether the zone existed.
func (r *Runtime) Vanish(name string) bool {
	r.mu.Lock()
	z := r.zones[name]
	r.mu.Unlock()
	if z == nil {
		return false
	}
	r.vanish(z)
	return true
}

func (r *Runtime) removeLocked(z *simZone) {
	delete(r.zones, z.name)
	r.changedLocked()
	if z.vanish != nil {
		z.vanish.Stop()
	}
	close(z.gone)
}

// Destroy removes a zone; a zone that does not exist is not an error.
func (r *Runtime) Destroy(ctx context.Context, name string) error {
	r.mu.Lock()
	r.recordLocked("destroy", name)
	z := r.zones[name]
	var f zoneFaults
	if z != nil {
		f = r.faults[z.id]
	}
	r.mu.Unlock()
	if z != nil {
		if err := r.behave(ctx, "stop", f.stop, nil, name, func() time.Duration { return 0 }); err != nil {
			return err
		}
	}
	r.mu.Lock()
	if z != nil && r.zones[name] == z {
		r.removeLocked(z)
	}
	r.removeLeftoversLocked(name)
	r.mu.Unlock()
	return r.persist()
}

// Names returns the names of the zones that begin with prefix.
func (r *Runtime) Names(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for name := range r.zones {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out, nil
}

// Inspect looks at one zone.
func (r *Runtime) Inspect(ctx context.Context, name string) (zone.Observed, bool, error) {
	if err := ctx.Err(); err != nil {
		return zone.Observed{}, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	z, ok := r.zones[name]
	if !ok {
		return zone.Observed{}, false, nil
	}
	return zone.Observed{Name: z.name, ID: z.id, Hash: z.hash, Running: z.running}, true, nil
}

// List returns every zone.
func (r *Runtime) List(ctx context.Context) ([]zone.Observed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked("list", "")
	out := make([]zone.Observed, 0, len(r.zones))
	for _, z := range r.zones {
		o := zone.Observed{Name: z.name, ID: z.id, Hash: z.hash, Running: z.running}
		if !z.running {
			o.Detail = "service not up"
		}
		out = append(out, o)
	}
	return out, nil
}

// Healthy reports whether the zone's simulated service answers: it does when
// the zone exists and runs, unless a health fault says otherwise.
func (r *Runtime) Healthy(ctx context.Context, spec zone.Spec) error {
	r.mu.Lock()
	z := r.zones[spec.Name]
	f := r.faults[spec.ID].health
	r.mu.Unlock()
	switch {
	case z == nil:
		return &zone.GoneError{Name: spec.Name, Reason: "it does not exist"}
	case !z.running:
		return fmt.Errorf("zone %s: service not up", spec.Name)
	case f.fail:
		return fmt.Errorf("zone %s: health check: %w", spec.Name, ErrInjected)
	case f.hang:
		select {
		case <-ctx.Done():
			return fmt.Errorf("zone %s: health check did not answer: %w", spec.Name, ctx.Err())
		case <-z.gone:
			return &zone.GoneError{Name: spec.Name, Reason: "deleted during its health check"}
		}
	}
	return nil
}
