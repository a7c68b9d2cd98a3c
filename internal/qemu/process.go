package qemu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	// ErrStart wraps a QEMU that could not be started at all.
	ErrStart = errors.New("could not start qemu")
	// ErrExited is a QEMU that exited before its monitor was ready.
	ErrExited = errors.New("qemu exited")
	// ErrNotReaped is a killed QEMU not reaped before the caller's
	// deadline (a process stuck in the kernel, on a dead disk say).
	ErrNotReaped = errors.New("qemu killed but not reaped")

	errExited = fmt.Errorf("%w before its monitor was ready", ErrExited)
)

const (
	// OutputLimit is how much of QEMU's output a Process keeps: the end,
	// where QEMU's reason for failing is.
	OutputLimit = 8 << 10
	// reapWait bounds how long a failing Start waits for the QEMU it
	// killed to be reaped.
	reapWait = 10 * time.Second
	// exitGrace is how long a failing Start waits for QEMU to exit by
	// itself before it kills it.
	exitGrace = time.Second
	// dialEvery is how often Start looks for the QMP socket.
	dialEvery = 10 * time.Millisecond
)

// StartOptions set Start up. Zero values take the defaults.
type StartOptions struct {
	// Binary is QEMU's program, a path or a name looked up in PATH
	// (qemu-system-x86_64).
	Binary string
	// Start starts the command ((*exec.Cmd).Start): a caller puts QEMU in
	// a namespace or cgroup, or sets the user it runs as
	// (SysProcAttr.Credential), here. The command comes with its own
	// process group (SysProcAttr.Setpgid) and, with Machine.Descriptors,
	// its ExtraFiles.
	Start func(*exec.Cmd) error
	// Logger gets QEMU's start and exit (none).
	Logger *slog.Logger
}

// StartError is a QEMU that started but whose monitor never became ready.
// Its process has been killed and reaped.
type StartError struct {
	Err    error  // what went wrong; wraps ErrExited if QEMU exited by itself
	Exit   string // how the process ended ("exit status 1"); empty if it was not reaped
	Output string // the last OutputLimit bytes QEMU wrote to stdout and stderr
}

func (e *StartError) Error() string {
	s := e.Err.Error()
	if e.Exit != "" {
		s += " (" + e.Exit + ")"
	}
	if out := strings.TrimSpace(e.Output); out != "" {
		lines := strings.Split(out, "\n")
		s += ": " + strings.Join(lines[max(0, len(lines)-3):], " | ")
	}
	return s
}

func (e *StartError) Unwrap() error { return e.Err }

// Process is a running QEMU with its monitor.
type Process struct {
	cmd    *exec.Cmd
	mon    *Monitor
	out    *tail
	log    *slog.Logger
	exited chan struct{} // closed once cmd.Wait has returned; cmd.ProcessState is set then
}

