package qemuvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
)

// set moves the VM to state, saying why.
func (v *VM) set(state propolisapi.InstanceState, detail string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.setLocked(state, detail)
}

// setLocked moves the VM to state; the generation goes up with every change
// of state or detail. Failed and Destroyed are final.
func (v *VM) setLocked(state propolisapi.InstanceState, detail string) {
	if cur := v.status.State; (cur == propolisapi.StateFailed || cur == propolisapi.StateDestroyed) && v.status.Gen > 0 {
		return
	}
	if state == v.status.State && detail == v.detail && v.status.Gen > 0 {
		return
	}
	v.status.Gen++
	v.status.State, v.detail = state, detail
	v.opts.Log.Info("guest state", "state", state, "detail", detail, "gen", v.status.Gen)
	close(v.changed)
	v.changed = make(chan struct{})
}

// Instance is what Ensure was given, and the VM's status.
func (v *VM) Instance() (propolisapi.Properties, json.RawMessage, propolisapi.Status, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.props, v.raw, v.statusLocked(), v.ensured
}

func (v *VM) statusLocked() propolisapi.Status {
	st := v.status
	st.Detail = v.detail
	return st
}

// Wait returns the status once its generation is above after, or the
// current one when ctx ends.
func (v *VM) Wait(ctx context.Context, after uint64) propolisapi.Status {
	return propolisapi.WaitFor(ctx, after, func() (propolisapi.Status, <-chan struct{}) {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.statusLocked(), v.changed
	})
}

// Console is com1's.
func (v *VM) Console() propolisapi.Console {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.ensured {
		return nil
	}
	return v.console
}

// Request asks the guest to run, stop or reboot.
func (v *VM) Request(ctx context.Context, r propolisapi.StateRequest) error {
	v.mu.Lock()
	state, proc := v.status.State, v.proc
	v.mu.Unlock()
	invalid := func() error {
		return fmt.Errorf("%w: cannot %s a guest that is %s", propolisapi.ErrInvalidTransition, strings.ToLower(string(r)), state)
	}
	if proc == nil {
		switch {
		case state == propolisapi.StateStopped || state == propolisapi.StateDestroyed:
			if r == propolisapi.RequestStop {
				return nil
			}
		}
		return invalid()
	}
	// A request taken is the VM's, as QEMU is (Ensure): the client going
	// away (an agent killed while it asks) must not cut it short between
	// the state it set and QEMU's part, which would leave a guest starting
	// and paused for good, a run asked again being a no-op. Bounded by
	// CallTimeout all the same.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.opts.CallTimeout)
	defer cancel()
	mon := proc.Monitor()
	switch r {
	case propolisapi.RequestRun:
		switch state {
		case propolisapi.StateRunning, propolisapi.StateStarting, propolisapi.StateRebooting:
			return nil
		case propolisapi.StateCreating:
			v.set(propolisapi.StateStarting, "QEMU asked to run the guest")
			if err := mon.Cont(cctx); err != nil {
				// Still paused: a run asked again tries again.
				v.revert(propolisapi.StateStarting, propolisapi.StateCreating, "QEMU holds the guest paused: asked to run, it did not: "+err.Error())
				return fmt.Errorf("running the guest: %w", err)
			}
			v.confirmRunning(cctx, mon)
			return nil
		}
	case propolisapi.RequestStop:
		switch state {
		case propolisapi.StateStopping, propolisapi.StateStopped, propolisapi.StateDestroyed:
			return nil
		case propolisapi.StateCreating:
			// The guest never ran: nothing to shut down.
			v.set(propolisapi.StateStopping, "the guest never ran: QEMU quits")
			v.markShutdown()
			return mon.Quit(cctx)
		case propolisapi.StateStarting, propolisapi.StateRunning, propolisapi.StateRebooting:
			v.markShutdown()
			v.set(propolisapi.StateStopping, "ACPI power button pressed: waiting for the guest to power off")
			if err := mon.SystemPowerdown(cctx); err != nil {
				return fmt.Errorf("pressing the power button: %w", err)
			}
			return nil
		}
	case propolisapi.RequestReboot:
		if state == propolisapi.StateRunning || state == propolisapi.StateRebooting {
			v.set(propolisapi.StateRebooting, "system reset asked")
			if err := mon.SystemReset(cctx); err != nil {
				v.revert(propolisapi.StateRebooting, propolisapi.StateRunning, "asked to reset, QEMU did not: "+err.Error())
				return fmt.Errorf("resetting the guest: %w", err)
			}
			v.confirmRunning(cctx, mon)
			return nil
		}
	}
	return invalid()
}

