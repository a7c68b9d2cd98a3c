package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm/service"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Inspector is a Runtime that can look at one zone without listing them all
// (the monitors look every PollWait).
type Inspector interface {
	Inspect(ctx context.Context, name string) (zone.Observed, bool, error)
}

// vmm is one VMM: its registration, what is known of it, and its monitor.
type vmm struct {
	m     *Manager
	id    string
	name  string
	owner string // of its claims: this registration's, not the next one's
	reg   Registration
	// recBoot is the host boot an adopted VMM's record was written in.
	recBoot string
	// shown is the registration as our view shows it (shownRegistration).
	shown  json.RawMessage
	disks  []DiskUse // the files it has as disks, held while it is registered
	pokec  chan struct{}
	ctx    context.Context // the monitor's
	cancel context.CancelFunc
	done   chan struct{} // closed when the monitor returns
	saveMu sync.Mutex    // orders writes of the VMM's record
	// The VMM's record (store.go), guarded by saveMu: its ledger (nil:
	// none kept), the generation and record last written, and what was
	// last logged about its copies.
	led            *ledger.Ledger
	recGen         uint64
	last           ledger.Record
	repairReported string
	// forgotten is set, under saveMu, once the record says the VMM is
	// unregistered: nothing writes it again.
	forgotten bool
	// finishSlot is held (capacity 1) while finish runs; tornDown, set
	// in it, once finish has torn the zone down (and given up what the
	// VMM held), finished once it has removed the record too.
	finishSlot chan struct{}
	tornDown   bool
	finished   bool

	mu       sync.Mutex
	state    RuntimeState        // guarded by mu
	detail   string              // guarded by mu
	history  []LogEntry          // guarded by mu
	client   *propolisapi.Client // guarded by mu; set once the service has the instance
	reach    string              // guarded by mu; where client reaches the service
	svcGen   uint64              // guarded by mu; the service's last gen seen
	watchErr error               // guarded by mu; the state monitor's last error
	pending  Request             // guarded by mu; asked before the service answered
	stopAt   time.Time           // guarded by mu; when a stop was asked
}