// Start runs QEMU for m, waits until its QMP socket answers, and returns it
// with a monitor, paused (QEMU runs with -S: [Monitor.Cont] runs the guest).
// ctx bounds the start alone (DefaultTimeout if it has no deadline); the
// process outlives it. A stale file at m.QMPSocket is removed first. With
// m.Descriptors, Start opens and makes what QEMU is given (see
// [Machine.Descriptors]) and closes its own copies once QEMU has started;
// a file that does not open fails Start before QEMU runs. QEMU runs in /.
// If anything fails once the process has started, it is killed and reaped
// before Start returns a *StartError with QEMU's last words.
func Start(ctx context.Context, m Machine, opts StartOptions) (*Process, error) {
	args, pass, err := m.command()
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("machine", m.Name)
	if err := os.Remove(m.QMPSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: stale QMP socket: %w", ErrStart, err)
	}
	files, closeFiles, err := openPassed(pass)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	defer closeFiles()

	cmd := exec.Command(cmp.Or(opts.Binary, "qemu-system-x86_64"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// QEMU's paths are all absolute; a working directory of ours would let
	// an unprivileged QEMU reach below directories it may not traverse.
	if abs, err := filepath.Abs(cmd.Path); err == nil && cmd.Err == nil {
		cmd.Path = abs
	}
	cmd.Dir = "/"
	cmd.ExtraFiles = files
	out := &tail{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second // for output held open by something QEMU left behind
	start := opts.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	began := time.Now()
	err = start(cmd)
	// QEMU has its copies now: closing ours before QEMU is dialled means
	// a QEMU that dies closes its sockets, and the dial sees it.
	closeFiles()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	p := &Process{cmd: cmd, out: out, log: log, exited: make(chan struct{})}
	go p.wait()
	log.Debug("qemu started", "pid", p.PID(), "args", args)

	mon, err := p.connect(ctx, m.QMPSocket)
	if err != nil {
		// A QEMU that fails closes its socket as it exits: give it a
		// moment to be reaped, so the error says it exited, and how.
		if ctx.Err() == nil {
			select {
			case <-p.exited:
			case <-time.After(exitGrace):
			}
		}
		select {
		case <-p.exited:
			err = errExited
		default:
		}
		p.signal()
		serr := &StartError{Err: err}
		select {
		case <-p.exited:
			serr.Exit = cmd.ProcessState.String()
		case <-time.After(reapWait):
			log.Warn("qemu killed but not reaped", "pid", p.PID())
		}
		serr.Output = out.String()
		return nil, serr
	}
	p.mon = mon
	log.Info("qemu ready", "pid", p.PID(), "qemu", mon.Version().String(), "took", time.Since(began))
	return p, nil
}

// connect dials the QMP socket until QEMU answers, exits, or ctx ends.
func (p *Process) connect(ctx context.Context, path string) (*Monitor, error) {
	tick := time.NewTicker(dialEvery)
	defer tick.Stop()
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return handshake(ctx, conn) // QEMU dying now ends it at once
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("qmp: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("QMP socket %s not ready: %w", path, ctx.Err())
		case <-p.exited:
			return nil, errExited
		case <-tick.C:
		}
	}
}

func (p *Process) wait() {
	err := p.cmd.Wait()
	p.log.Info("qemu exited", "pid", p.PID(), "status", p.cmd.ProcessState.String(), "err", err)
	close(p.exited)
}

// PID is QEMU's process id, and its process group's.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Monitor is the QMP connection to QEMU.
func (p *Process) Monitor() *Monitor { return p.mon }

// Wait is closed once QEMU has exited and been reaped.
func (p *Process) Wait() <-chan struct{} { return p.exited }

// ExitState is how QEMU ended, or nil while it runs.
func (p *Process) ExitState() *os.ProcessState {
	select {
	case <-p.exited:
		return p.cmd.ProcessState
	default:
		return nil
	}
}

// Stderr is the end of what QEMU wrote to stderr and stdout (the last
// OutputLimit bytes).
func (p *Process) Stderr() string { return p.out.String() }

// Kill kills QEMU and its process group with SIGKILL, closes the monitor,
// and waits until QEMU is reaped or ctx ends (then ErrNotReaped: only the
// goroutine waiting for the process outlives Kill). Killing a QEMU that
// has exited only closes its monitor. Call Kill when done with a Process,
// whether or not QEMU still runs.
func (p *Process) Kill(ctx context.Context) error {
	p.signal()
	if p.mon != nil {
		p.mon.Close()
	}
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: pid %d: %w", ErrNotReaped, p.PID(), ctx.Err())
	}
}

// signal sends SIGKILL to QEMU and its group unless it has been reaped.
// Once reaped, its pid names no other process: a pid stays taken while any
// process of its group remains.
func (p *Process) signal() {
	select {
	case <-p.exited:
		return
	default:
	}
	if a := p.cmd.SysProcAttr; a != nil && a.Setpgid && a.Pgid == 0 {
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	}
	_ = p.cmd.Process.Kill()
}

// tail keeps the last OutputLimit bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
	cut bool // something was dropped from the front
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - OutputLimit; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
		t.cut = true
	}
	return len(b), nil
}

// String is what was kept, from the first whole line if the front was cut.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if t.cut {
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