// revert moves the VM from state from back to state to, unless something
// (QEMU's events, another request) moved it on meanwhile.
func (v *VM) revert(from, to propolisapi.InstanceState, detail string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.status.State == from {
		v.setLocked(to, v.confinedLocked(detail))
	}
}

// confirmRunning moves a starting or rebooting VM to Running once QEMU says
// the guest runs. The RESUME and RESET events do it too; asking closes the
// race with a reset done before the request's answer.
func (v *VM) confirmRunning(ctx context.Context, mon *qemu.Monitor) {
	st, err := mon.QueryStatus(ctx)
	if err != nil || !st.Running {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if s := v.status.State; s == propolisapi.StateStarting || s == propolisapi.StateRebooting {
		v.setLocked(propolisapi.StateRunning, v.confinedLocked("QEMU runs the guest"))
	}
}

// confinedLocked is detail, a state of a guest whose QEMU runs, with who
// QEMU runs as and how it is confined, where it was asked to be: the
// agent's view shows it.
func (v *VM) confinedLocked(detail string) string {
	if v.runsAs != "" {
		detail += "; QEMU runs as " + v.runsAs
	}
	if v.confined != "" {
		detail += "; QEMU " + v.confined
	}
	return detail
}

func (v *VM) markShutdown() {
	v.mu.Lock()
	v.shutdown = true
	v.mu.Unlock()
}

// NMI injects a non-maskable interrupt.
func (v *VM) NMI(ctx context.Context) error {
	v.mu.Lock()
	proc := v.proc
	v.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("%w: no guest runs", propolisapi.ErrInvalidTransition)
	}
	cctx, cancel := context.WithTimeout(ctx, v.opts.CallTimeout)
	defer cancel()
	return proc.Monitor().Execute(cctx, "inject-nmi", nil, nil)
}

// follow turns QEMU's events and exit into the VM's states, until QEMU has
// exited and the VM is Stopped then Destroyed, or Failed.
func (v *VM) follow(proc *qemu.Process) {
	mon := proc.Monitor()
	for {
		select {
		case ev := <-mon.Events():
			v.event(proc, ev)
		case <-proc.Wait():
			v.exited(proc)
			return
		}
	}
}

func (v *VM) event(proc *qemu.Process, ev qemu.Event) {
	switch ev.Name {
	case "RESUME", "RESET":
		v.mu.Lock()
		switch s := v.status.State; {
		case ev.Name == "RESET" && s == propolisapi.StateRunning:
			// The guest reset itself: it reboots, and runs again at once.
			v.setLocked(propolisapi.StateRebooting, "the guest reset itself")
			v.setLocked(propolisapi.StateRunning, v.confinedLocked("QEMU runs the guest after its reset"))
		case s == propolisapi.StateStarting || s == propolisapi.StateRebooting,
			// A run whose answer from QEMU was lost (revert) ran all the
			// same: QEMU, started paused, resumes only when asked.
			s == propolisapi.StateCreating && ev.Name == "RESUME":
			v.setLocked(propolisapi.StateRunning, v.confinedLocked("QEMU runs the guest"))
		}
		v.mu.Unlock()
	case "SHUTDOWN":
		var d struct {
			Guest  bool   `json:"guest"`
			Reason string `json:"reason"`
		}
		json.Unmarshal(ev.Data, &d)
		v.mu.Lock()
		v.shutdown = true
		if s := v.status.State; s != propolisapi.StateStopping {
			v.setLocked(propolisapi.StateStopping, "the guest powered off ("+d.Reason+")")
		}
		v.mu.Unlock()
	case "GUEST_PANICKED":
		v.set(propolisapi.StateFailed, "the guest panicked (pvpanic): "+string(ev.Data))
		go proc.Kill(context.Background())
	case "STOP":
		// A stop nobody asked for is QEMU's: an internal error (KVM's
		// emulation failure), an I/O error, a full disk.
		ctx, cancel := context.WithTimeout(context.Background(), v.opts.CallTimeout)
		st, err := proc.Monitor().QueryStatus(ctx)
		cancel()
		if err != nil || st.Status == "paused" || st.Status == "shutdown" {
			return
		}
		if st.Status == "internal-error" || st.Status == "io-error" || st.Status == "guest-panicked" {
			v.set(propolisapi.StateFailed, fmt.Sprintf("QEMU stopped the guest: %s: %s", st.Status, lastLines(proc.Stderr(), 3)))
			go proc.Kill(context.Background())
		}
	}
}