func newVMM(m *Manager, id string, reg Registration) *vmm {
	ctx, cancel := context.WithCancel(m.ctx)
	owner := fmt.Sprintf("vmm %s #%d", id, m.owners.Add(1))
	v := &vmm{m: m, id: id, name: zone.VMMNamePrefix + id, owner: owner, reg: reg, shown: shownRegistration(reg.Body), pokec: make(chan struct{}, 1), finishSlot: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	v.state = RuntimeState{Gen: min(max(reg.Initial.Gen, 1), MaxGen), State: StateStarting, TimeUpdated: time.Now()}
	v.detail = "zone being created"
	v.record("registered", fmt.Sprintf("service at %s", reg.PropolisAddr))
	return v
}

func (v *vmm) poke() {
	select {
	case v.pokec <- struct{}{}:
	default:
	}
}

// spec is the VMM's zone: the runtime creates it like any zone, with the
// VMM service as its image.
func (v *vmm) spec() zone.Spec {
	z := sledconfig.Zone{ID: v.id, ZoneType: sledconfig.ZoneType{Type: zone.VMMZoneType, Address: v.reg.PropolisAddr.String()}}
	return zone.Spec{Name: v.name, ID: v.id, Hash: "vmm:" + v.reg.PropolisAddr.String(), Config: z}
}

func (v *vmm) info() Info {
	// v.led is set before v is known to anyone, and never changes; its
	// Status does no I/O.
	var copies []RecordCopy
	if v.led != nil {
		for _, c := range v.led.Status() {
			copies = append(copies, RecordCopy{Path: c.Path, State: string(c.State), Generation: c.Generation, Error: c.Err})
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return Info{ID: v.id, Status: StatusKnown, InstanceID: v.reg.InstanceID, Zone: v.name, PropolisAddr: v.reg.PropolisAddr.String(), ServiceAddr: v.reach,
		State: v.state, Detail: v.detail, History: slices.Clone(v.history), Registration: v.shown, Disks: slices.Clone(v.disks), NotRealised: v.reg.Guest.NotRealised(), RecordCopies: copies}
}

// set moves the VMM to state with detail, recording event; the generation
// increases with every change.
func (v *vmm) set(state, detail, event string) {
	v.mu.Lock()
	v.setLocked(state, detail, event)
	v.mu.Unlock()
	v.saveOrLog()
}

// saveOrLog keeps the VMM's state; a failure is logged and recorded (the
// state in memory is right; a restarted agent would find an older one).
func (v *vmm) saveOrLog() {
	if err := v.save(); err != nil {
		v.m.opts.Log.Error("keeping a VMM's state", "vmm", v.id, "err", err)
		v.record("not kept", err.Error())
	}
}

// setLocked moves the VMM to state with detail and reports whether that
// changed anything. The generation goes up by one with every change, and
// stops at MaxGen: upstream's generations are bounded there (and its agent
// panics beyond); here the change is still made and reported, with the
// same generation, and the VMM's history says so.
func (v *vmm) setLocked(state, detail, event string) bool {
	if state == v.state.State && detail == v.detail {
		return false
	}
	if v.state.Gen < MaxGen {
		v.state.Gen++
	} else {
		v.state.Gen = MaxGen
		v.recordLocked("generation exhausted", fmt.Sprintf("vmm_state.gen is at its maximum %d: this change (%s) goes out with the same generation, which the control plane may ignore", MaxGen, state))
	}
	v.state.State, v.state.TimeUpdated, v.detail = state, time.Now(), detail
	v.recordLocked(event, detail)
	st := v.state
	last := &v.history[len(v.history)-1]
	last.At, last.State = st.TimeUpdated, &st
	if st := v.m.opts.States; st != nil {
		st.VMMState(v.id, v.state)
	}
	return true
}

func (v *vmm) record(event, detail string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.recordLocked(event, detail)
}

func (v *vmm) recordLocked(event, detail string) {
	if n := v.m.opts.HistoryLen; len(v.history) >= n {
		v.history = slices.Delete(v.history, 0, len(v.history)-n+1)
	}
	v.history = append(v.history, LogEntry{At: time.Now(), Event: event, Detail: detail})
}

// monitor brings the zone up (or, adopting a VMM found after a restart,
// checks that it is still there) and follows the guest until it stops,
// fails or the zone disappears, or until the monitor is cancelled
// (unregister, agent shutdown), which leaves the VMM as it is.
func (v *vmm) monitor(ctx context.Context, adopt bool) {
	defer close(v.done)
	opts := v.m.opts
	if adopt {
		if gone, why := v.zoneGone(ctx); gone {
			if b := opts.Boot; b != "" && v.recBoot != "" && v.recBoot != b {
				// The host restarted: its guest died with it. As
				// upstream's sled, which forgets its VMMs when it
				// reboots, the VMM is reported failed and then
				// unknown to this sled (unregistered, once this
				// monitor has returned).
				v.fail(fmt.Sprintf("the host restarted since its zone ran (boot %s, now %s): %s", v.recBoot, b, why))
				v.m.wg.Go(func() { v.m.endLost(v.m.ctx, v) })
				return
			}
			v.fail("zone gone while the agent was down: " + why)
			return
		}
	} else {
		ectx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
		err := v.m.rt.Ensure(ectx, v.spec())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			what := "zone did not come up"
			if errors.Is(err, zone.ErrGone) {
				what = "zone vanished before its service was up"
			}
			v.fail(fmt.Sprintf("%s: %v", what, err))
			return
		}
	}
	resume := adopt && v.guestState() == StateRunning
	reach, stopService, err := v.m.host.Start(ctx, v.id, v.reg.PropolisAddr, resume)
	if err != nil {
		v.fail(fmt.Sprintf("reaching its service: %v", err))
		return
	}
	defer stopService()
	client := propolisapi.NewClient(reach)
	client.Timeout = opts.CallTimeout
	if err := v.ensureInstance(ctx, client, resume); err != nil {
		if ctx.Err() == nil {
			v.fail(err.Error())
		}
		return
	}
	v.mu.Lock()
	v.client, v.reach = client, reach
	pending := v.pending
	v.mu.Unlock()
	v.record("service up", "at "+reach)
	if pending != "" {
		if _, _, err := v.request(ctx, pending); err != nil {
			v.record("request failed", fmt.Sprintf("%s: %v", pending, err))
		}
		v.mu.Lock()
		if v.pending == pending {
			v.pending = ""
		}
		v.mu.Unlock()
		v.saveOrLog()
	}
	v.follow(ctx, client)
}

// ensureInstance gives the VMM's service its instance (PUT /instance) unless
// it has one already (an adopted VMM whose service outlived the agent). A
// service that does not answer is asked again until ServiceLost has passed;
// a spec it refuses fails the VMM. resume: the guest ran before the agent
// restarted, and runs again if its service had to be made anew.
func (v *vmm) ensureInstance(ctx context.Context, c *propolisapi.Client, resume bool) error {
	opts := v.m.opts
	deadline := time.Now().Add(opts.ServiceLost)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		_, err := c.Get(ctx)
		if err == nil {
			return nil // the instance is there: the guest is the one followed
		}
		if errors.Is(err, propolisapi.ErrNoInstance) {
			err = v.ensure(ctx, c, resume)
			if err == nil {
				return nil
			}
			var api *propolisapi.APIError
			if errors.As(err, &api) && api.StatusCode < 500 {
				return fmt.Errorf("its service refused the instance: %v", err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its service did not take the instance within %s: %v", opts.ServiceLost, err)
		}
		v.pause(ctx, delay)
	}
}

// ensure sends the instance, and asks it to run if it ran before.
func (v *vmm) ensure(ctx context.Context, c *propolisapi.Client, resume bool) error {
	g := v.reg.Guest
	if g == nil {
		return errors.New("no instance spec is known for it (registered by an agent that kept none)")
	}
	body, err := g.serviceSpec(v.disks)
	if err != nil {
		return fmt.Errorf("preparing its instance spec: %w", err)
	}
	if err := c.Ensure(ctx, g.properties(v.reg.InstanceID, v.m.opts.Identity), body); err != nil {
		return err
	}
	v.record("instance created", "the VMM service has the instance spec")
	if resume {
		return c.PutState(ctx, propolisapi.RequestRun)
	}
	return nil
}

// follow tracks the guest through its service until the VMM ends: the
// service's state monitor in the background, the zone looked at every
// PollWait and at every poke.
func (v *vmm) follow(ctx context.Context, client *propolisapi.Client) {
	opts := v.m.opts
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan watchAnswer, 1)
	go v.watch(wctx, client, answers)
	tick := time.NewTicker(opts.PollWait)
	defer tick.Stop()
	lastAnswer := time.Now()
	for {
		if gone, why := v.zoneGone(ctx); gone {
			v.fail(fmt.Sprintf("zone vanished while the guest was %s: %s", v.guestState(), why))
			return
		}
		if v.stopOverdue() {
			v.forceStop(ctx)
			return
		}
		if v.guestState() == StateStopped {
			// Taken from the service by a request's answer rather than
			// by the watch: the zone goes all the same.
			v.finishStop(ctx, "guest stopped")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-v.pokec:
		case <-tick.C:
			if time.Since(lastAnswer) > opts.ServiceLost {
				v.fail(fmt.Sprintf("its service has not answered for %s: %v", opts.ServiceLost, v.lastWatchError()))
				return
			}
		case a := <-answers:
			if a.err != nil {
				continue
			}
			lastAnswer = time.Now()
			if a.alive {
				continue
			}
			switch state, _ := v.observe(a.st); state {
			case StateStopped:
				v.finishStop(ctx, "guest stopped")
				return
			case StateFailed:
				v.fail("the guest failed: " + a.st.Detail)
				return
			}
		}
	}
}

// watchAnswer is one answer of the service's state monitor, or why there
// was none; alive is an answer that says only that the service answers.
type watchAnswer struct {
	st    propolisapi.Status
	alive bool
	err   error
}

// watch long-polls the service's state monitor until ctx ends, handing
// every answer to follow. The service holds a poll until its state changes
// (or its own bound): a poll that nothing answered within half of
// ServiceLost is ended, and the service asked whether it answers at all
// (GET /instance), so that a quiet guest is not taken for a lost service.
func (v *vmm) watch(ctx context.Context, c *propolisapi.Client, out chan<- watchAnswer) {
	opts := v.m.opts
	for delay := 50 * time.Millisecond; ctx.Err() == nil; {
		v.mu.Lock()
		after := v.svcGen
		v.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, opts.ServiceLost/2)
		st, err := c.StateMonitor(pctx, after+1)
		quiet := err != nil && ctx.Err() == nil && pctx.Err() != nil
		cancel()
		var alive bool
		if quiet {
			gctx, cancel := context.WithTimeout(ctx, opts.CallTimeout)
			_, err = c.Get(gctx)
			cancel()
			alive = err == nil
		}
		v.mu.Lock()
		v.watchErr = err
		v.mu.Unlock()
		select {
		case out <- watchAnswer{st: st, alive: alive, err: err}:
		case <-ctx.Done():
			return
		}
		if err == nil {
			delay = 50 * time.Millisecond
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

func (v *vmm) lastWatchError() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.watchErr
}

func (v *vmm) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-v.pokec:
		v.poke() // the next look at the zone is now
	case <-t.C:
	}
}

// zoneGone reports whether the VMM's zone no longer exists, and why.
func (v *vmm) zoneGone(ctx context.Context) (bool, string) {
	cctx, cancel := context.WithTimeout(ctx, v.m.opts.CallTimeout)
	defer cancel()
	// A zone that exists but is no longer whole (its namespace deleted, its
	// service's process dead) has lost its guest as surely as one that is
	// gone.
	verdict := func(o zone.Observed, exists bool) (bool, string) {
		switch {
		case !exists:
			return true, "it no longer exists"
		case !o.Running:
			return true, "it is broken: " + o.Detail
		}
		return false, ""
	}
	if in, ok := v.m.rt.(Inspector); ok {
		o, exists, err := in.Inspect(cctx, v.name)
		if err != nil {
			return false, "" // cannot tell: look again next time
		}
		return verdict(o, exists)
	}
	obs, err := v.m.rt.List(cctx)
	if err != nil {
		return false, ""
	}
	for _, o := range obs {
		if o.Name == v.name {
			return verdict(o, true)
		}
	}
	return verdict(zone.Observed{}, false)
}

func (v *vmm) guestState() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state.State
}

