// Package vmm hosts VMMs: each is a zone oxz_propolis-server_<propolis id>
// running the VMM service (internal/vmm/propolis), created on the active zone
// runtime and followed by a monitor. The upstream agent waited without a
// deadline for a VM's service to come up, and hung for ever when the zone
// was deleted first. Here every wait has a deadline and checks that the
// zone still exists; a zone that disappears in any phase (before its
// service is up, while the guest starts, runs or stops) turns the VMM
// failed within a second, and its leftovers are removed.
package vmm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/reservoir"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Runtime is what the manager needs of the zone runtime.
type Runtime interface {
	Ensure(ctx context.Context, spec zone.Spec) error
	Destroy(ctx context.Context, name string) error
	List(ctx context.Context) ([]zone.Observed, error)
}

// Host makes a VMM zone's service reachable. With the Linux runtime the
// zone runs the service itself at its address (LinuxHost); with the sim
// runtime, whose zones run nothing, the service runs in the agent on
// loopback (InProcessHost).
type Host interface {
	// Start returns the host:port at which the service of VMM id, whose
	// zone serves at addr, answers, and a function that stops what Start
	// started. resume: the VMM was found running after a restart.
	Start(ctx context.Context, id string, addr netip.AddrPort, resume bool) (reach string, stop func(), err error)
}

// Claims is the sled's record of who holds which id and underlay address
// (internal/claims.Set): a VMM's id and propolis_addr are its, and no
// zone's.
type Claims interface {
	Claim(owner string, cs []claims.Claim) (undo func(), err error)
	ClaimFree(owner string, cs []claims.Claim) []*claims.ConflictError
	Release(owner string)
}

// Errors for decisions (the API maps them to 404 and 400/409).
var (
	ErrNotFound = errors.New("no such VMM")
	// ErrConflict: registered already with another address or instance.
	ErrConflict = errors.New("VMM registered with another configuration")
	// ErrCollision: the VMM's id or address is a zone's or the sled's.
	ErrCollision = errors.New("VMM collides with a zone or the sled")
	// ErrInvalid: a request the VMM cannot carry out in its state.
	ErrInvalid = errors.New("invalid request for the VMM's state")
	// ErrCapacity: the sled holds as many VMMs as it takes (MaxVMMs).
	ErrCapacity = errors.New("the sled takes no more VMMs")
	// ErrNotKnown: a registration of a VMM whose zone runs with no
	// readable record of it (unknown.go), or whose unregister is not
	// finished.
	ErrNotKnown = errors.New("VMM is not known")
)

// Options tune the manager. Zero values take the defaults.
type Options struct {
	// StartTimeout bounds bringing a VMM's zone up with its service (2m).
	StartTimeout time.Duration
	// PollWait is how long one long poll of the service waits, and so the
	// longest a vanished zone goes unnoticed without an event (500ms).
	PollWait time.Duration
	// StopGrace is how long a stop may take before the zone is torn down
	// anyway (10s).
	StopGrace time.Duration
	// ServiceLost is how long the service may be unreachable in a zone that
	// still exists before the VMM is failed (10s).
	ServiceLost time.Duration
	// CallTimeout bounds each call to the service and the runtime's
	// listings and teardowns (5s; teardowns 1m).
	CallTimeout time.Duration
	// HistoryLen is how many events each VMM keeps (32).
	HistoryLen int
	// MaxVMMs is how many VMMs the sled takes at once (512), whatever the
	// reservoir would admit: each holds its registration, a monitor and
	// a zone. A registration beyond it is ErrCapacity.
	MaxVMMs int
	// RecordDirs each keep a copy of every VMM's record (its registration
	// and state; store.go), so that a restarted agent adopts them (Resume);
	// none keeps nothing.
	RecordDirs []string
	// LegacyDir is where an earlier agent kept one plain file per VMM:
	// Resume rewrites those as records and removes them.
	LegacyDir string
	// Boot names this boot of the host; each record says the boot it was
	// written in. A VMM recorded in another boot lost its guest with the
	// host: Resume reports it failed and unregisters it (its zone's
	// leftovers torn down, its record removed), so that from then on it
	// is NO_SUCH_INSTANCE, as upstream's sled, which forgets its VMMs
	// when it reboots, answers. "" judges no record by its boot.
	Boot string
	// Sled is what a VMM's spec is checked against at registration: the
	// hardware threads a guest may have, and where its disks' files may
	// lie (the pools' local_storage datasets and the image directory).
	// Nil: nothing is checked but the spec's own rules.
	Sled func() spec.Sled
	// Identity is the sled's, for the instance properties a VMM's service
	// is given.
	Identity SledIdentity
	// Reservoir, if set, admits each VMM's guest memory: a VMM whose
	// memory is more than what is left of it is refused (ErrInvalid), and
	// it holds its memory until it is unregistered.
	Reservoir *reservoir.Account
	// Claims, if set, is where each VMM claims its id and address
	// (registering, resuming) and gives them up (once its zone is torn
	// down at unregister); a VMM colliding with a zone or the sled is
	// refused (ErrCollision).
	Claims Claims
	// States, if set, is told every change of a VMM's state, in order
	// (the agent tells Nexus), and when a VMM is unregistered.
	States States
	Log    *slog.Logger
}

