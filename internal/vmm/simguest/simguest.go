// Package simguest is a simulated guest behind the propolis API: a
// propolisapi.Backend that checks its instance spec as a real VMM service
// does, then boots, runs, reboots and stops on request after set delays,
// with a serial console that shows a few boot lines and echoes input.
//
//	Creating   ensured, waiting to be asked to run
//	Starting   asked to run: booting, for BootTime
//	Running    booted (its console has the READY line)
//	Rebooting  asked to reboot, for RebootTime, then Running again
//	Stopping   asked to stop, for StopTime
//	Stopped    halted; at once Destroyed, as propolis destroys a halted VM
//	Destroyed  final; its console is closed
//
// Requests are taken and refused as upstream's request queue does: a stop
// interrupts a boot or a reboot, a request already in hand is a no-op, and a
// halted guest only takes a stop, as a no-op.
package simguest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// Default durations of the simulated guest's transitions.
const (
	DefaultBootTime   = 500 * time.Millisecond
	DefaultStopTime   = 300 * time.Millisecond
	DefaultRebootTime = 500 * time.Millisecond
)

// Options set a simulated guest up. A duration that is zero or negative
// means its default.
type Options struct {
	BootTime   time.Duration // Starting → Running
	StopTime   time.Duration // Stopping → Stopped
	RebootTime time.Duration // Rebooting → Running
	// Sled is what a spec is checked against. With a nil NICs map, each
	// virtio NIC's MAC is taken from its backend's vnic_name
	// (spec.NICsOf), as the VMM service in a zone does.
	Sled spec.Sled
	// Running makes Ensure leave the guest Running, as one found running:
	// the agent's in-process service resumes so a VMM it adopts after a
	// restart.
	Running bool
	// Attach, if set, gives the guest its NICs' network when it is made,
	// as QEMU makes its taps (a stand-in guest, internal/vmm/standin): it
	// is called with every virtio NIC's tap name (its backend's
	// vnic_name) and MAC, outside the guest's lock, and the detach it
	// returns once the guest halts or is closed; what it says of the
	// network (note) the guest prints on its console as it boots.
	Attach func(ctx context.Context, nics []NIC) (detach func(), note string, err error)
	Log    *slog.Logger
}

// NIC is a guest NIC's tap name and MAC, for Options.Attach.
type NIC struct {
	Tap string
	MAC net.HardwareAddr
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.BootTime, DefaultBootTime)
	def(&o.StopTime, DefaultStopTime)
	def(&o.RebootTime, DefaultRebootTime)
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Details the guest reports with its states.
const (
	detailWaiting   = "waiting for a request to run"
	detailBooting   = "booting"
	detailRunning   = "the guest runs"
	detailResumed   = "the guest was found running"
	detailRebooting = "rebooting"
	detailStopped   = "the guest halted"
	detailDestroyed = "the guest is halted and gone"
)

// Guest is one simulated guest. Transitions that take time end on timers,
// so tests drive it with testing/synctest. It is safe for concurrent use.
//
// Lock order: Guest.mu, then the console Buffer's own lock (output is
// appended under mu, so that a state is never seen before the output that
// leads to it).
type Guest struct {
	opts    Options
	console *propolisapi.Buffer

	mu sync.Mutex
	// The fields below are guarded by mu.
	ensured bool
	props   propolisapi.Properties
	raw     json.RawMessage
	board   spec.Board
	mac     string // the first NIC's MAC, or NoMAC
	st      propolisapi.Status
	changed chan struct{} // closed and replaced at every change of st
	// timer ends the transition in progress: until Close, it is set
	// exactly while the guest is Starting, Rebooting or Stopping.
	timer  *time.Timer
	booted bool   // the guest has run since it was ensured
	line   []byte // console input since the last end of line
	lastCR bool   // the last input byte ended a line with '\r'
	closed bool
	// attaching: an Ensure is making the guest's network (Options.Attach)
	// outside mu; detach undoes what it made, once.
	attaching bool
	detach    func()
	note      string // Attach's, printed at every boot
}

var _ propolisapi.Backend = (*Guest)(nil)

// New returns a guest that has nothing yet: Ensure makes it.
func New(opts Options) *Guest {
	g := &Guest{opts: opts.withDefaults(), changed: make(chan struct{})}
	g.console = propolisapi.NewBuffer(propolisapi.DefaultBufferSize, g.input)
	return g
}