// vmmState is upstream's VmmState for the service's InstanceState, as
// upstream's sled agent maps it (omicron sled-agent/src/common/instance.rs),
// except that a guest the service reports stopped or destroyed reads
// "stopped" (upstream: "stopping", then "destroyed") until its zone is torn
// down: "destroyed" means nothing of the VMM is left, and this agent
// reports each step.
func vmmState(s propolisapi.InstanceState) string {
	switch s {
	case propolisapi.StateCreating, propolisapi.StateStarting:
		return StateStarting
	case propolisapi.StateRunning, propolisapi.StateRepairing:
		return StateRunning
	case propolisapi.StateStopping:
		return StateStopping
	case propolisapi.StateStopped:
		return StateStopped
	case propolisapi.StateRebooting:
		return StateRebooting
	case propolisapi.StateMigrating:
		return StateMigrating
	case propolisapi.StateDestroyed:
		return StateStopped // destroyed once its zone is torn down (finishStop)
	}
	return StateFailed
}

// observe takes the service's status as the VMM's and returns its state,
// and whether that changed the VMM's.
func (v *vmm) observe(st propolisapi.Status) (string, bool) {
	v.mu.Lock()
	if st.Gen < v.svcGen || (st.Gen == v.svcGen && v.svcGen != 0) {
		cur := v.state.State // an answer no newer than one already taken
		v.mu.Unlock()
		return cur, false
	}
	v.svcGen = st.Gen
	state := vmmState(st.State)
	detail := st.Detail
	if detail == "" {
		detail = "its service says " + string(st.State)
	}
	changed := v.setLocked(state, detail, "guest "+state)
	v.mu.Unlock()
	if changed {
		v.saveOrLog()
	}
	return state, changed
}