// exited takes QEMU's exit: Stopped then Destroyed after a power-off,
// Failed otherwise.
func (v *VM) exited(proc *qemu.Process) {
	v.mu.Lock()
	shutdown := v.shutdown
	v.proc = nil
	serial := v.serial
	v.serial = nil
	conf := v.conf
	v.mu.Unlock()
	if serial != nil {
		serial.Close()
	}
	how := "exited"
	if st := proc.ExitState(); st != nil {
		how = st.String()
	}
	if shutdown && proc.ExitState() != nil && proc.ExitState().Success() {
		v.set(propolisapi.StateStopped, "the guest powered off and QEMU exited")
		v.cleanup()
		v.set(propolisapi.StateDestroyed, "QEMU exited and the VM's files are removed")
		return
	}
	if st := proc.ExitState(); conf != nil && st != nil && killed(st) {
		// The kernel kills a cgroup's process with SIGKILL at its
		// memory limit: say so, if the cgroup counted it.
		if k := conf.MemoryKill(); k != "" {
			how += ": " + k
		}
	}
	v.set(propolisapi.StateFailed, fmt.Sprintf("QEMU %s: %s", how, lastLines(proc.Stderr(), 3)))
	v.cleanup()
}

// cleanup removes the VM's sockets, blob files and taps; its firmware
// variables stay, as a disk's contents do.
func (v *VM) cleanup() {
	v.mu.Lock()
	dirFile, taps := v.dirFile, v.taps
	v.dirFile, v.taps = nil, nil
	v.mu.Unlock()
	// A tap goes with QEMU's descriptor of it; one is left only where
	// something else holds it.
	if len(taps) > 0 {
		err := v.inNetns(func() error {
			var errs []error
			for _, tap := range taps {
				if gone, err := qemu.RemoveTap(tap); err != nil {
					errs = append(errs, err)
				} else if gone {
					v.opts.Log.Warn("tap outlived QEMU: removed", "tap", tap)
				}
			}
			return errors.Join(errs...)
		})
		if err != nil {
			v.opts.Log.Warn("removing the VM's taps", "err", err)
		}
	}
	for _, pat := range []string{"*.sock", "*.blob"} {
		files, _ := filepath.Glob(filepath.Join(v.opts.Dir, pat))
		for _, f := range files {
			os.Remove(f)
		}
	}
	if dirFile != nil {
		dirFile.Close()
	}
}

// Close quits QEMU (kills it if it does not exit within ctx) and waits for
// it; the VM is Failed unless it had stopped.
func (v *VM) Close(ctx context.Context) error {
	v.mu.Lock()
	v.closed = true
	proc := v.proc
	v.mu.Unlock()
	if proc == nil {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, v.opts.CallTimeout)
	proc.Monitor().Quit(qctx)
	cancel()
	select {
	case <-proc.Wait():
		return nil
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	return proc.Kill(ctx)
}

// readSerial feeds com1's output to the console until the connection ends.
func (v *VM) readSerial(conn net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			v.console.Append(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// writeSerial sends input to com1.
func (v *VM) writeSerial(ctx context.Context, p []byte) (int, error) {
	v.mu.Lock()
	conn := v.serial
	v.mu.Unlock()
	if conn == nil {
		return 0, errors.New("the guest's serial port is not connected")
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetWriteDeadline(d)
	} else {
		conn.SetWriteDeadline(time.Now().Add(v.opts.CallTimeout))
	}
	return conn.Write(p)
}

// killed reports whether a process ended by SIGKILL.
func killed(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return "no output"
	}
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