// Ensure checks spec against the sled and makes the guest Creating (or
// Running, with Options.Running). Again with the same properties and spec
// it changes nothing; with others it is propolisapi.ErrConflict. A spec the
// sled cannot realise is a *propolisapi.SpecError.
func (g *Guest) Ensure(ctx context.Context, props propolisapi.Properties, raw json.RawMessage) error {
	if again, err := g.ensureAgain(props, raw); again {
		return err
	}
	// The check reads the file system: not under mu.
	s, sled, err := g.check(raw)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ensured {
		return g.sameLocked(props, raw)
	}
	if g.opts.Attach != nil {
		if g.attaching {
			return errEnsuring
		}
		g.attaching = true
		g.mu.Unlock()
		detach, note, err := g.opts.Attach(ctx, nicsOf(s, sled))
		g.mu.Lock()
		g.attaching = false
		if err != nil {
			return fmt.Errorf("the guest's network: %w", err)
		}
		if g.closed {
			go detach()
			return errClosed
		}
		g.detach, g.note = detach, note
	}
	g.ensured, g.props, g.raw = true, props, bytes.Clone(raw)
	g.board, g.mac = s.Board, firstMAC(s, sled)
	g.setLocked(propolisapi.StateCreating, detailWaiting)
	if g.opts.Running {
		g.booted = true
		g.console.Append(readyLine(g.mac))
		g.setLocked(propolisapi.StateRunning, detailResumed)
	}
	return nil
}

// ensureAgain answers Ensure for a guest that has been ensured already;
// again is false for one that has not.
func (g *Guest) ensureAgain(props propolisapi.Properties, raw json.RawMessage) (again bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ensured {
		return false, nil
	}
	return true, g.sameLocked(props, raw)
}

func (g *Guest) sameLocked(props propolisapi.Properties, raw json.RawMessage) error {
	if g.props != props || !propolisapi.SameSpec(g.raw, raw) {
		return propolisapi.ErrConflict
	}
	return nil
}

// check decodes raw and judges it against the sled, whose NICs it finds in
// the spec when the options give none.
func (g *Guest) check(raw json.RawMessage) (*spec.Spec, spec.Sled, error) {
	sled := g.opts.Sled
	s, err := spec.Decode(raw)
	if err == nil && sled.NICs == nil {
		sled.NICs, err = spec.NICsOf(s)
	}
	if err == nil {
		err = spec.Check(s, sled)
	}
	if se, ok := errors.AsType[*spec.Error](err); ok {
		return nil, sled, &propolisapi.SpecError{Msg: se.Error()}
	}
	return s, sled, err
}

// Errors of an Ensure that cannot make the guest now.
var (
	errEnsuring = errors.New("another ensure of this instance is making its network")
	errClosed   = errors.New("the guest's service is closing")
)

// nicsOf is every virtio NIC of s with its tap name and MAC, in PCI order.
func nicsOf(s *spec.Spec, sled spec.Sled) []NIC {
	var devs []*spec.NIC
	for _, c := range s.Components {
		if c.Type == spec.TypeVirtioNIC {
			devs = append(devs, c.NIC)
		}
	}
	slices.SortFunc(devs, func(a, b *spec.NIC) int {
		if pciLess(a.PCI, b.PCI) {
			return -1
		}
		return 1
	})
	var nics []NIC
	for _, d := range devs {
		nics = append(nics, NIC{Tap: s.Components[d.BackendID].Network.VNICName, MAC: sled.NICs[strings.ToLower(d.InterfaceID)]})
	}
	return nics
}

// undoNetworkLocked lets go of the guest's network, if it has one, without
// waiting for it.
func (g *Guest) undoNetworkLocked() {
	if d := g.detach; d != nil {
		g.detach = nil
		go d()
	}
}

// firstMAC is the MAC of the guest's first NIC, the one at the lowest PCI
// path, lowercase with colons; NoMAC without a NIC.
func firstMAC(s *spec.Spec, sled spec.Sled) string {
	var first *spec.NIC
	for _, c := range s.Components {
		if c.Type != spec.TypeVirtioNIC {
			continue
		}
		if first == nil || pciLess(c.NIC.PCI, first.PCI) {
			first = c.NIC
		}
	}
	if first == nil {
		return NoMAC
	}
	mac, ok := sled.NICs[strings.ToLower(first.InterfaceID)]
	if !ok {
		return NoMAC
	}
	return mac.String()
}

func pciLess(a, b spec.PCIPath) bool {
	return slices.Compare([]uint8{a.Bus, a.Device, a.Function}, []uint8{b.Bus, b.Device, b.Function}) < 0
}

// Instance is what Ensure was given, and the guest's status.
func (g *Guest) Instance() (propolisapi.Properties, json.RawMessage, propolisapi.Status, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.props, g.raw, g.st, g.ensured
}

// Wait returns the status as soon as its generation is above after, or the
// current status when ctx ends.
func (g *Guest) Wait(ctx context.Context, after uint64) propolisapi.Status {
	return propolisapi.WaitFor(ctx, after, func() (propolisapi.Status, <-chan struct{}) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.st, g.changed
	})
}

// Console is com1's; nil before Ensure.
func (g *Guest) Console() propolisapi.Console {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ensured {
		return nil // a nil *Buffer in the interface would not be nil
	}
	return g.console
}