// request hands r to the service, or keeps it until the service answers.
func (v *vmm) request(ctx context.Context, r Request) (Info, bool, error) {
	v.mu.Lock()
	state, detail, client := v.state.State, v.detail, v.client
	switch {
	case state == StateFailed || state == StateDestroyed:
		v.mu.Unlock()
		return Info{}, false, fmt.Errorf("%w: the VMM is %s (%s)", ErrInvalid, state, detail)
	case r == RequestReboot && state != StateRunning && state != StateRebooting:
		// Refused here whether or not the service is up yet, so that the
		// answer names the VMM's state rather than depending on a race
		// with the service's start (which refuses it too, in its words).
		v.mu.Unlock()
		return Info{}, false, fmt.Errorf("%w: the VMM is %s and cannot reboot", ErrInvalid, state)
	case client == nil:
		changed := v.pending != r
		v.pending = r
		if r == RequestStopped && v.stopAt.IsZero() {
			v.stopAt = time.Now()
		}
		v.recordLocked("requested", string(r)+" (once its service is up)")
		v.mu.Unlock()
		if changed {
			// Kept with the VMM, so that an agent restart loses no
			// request it answered.
			if err := v.save(); err != nil {
				return Info{}, false, fmt.Errorf("keeping the request: %w", err)
			}
		}
		return v.info(), changed, nil
	}
	gen := v.state.Gen
	newStop := r == RequestStopped && v.stopAt.IsZero()
	if newStop {
		v.stopAt = time.Now()
	}
	v.mu.Unlock()
	if newStop {
		// Kept before the service is asked: a restarted agent forces a
		// stop the guest ignores, as this one would.
		if err := v.save(); err != nil {
			return Info{}, false, fmt.Errorf("keeping the request: %w", err)
		}
	}
	err := client.PutState(ctx, r.propolis())
	if errors.Is(err, propolisapi.ErrInvalidTransition) {
		return Info{}, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err != nil {
		return Info{}, false, fmt.Errorf("asking the VMM's service to %s: %w", r, err)
	}
	v.record("requested", string(r))
	// The status the request led to, if it changed one: the service took
	// the request before it answered, so its state monitor answers at
	// once with a newer status (whose generation orders it with the
	// watch's); a request that changed nothing leaves it waiting, and
	// requestSettle ends the wait.
	v.mu.Lock()
	after := v.svcGen
	v.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, requestSettle)
	if st, err := client.StateMonitor(sctx, after+1); err == nil {
		v.observe(st)
		v.poke() // the monitor looks at what it led to
	}
	cancel()
	info := v.info()
	return info, info.State.Gen != gen, nil
}