// States is told of VMM state changes. Its methods must not block: they
// are called with the VMM's lock held, so that changes arrive in order.
type States interface {
	VMMState(id string, st RuntimeState)
	VMMForgotten(id string)
}

func (o *Options) setDefaults() {
	o.StartTimeout = cmp.Or(o.StartTimeout, 2*time.Minute)
	o.PollWait = cmp.Or(o.PollWait, 500*time.Millisecond)
	o.StopGrace = cmp.Or(o.StopGrace, 10*time.Second)
	o.ServiceLost = cmp.Or(o.ServiceLost, 10*time.Second)
	o.CallTimeout = cmp.Or(o.CallTimeout, 5*time.Second)
	o.HistoryLen = cmp.Or(o.HistoryLen, 32)
	o.MaxVMMs = cmp.Or(o.MaxVMMs, DefaultMaxVMMs)
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Registration is what PUT /vmms/{id} says of a VMM, with the whole body
// kept as it came.
type Registration struct {
	InstanceID   string
	PropolisAddr netip.AddrPort
	// Initial is the VMM runtime state the control plane registered it with.
	Initial RuntimeState
	// Body is the registration as sent, fields this agent does not act on
	// included.
	Body json.RawMessage
	// Guest is what Body says of the guest (ParseGuest); nil for a VMM
	// adopted from a record whose body has no spec this agent reads.
	Guest *Guest
}

// DefaultMaxVMMs is how many VMMs a sled takes unless told otherwise.
const DefaultMaxVMMs = 512

// MaxGen is the largest VMM generation: upstream's generations are bounded
// at i64::MAX. A registration above it is refused; at it, the generation
// stays (see setLocked).
const MaxGen = math.MaxInt64

// VMM states, upstream's VmmState.
const (
	StateStarting  = "starting"
	StateRunning   = "running"
	StateStopping  = "stopping"
	StateStopped   = "stopped"
	StateRebooting = "rebooting"
	StateMigrating = "migrating"
	StateFailed    = "failed"
	StateDestroyed = "destroyed"
)

// Request is a state a VMM is asked to reach, as upstream's
// VmmStateRequested without migration.
type Request string

const (
	// RequestRunning asks a starting guest to boot; a guest that runs or
	// reboots already has it.
	RequestRunning Request = "running"
	// RequestStopped asks the guest to stop for good.
	RequestStopped Request = "stopped"
	// RequestReboot asks a running guest to reboot.
	RequestReboot Request = "reboot"
)

// propolis is the request as the VMM service's API says it.
func (r Request) propolis() propolisapi.StateRequest {
	switch r {
	case RequestRunning:
		return propolisapi.RequestRun
	case RequestStopped:
		return propolisapi.RequestStop
	}
	return propolisapi.RequestReboot
}

// RuntimeState is upstream's VmmRuntimeState.
type RuntimeState struct {
	Gen         uint64    `json:"gen"`
	State       string    `json:"state" enum:"starting,running,stopping,stopped,rebooting,migrating,failed,destroyed"`
	TimeUpdated time.Time `json:"time_updated"`
}

// LogEntry is one line of a VMM's history.
type LogEntry struct {
	At     time.Time `json:"at"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
	// State is set on the lines that changed the VMM's state: the state
	// it then had (At is its time_updated).
	State *RuntimeState `json:"state,omitempty"`
}

// Info is a VMM as the manager reports it.
type Info struct {
	ID string `json:"propolis_id"`
	// Status is known for a VMM the agent holds a readable record of,
	// unknown for one it does not (Detail says why; unknown.go).
	Status       string          `json:"status" enum:"known,unknown" doc:"known: the agent holds a readable record of the VMM and manages it. unknown: its zone runs (or a record of it exists) but no record of it can be read; the agent leaves it as it is, detail says why, its vmm_state is empty, Nexus is answered 404 NO_SUCH_INSTANCE, and only sled-agent vmm remove-unknown removes it."`
	InstanceID   string          `json:"instance_id"`
	Zone         string          `json:"zone"`
	PropolisAddr string          `json:"propolis_addr"`
	ServiceAddr  string          `json:"service_addr,omitempty" doc:"Where the agent reaches the VMM's Propolis API once it is up: propolis_addr with the Linux runtime; with the sim runtime, the service run in the agent on loopback."`
	State        RuntimeState    `json:"vmm_state"`
	Detail       string          `json:"detail,omitempty"`
	History      []LogEntry      `json:"history"`
	Registration json.RawMessage `json:"registration"`
	// Disks are the files it has as disks, as judged at registration.
	Disks []DiskUse `json:"disks,omitempty" doc:"The files the VMM has as disks, as judged at registration: where each really is, and the path its spec names when that differs (a delegated zvol)."`
	// NotRealised are the components of its spec the guest does not get,
	// and why (spec.NotRealised).
	NotRealised []string `json:"not_realised,omitempty" doc:"The components of the VMM's spec its guest does not get on this sled, and why: each accepted and checked, and left out (a virtio socket, which upstream's Nexus gives every instance)."`
	// RecordCopies are the copies of the VMM's record as last read or
	// written (none when no record is kept).
	RecordCopies []RecordCopy `json:"record_copies,omitempty"`
}

// RecordCopy is one copy of a VMM's record.
type RecordCopy struct {
	Path       string `json:"path"`
	State      string `json:"state" enum:"ok,missing,corrupt,unreadable,stale,write_failed,not_durable" doc:"As the sled config's ledger copies'."`
	Generation uint64 `json:"generation,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Manager hosts the VMMs.
type Manager struct {
	rt   Runtime
	host Host
	opts Options
	ctx  context.Context // the monitors'; ends with Close
	stop context.CancelFunc
	wg   sync.WaitGroup

	registerMu sync.Mutex   // serialises Register, Unregister, adoptions and unknowns' changes
	owners     atomic.Int64 // numbers each VMM's claims owner
	refreshMu  sync.Mutex   // one refreshUnknown at a time
	listErr    atomic.Pointer[error]
	mu         sync.Mutex
	vmms       map[string]*vmm // guarded by mu; by propolis id
	// disks are the files VMMs have as disks: one writer or many readers.
	disks diskHolds
	// ending are the unregistered VMMs whose zone is not torn down or
	// whose record is not removed yet (finish). Guarded by mu.
	ending map[string]*vmm
	// unknown are the VMMs of which no record is readable. Guarded by mu.
	unknown map[string]*unknownVMM
	// gone numbers the VMMs whose zone and record went (goneLocked), so
	// that a zone listing made before does not make them unknown.
	gone    map[string]uint64 // guarded by mu
	goneSeq uint64            // guarded by mu
	listed  bool              // guarded by mu; VMM zones were listed once
}

// New returns a manager. Close stops its monitors (VMMs keep running).
func New(rt Runtime, host Host, opts Options) *Manager {
	opts.setDefaults()
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{rt: rt, host: host, opts: opts, ctx: ctx, stop: stop, vmms: map[string]*vmm{},
		ending: map[string]*vmm{}, unknown: map[string]*unknownVMM{}, gone: map[string]uint64{}}
}

// Close stops every monitor and waits for them. VMMs and their zones are
// left as they are: stopping the agent is not stopping the VMs.
func (m *Manager) Close() {
	m.stop()
	m.wg.Wait()
}

// Poke tells every monitor that a zone may have gone (runtime events). It
// never blocks.
func (m *Manager) Poke() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range m.vmms {
		v.poke()
	}
}

// Register makes VMM id known and starts bringing its zone up; it returns
// at once with the VMM's state. Registering the same VMM again returns its
// current state; with another address or instance it is ErrConflict.
func (m *Manager) Register(id string, reg Registration) (Info, error) {
	// Registrations one at a time (each writes a file); readers never wait
	// for them: m.mu is not held while the file is written.
	m.registerMu.Lock()
	defer m.registerMu.Unlock()
	m.mu.Lock()
	old, ok := m.vmms[id]
	held := len(m.vmms)
	m.mu.Unlock()
	if ok {
		if old.reg.PropolisAddr != reg.PropolisAddr || old.reg.InstanceID != reg.InstanceID {
			return Info{}, fmt.Errorf("%w: VMM %s serves at %s for instance %s", ErrConflict, id, old.reg.PropolisAddr, old.reg.InstanceID)
		}
		return old.info(), nil
	}
	if held >= m.opts.MaxVMMs {
		return Info{}, fmt.Errorf("%w: it holds %d VMMs, the most it takes; unregister one first", ErrCapacity, held)
	}
	m.mu.Lock()
	u, ending := m.unknown[id], m.ending[id] != nil
	m.mu.Unlock()
	switch {
	case u != nil:
		// Its zone may run a guest: the agent does not know, so it does
		// not make it again over what runs.
		return Info{}, fmt.Errorf("%w: VMM %s has no readable record (%s); remove it with sled-agent vmm remove-unknown first", ErrNotKnown, id, u.why)
	case ending:
		return Info{}, fmt.Errorf("%w: VMM %s is unregistered and its zone not yet torn down", ErrNotKnown, id)
	}
	led, err := m.openRecord(id)
	if err != nil {
		return Info{}, err
	}
	var recGen uint64
	if led != nil {
		// A record left where none is known (a record directory restored
		// since the last check): the new one goes above it.
		lr, _, err := led.Read()
		switch {
		case err == nil:
			recGen = lr.Generation
		case !errors.Is(err, ledger.ErrNotFound):
			return Info{}, fmt.Errorf("%w: VMM %s has a record that cannot be read: %w", ErrNotKnown, id, err)
		}
	}
	uses, err := m.admit(id, reg)
	if err != nil {
		return Info{}, err
	}
	v := newVMM(m, id, reg)
	v.led, v.recGen = led, recGen
	v.disks = uses
	if err := m.disks.take(v.owner, id, uses); err != nil {
		v.cancel()
		m.unreserve(id)
		return Info{}, err
	}
	undo, err := v.claim()
	if err != nil {
		m.disks.release(v.owner)
		v.cancel()
		m.unreserve(id)
		return Info{}, err
	}
	if err := v.save(); err != nil {
		undo()
		m.disks.release(v.owner)
		v.cancel()
		m.unreserve(id)
		return Info{}, err
	}
	m.mu.Lock()
	m.vmms[id] = v
	m.mu.Unlock()
	m.wg.Go(func() { v.monitor(v.ctx, false) })
	return v.info(), nil
}

// admit checks a new VMM's spec against the sled and takes its memory from
// the reservoir; a VMM the sled cannot host is ErrInvalid, saying why. It
// returns the files the VMM would have as disks, as judged.
func (m *Manager) admit(id string, reg Registration) ([]DiskUse, error) {
	g := reg.Guest
	if g == nil {
		return nil, fmt.Errorf("%w: no vmm_spec", ErrInvalid)
	}
	sled := m.guestSled(g)
	files, err := spec.CheckOpen(g.Spec, sled)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// The agent only judges the files, and knows them by device and inode
	// from now on; the VMM's service opens and judges them again, and
	// gives QEMU what it opened.
	uses := usesOf(g.Spec, files)
	files.Close()
	if r := m.opts.Reservoir; r != nil {
		if err := r.Reserve(id, g.MemoryBytes()); err != nil {
			return nil, fmt.Errorf("%w: board.memory_mb %d: %w", ErrInvalid, g.Spec.Board.MemoryMiB, err)
		}
	}
	return uses, nil
}

// guestSled is what g's spec is judged against: the sled's (Options.Sled),
// with g's NICs and delegated zvols.
func (m *Manager) guestSled(g *Guest) spec.Sled {
	sled := spec.Sled{Threads: 255}
	if m.opts.Sled != nil {
		sled = m.opts.Sled()
	}
	sled.NICs, sled.Zvols = g.NICs, g.Zvols
	return sled
}

// unreserve gives back what VMM id holds of the reservoir.
func (m *Manager) unreserve(id string) {
	if r := m.opts.Reservoir; r != nil {
		r.Release(id)
	}
}

// claims are what VMM v holds: its id and its address.
func (v *vmm) claims() []claims.Claim {
	holder := "VMM " + v.id
	return []claims.Claim{
		{Key: claims.ID(v.id), Holder: holder, As: "id"},
		{Key: claims.Addr(v.reg.PropolisAddr.Addr()), Holder: holder, As: "propolis_addr"},
	}
}

// claim takes v's id and address, or refuses v (ErrCollision) when a zone
// or the sled holds one of them.
func (v *vmm) claim() (undo func(), err error) {
	c := v.m.opts.Claims
	if c == nil {
		return func() {}, nil
	}
	undo, err = c.Claim(v.owner, v.claims())
	if err != nil {
		return nil, collisionError{err}
	}
	return undo, nil
}

// claimFree takes what is free of v's id and address for a VMM found at
// start; a collision (left by an agent that did not check) is reported.
func (v *vmm) claimFree() {
	if c := v.m.opts.Claims; c != nil {
		for _, ce := range c.ClaimFree(v.owner, v.claims()) {
			v.m.opts.Log.Error("a VMM found at start collides", "vmm", v.id, "err", ce)
			v.record("collides", ce.Error())
		}
	}
}

// release gives up what v holds: its id, its address and its disks'
// files.
func (v *vmm) release() {
	if c := v.m.opts.Claims; c != nil {
		c.Release(v.owner)
	}
	v.m.disks.release(v.owner)
}

// collisionError is an ErrCollision that reads as its cause alone, which
// names both sides.
type collisionError struct{ err error }

func (e collisionError) Error() string   { return e.err.Error() }
func (e collisionError) Unwrap() []error { return []error{ErrCollision, e.err} }

// Get returns VMM id's state.
func (m *Manager) Get(id string) (Info, error) {
	m.mu.Lock()
	v, ok := m.vmms[id]
	m.mu.Unlock()
	if !ok {
		return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return v.info(), nil
}

// Page returns at most limit VMMs whose ids sort after after, in id
// order, and whether more follow: our view lists a sled's VMMs in pages,
// so that no answer holds every registration at once. As List, it has the
// registered VMMs, the unregistered ones whose teardown is not finished,
// and the unknown ones.
func (m *Manager) Page(after string, limit int) (page []Info, more bool) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.vmms)+len(m.ending)+len(m.unknown))
	for _, set := range []map[string]*vmm{m.vmms, m.ending} {
		for id := range set {
			if id > after {
				ids = append(ids, id)
			}
		}
	}
	for id := range m.unknown {
		if id > after {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	more = len(ids) > limit
	ids = ids[:min(limit, len(ids))]
	vs := make([]*vmm, 0, len(ids))
	page = make([]Info, 0, len(ids))
	for _, id := range ids {
		switch {
		case m.vmms[id] != nil:
			vs = append(vs, m.vmms[id])
		case m.ending[id] != nil:
			vs = append(vs, m.ending[id])
		default:
			page = append(page, m.unknownInfo(m.unknown[id]))
		}
	}
	m.mu.Unlock()
	for _, v := range vs {
		page = append(page, v.info())
	}
	slices.SortFunc(page, func(a, b Info) int { return cmp.Compare(a.ID, b.ID) })
	return page, more
}

// List returns every VMM, sorted by id: the registered ones, the
// unregistered ones whose teardown is not finished, and the unknown ones.
func (m *Manager) List() []Info {
	m.mu.Lock()
	vs := make([]*vmm, 0, len(m.vmms)+len(m.ending))
	for _, v := range m.vmms {
		vs = append(vs, v)
	}
	for _, v := range m.ending {
		vs = append(vs, v)
	}
	out := make([]Info, 0, len(vs)+len(m.unknown))
	for _, u := range m.unknown {
		out = append(out, m.unknownInfo(u))
	}
	m.mu.Unlock()
	for _, v := range vs {
		out = append(out, v.info())
	}
	slices.SortFunc(out, func(a, b Info) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// RequestState asks VMM id's guest to run, stop or reboot. It returns once
// the service took the request, with the VMM's state then; changed is false
// when the request changed nothing.
func (m *Manager) RequestState(ctx context.Context, id string, r Request) (info Info, changed bool, err error) {
	m.mu.Lock()
	v, ok := m.vmms[id]
	m.mu.Unlock()
	if !ok {
		return Info{}, false, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return v.request(ctx, r)
}

// Unregister forgets VMM id, stops its monitor and tears its zone down.
// First it writes the record that says the VMM is unregistered and its zone
// to be torn down: a crash from then on leaves the next agent that record,
// and it finishes the teardown. The record is removed once the zone is
// gone. Forgetting wins over a state request or monitor update in flight:
// once that record is written nothing writes the VMM's record again, so a
// restart never brings an unregistered VMM back.
func (m *Manager) Unregister(ctx context.Context, id string) (Info, error) {
	m.mu.Lock()
	v, ok := m.vmms[id]
	m.mu.Unlock()
	if !ok {
		return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return m.unregister(ctx, v, true)
}

// endLost unregisters v, failed because its guest did not survive a host
// restart, as Unregister does but leaving it failed: Nexus is told failed
// (the guest died), not destroyed (a stop's end).
func (m *Manager) endLost(ctx context.Context, v *vmm) {
	if _, err := m.unregister(ctx, v, false); err != nil {
		m.opts.Log.Error("unregistering a VMM whose guest did not survive a host restart", "vmm", v.id, "err", err)
	}
}

// unregister unregisters v (Unregister); destroyed: it ends destroyed.
func (m *Manager) unregister(ctx context.Context, v *vmm, destroyed bool) (Info, error) {
	id := v.id
	m.registerMu.Lock()
	m.mu.Lock()
	cur := m.vmms[id]
	m.mu.Unlock()
	if cur != v {
		m.registerMu.Unlock()
		return Info{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err := v.markUnregistered(); err != nil {
		// Nothing written: still registered, as a restart would find it.
		m.registerMu.Unlock()
		return v.info(), fmt.Errorf("forgetting VMM %s: %w", id, err)
	}
	m.mu.Lock()
	delete(m.vmms, id)
	m.ending[id] = v
	m.mu.Unlock()
	m.registerMu.Unlock()
	v.cancel()
	<-v.done
	tellForgotten := func() { // with v.mu held, as States asks
		if st := m.opts.States; st != nil {
			st.VMMForgotten(id)
		}
	}
	if err := m.finish(ctx, v, true); err != nil {
		v.mu.Lock()
		tellForgotten()
		v.mu.Unlock()
		return v.info(), err
	}
	v.mu.Lock()
	if destroyed {
		v.setLocked(StateDestroyed, "unregistered; zone torn down", "unregistered")
	} else {
		v.recordLocked("unregistered", "zone torn down")
	}
	tellForgotten()
	v.mu.Unlock()
	return v.info(), nil
}