// Upstream's reasons for refusing a state change (propolis-server's
// RequestDeniedReason), the error code of its 403.
const (
	deniedNotActive = "Operation requires an active instance"
	deniedStarting  = "Instance is currently starting"
	deniedHalting   = "Instance is preparing to stop"
	deniedHalted    = "Instance has already halted"
)

func denied(reason string) error {
	return fmt.Errorf("%w: %s", propolisapi.ErrInvalidTransition, reason)
}

// Request takes r; the transition it starts completes later. A request the
// guest already has in hand is a no-op. One it cannot take from its state
// changes nothing and wraps propolisapi.ErrInvalidTransition with
// upstream's reason.
func (g *Guest) Request(ctx context.Context, r propolisapi.StateRequest) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ensured {
		return denied(deniedNotActive)
	}
	s := g.st.State
	if s == propolisapi.StateStopped || s == propolisapi.StateDestroyed {
		if r == propolisapi.RequestStop {
			return nil
		}
		return denied(deniedHalted)
	}
	switch r {
	case propolisapi.RequestRun:
		switch s {
		case propolisapi.StateCreating:
			g.bootLocked(propolisapi.StateStarting, detailBooting, g.opts.BootTime)
		case propolisapi.StateStopping:
			return denied(deniedHalting)
		}
		// Starting, Running, Rebooting: running, or about to run again.
	case propolisapi.RequestReboot:
		switch s {
		case propolisapi.StateRunning:
			g.console.Append([]byte("reboot: Restarting system\r\n"))
			g.bootLocked(propolisapi.StateRebooting, detailRebooting, g.opts.RebootTime)
		case propolisapi.StateCreating:
			return denied(deniedNotActive)
		case propolisapi.StateStarting:
			return denied(deniedStarting)
		case propolisapi.StateStopping:
			return denied(deniedHalting)
		}
		// Rebooting: in hand.
	case propolisapi.RequestStop:
		if s == propolisapi.StateStopping {
			return nil
		}
		g.stopTimerLocked() // a stop wins over a boot or a reboot
		g.setLocked(propolisapi.StateStopping, "stop requested while "+strings.ToLower(string(s)))
		g.armLocked(g.opts.StopTime, g.haltLocked)
	default:
		return fmt.Errorf("unknown state request %q", r)
	}
	return nil
}

// bootLocked moves the guest to state (Starting or Rebooting) and boots it:
// its firmware speaks now, and after d its kernel and the READY line, as it
// becomes Running.
func (g *Guest) bootLocked(state propolisapi.InstanceState, detail string, d time.Duration) {
	g.line, g.lastCR = nil, false
	g.console.Append(firmwareLines())
	g.setLocked(state, detail)
	g.armLocked(d, func() {
		g.booted = true
		if g.note != "" {
			g.console.Append([]byte(g.note + "\r\n"))
		}
		g.console.Append(kernelLines(g.board, g.mac))
		g.setLocked(propolisapi.StateRunning, detailRunning)
	})
}

// haltLocked ends a stop: the guest is Stopped, and then Destroyed, as
// propolis destroys a halted VM; its console ends.
func (g *Guest) haltLocked() {
	if g.booted {
		g.console.Append([]byte("reboot: Power down\r\n"))
	}
	g.setLocked(propolisapi.StateStopped, detailStopped)
	g.setLocked(propolisapi.StateDestroyed, detailDestroyed)
	g.console.Close()
	g.undoNetworkLocked()
}

// NMI is taken by a running guest, whose kernel says so on its console; a
// guest that does not run loses it.
func (g *Guest) NMI(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st.State == propolisapi.StateRunning {
		g.console.Append([]byte("Uhhuh. NMI received for unknown reason 30 on CPU 0.\r\n"))
	}
	return nil
}

// Close stops the transition in progress, if any, and every later one: the
// guest keeps the state it has. Requests are still taken after Close, but
// the transitions they start never complete.
func (g *Guest) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.stopTimerLocked()
	g.undoNetworkLocked()
}

// setLocked moves the guest to state with detail, a new generation.
func (g *Guest) setLocked(state propolisapi.InstanceState, detail string) {
	g.st = propolisapi.Status{Gen: g.st.Gen + 1, State: state, Detail: detail}
	g.opts.Log.Info("guest state", "state", state, "detail", detail, "gen", g.st.Gen)
	close(g.changed)
	g.changed = make(chan struct{})
}

// armLocked ends the current transition after d by calling done under mu.
// The timer does nothing if the guest changed in the meantime (a stop that
// interrupted the transition) or was closed.
func (g *Guest) armLocked(d time.Duration, done func()) {
	if g.closed {
		return
	}
	gen := g.st.Gen
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.timer != t || g.st.Gen != gen {
			return
		}
		g.timer = nil
		done()
	})
	g.timer = t
}

func (g *Guest) stopTimerLocked() {
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
}