// requestSettle is how long a state request looks for the status it led
// to: a request that changed nothing waits this long.
const requestSettle = 250 * time.Millisecond

// stopOverdue reports whether a stop has taken longer than StopGrace.
func (v *vmm) stopOverdue() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return !v.stopAt.IsZero() && time.Since(v.stopAt) > v.m.opts.StopGrace && v.state.State != StateStopped
}

// forceStop tears down a VMM whose stop did not finish in time.
func (v *vmm) forceStop(ctx context.Context) {
	v.record("stop overdue", fmt.Sprintf("not stopped within %s: tearing the zone down", v.m.opts.StopGrace))
	v.finishStop(ctx, fmt.Sprintf("stop forced after %s", v.m.opts.StopGrace))
}

// finishStop tears the zone of a stopped VMM down.
func (v *vmm) finishStop(ctx context.Context, why string) {
	if err := v.teardown(ctx); err != nil {
		v.set(StateFailed, fmt.Sprintf("%s, but tearing its zone down failed: %v", why, err), "teardown failed")
		return
	}
	v.set(StateDestroyed, why+"; zone torn down", "destroyed")
}

// fail marks the VMM failed and removes what is left of its zone.
func (v *vmm) fail(why string) {
	v.set(StateFailed, why, "failed")
	v.m.opts.Log.Warn("VMM failed", "vmm", v.id, "why", why)
	if err := v.teardown(v.m.ctx); err != nil {
		v.record("cleanup failed", err.Error())
		return
	}
	v.record("cleaned up", "what was left of its zone is removed")
}

// teardown destroys the VMM's zone, under a deadline.
func (v *vmm) teardown(ctx context.Context) error {
	if ctx.Err() != nil {
		ctx = context.Background() // unregistering after Close: still bounded below
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return v.m.rt.Destroy(dctx, v.name)
}

// LinuxHost is the Host of the Linux runtime: the zone runs the service.
type LinuxHost struct{}

// Start returns the zone's own address: the zone's service, which outlives
// the agent, resumes by itself.
func (LinuxHost) Start(ctx context.Context, id string, addr netip.AddrPort, resume bool) (string, func(), error) {
	return addr.String(), func() {}, nil
}

// InProcessHost is the Host of the sim runtime: the VMM service runs in
// the agent, on loopback, with a simulated guest (internal/vmm/simguest)
// whose timings are in Options.
type InProcessHost struct {
	Options simguest.Options
	// Sled, if set, is what the service checks a spec against, as the
	// service in a zone checks it against what the agent told it (the
	// agent has checked it already).
	Sled func() spec.Sled
}

// Start serves VMM id's service on a loopback port until stop; resume
// leaves its guest running once it has its instance (the agent's service
// died with the last agent, the guest with it).
func (h InProcessHost) Start(ctx context.Context, id string, addr netip.AddrPort, resume bool) (string, func(), error) {
	health, err := service.Health(id)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	opts := h.Options
	opts.Running = resume
	if h.Sled != nil {
		opts.Sled = h.Sled()
		opts.Sled.NICs = nil // from the spec's vnic_names, as a zone's service finds them
	}
	if opts.Sled.Threads == 0 {
		opts.Sled.Threads = 255
	}
	guest := simguest.New(opts)
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		service.Serve(sctx, ln, guest, health, nil)
	}()
	return ln.Addr().String(), func() { cancel(); <-done; guest.Close() }, nil
}
