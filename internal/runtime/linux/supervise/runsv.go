//go:build linux

package supervise

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killGrace bounds the wait for processes to die after SIGKILL, which needs
// no cooperation from them; it is used once the caller's deadline has passed.
const killGrace = 2 * time.Second

// ErrLockedElsewhere is returned by Start when supervise/lock is held by a
// process this package cannot see (not a runsv in our /proc).
var ErrLockedElsewhere = errors.New("supervise/lock is held by a process that is not a visible runsv")

// startTimeout bounds Start, which has no ctx.
const startTimeout = 10 * time.Second

// Start is StartContext with a deadline of ten seconds.
func Start(dir string) (*Proc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	return StartContext(ctx, dir)
}

// StartContext starts runsv for the service directory dir (written by
// Prepare), detached from the agent: in its own session, stdin from
// /dev/null, output appended to dir/runsv.log, so that it outlives the agent.
// If a runsv already supervises dir, it returns that one, and tells it to
// keep the service up should it have been told otherwise. It returns once
// runsv holds the directory's lock and listens on supervise/control (the
// service itself may still be starting: see Status), or fails when ctx ends
// first, and then leaves no runsv of its own behind.
//
// A service process left running by a runsv that died is killed first, so the
// service never runs twice.
func StartContext(ctx context.Context, dir string) (*Proc, error) {
	return StartWith(ctx, dir, StartOptions{})
}

// StartOptions are StartWith's choices.
type StartOptions struct {
	// Cgroup, if set, is a cgroup v2 directory that runsv is started in,
	// so that it, the service and everything they start can be found and
	// killed together. A runsv already running is left where it is.
	Cgroup string
	// Start, if set, starts runsv's command in place of cmd.Start: to
	// start it somewhere else, in a network namespace say, where the
	// service it runs is born too. A runsv already running is left where
	// it is.
	Start func(cmd *exec.Cmd) error
}

// StartWith is StartContext with options.
func StartWith(ctx context.Context, dir string, opts StartOptions) (*Proc, error) {
	abs, err := canonical(dir)
	if err != nil {
		return nil, fmt.Errorf("supervise: start %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(abs, runFile)); err != nil {
		return nil, fmt.Errorf("supervise: start %s: not prepared: %w", abs, err)
	}
	// Two runsvs started at once for one directory race for its lock; the
	// loser exits at once and we look again, a bounded number of times. So
	// do two Starts, whose probes of the lock can meet.
	var lastErr error
	for range 3 {
		p, err := startOnce(ctx, abs, opts)
		if err == nil {
			// A runsv found running may have been told to keep the
			// service down (sv down): want it up.
			if err := control(abs, "u"); err != nil {
				p.Close()
				return nil, fmt.Errorf("supervise: start %s: %w", abs, err)
			}
			return p, nil
		}
		switch {
		case errors.Is(err, ErrLockedElsewhere):
			// Most often another Start's probe of the lock, for an
			// instant: look again shortly.
			t := time.NewTimer(20 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("supervise: start %s: %w", abs, err)
			case <-t.C:
			}
		case !errors.Is(err, errGone):
			return nil, fmt.Errorf("supervise: start %s: %w", abs, err)
		}
		lastErr = err
	}
	return nil, fmt.Errorf("supervise: start %s: %w (log: %s)", abs, lastErr, logTail(abs))
}

// startOnce returns the runsv supervising abs, starting one if there is none.
// errGone means the runsv it found or started exited before it was ready.
func startOnce(ctx context.Context, abs string, opts StartOptions) (*Proc, error) {
	p, ok, err := find(abs)
	if err != nil {
		return nil, err
	}
	if ok && !envCurrent(p.PID, abs) {
		// It would start the service with an environment the directory
		// no longer asks for: replace it.
		err := terminate(ctx, abs, p)
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("replacing runsv %d, whose environment is stale: %w", p.PID, err)
		}
		ok = false
	}
	if !ok {
		held, err := lockHeld(abs)
		if err != nil {
			return nil, err
		}
		if held {
			// find sees a runsv by its working directory from the moment it
			// could take the lock; one it cannot see is someone else's.
			return nil, ErrLockedElsewhere
		}
		if err := killOrphans(ctx, abs); err != nil {
			return nil, err
		}
		if p, err = spawn(abs, opts); err != nil {
			return nil, err
		}
		recordSpawned(abs, p)
	}
	if err := waitReady(ctx, p, abs); err != nil {
		if !errors.Is(err, errGone) && !ok {
			// Ours, and not ready in time: leave nothing behind.
			p.signal(unix.SIGKILL)
		}
		p.Close()
		return nil, err
	}
	return p, nil
}

// spawn starts `runsv abs` detached from the agent, in opts.Cgroup if set,
// with opts.Start if set.
func spawn(abs string, opts StartOptions) (*Proc, error) {
	bin, err := exec.LookPath("runsv")
	if err != nil {
		return nil, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	log, err := os.OpenFile(filepath.Join(abs, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	env, err := runsvEnv(abs)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, abs)
	cmd.Dir = "/"
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, log, log
	// Its own session: no signal for the agent's process group or terminal
	// reaches it. No Pdeathsig: it is meant to outlive the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if opts.Cgroup != "" {
		cg, err := os.Open(opts.Cgroup)
		if err != nil {
			return nil, fmt.Errorf("open cgroup: %w", err)
		}
		defer cg.Close()
		// Born in the cgroup (clone3), so nothing it starts escapes it.
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	}
	start := cmd.Start
	if opts.Start != nil {
		start = func() error { return opts.Start(cmd) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("run runsv: %w", err)
	}
	// The child cannot be reaped, nor its PID reused, before Wait: pin it
	// first, then reap it if it exits while the agent lives.
	p, err := newProc(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
	}
	go cmd.Wait()
	return p, err
}

// waitReady waits until p supervises abs: runsv opens supervise/ok only after
// it holds supervise/lock. errGone when p exits first.
//
// Until some process has supervise/ok open (supervised: one open that
// fails at once), there is nothing to look for among p's files; so the
// checks are cheap enough to be often, and a zone's start does not wait
// out a long pause after runsv is ready.
func waitReady(ctx context.Context, p *Proc, abs string) error {
	ok := filepath.Join(abs, "supervise", "ok")
	delay := 2 * time.Millisecond
	for {
		if p.Exited() {
			return fmt.Errorf("runsv %d exited: %w", p.PID, errGone)
		}
		if supervised(abs) && hasOpen(p.PID, ok) {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for runsv %d to take supervise/lock: %w", p.PID, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, readyPoll)
	}
}

// readyPoll is the longest pause between two checks of waitReady.
const readyPoll = 20 * time.Millisecond

// lockHeld reports whether some process holds dir/supervise/lock. The probe
// takes the lock for an instant; a runsv starting in that instant fails, and
// Start, which is the only caller, then looks again.
func lockHeld(abs string) (bool, error) {
	f, err := os.OpenFile(filepath.Join(abs, "supervise", "lock"), os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return false, unix.Flock(int(f.Fd()), unix.LOCK_UN)
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	default:
		return false, fmt.Errorf("probe supervise/lock: %w", err)
	}
}

// Find returns the runsv supervising dir, if one runs: a process whose comm
// is runsv and that has dir/supervise/ok open, has dir for its working
// directory, or names dir on its command line. It is how the agent finds its
// runsvs again after a restart.
func Find(dir string) (*Proc, bool, error) {
	abs, err := canonical(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("supervise: find %s: %w", dir, err)
	}
	p, ok, err := find(abs)
	if err != nil {
		return nil, false, fmt.Errorf("supervise: find %s: %w", abs, err)
	}
	return p, ok, nil
}

// find looks first where spawn recorded the runsv it started (no scan of
// /proc); if that one is gone and nobody holds the directory's lock, no runsv
// supervises abs. Only a lock held by an unrecorded process costs a scan.
func find(abs string) (*Proc, bool, error) {
	if p, ok := findRecorded(abs); ok {
		return p, true, nil
	}
	held, err := lockHeld(abs)
	if err != nil || !held {
		return nil, false, err
	}
	return scan(abs)
}

// pidFile records the runsv that spawn started: "<pid> <start time>".
const pidFile = "runsv.pid"

func recordSpawned(abs string, p *Proc) {
	// Best effort: without the record, find scans /proc instead.
	os.WriteFile(filepath.Join(abs, pidFile), fmt.Appendf(nil, "%d %d\n", p.PID, p.start), 0o644)
}

// findRecorded returns the recorded runsv if it still runs.
func findRecorded(abs string) (*Proc, bool) {
	b, err := os.ReadFile(filepath.Join(abs, pidFile))
	if err != nil {
		return nil, false
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil {
		return nil, false
	}
	p, st, err := newProcStat(pid)
	if err != nil {
		return nil, false
	}
	if st.comm != "runsv" || st.start != start {
		p.Close()
		return nil, false
	}
	return p, true
}

// scan finds the runsv supervising abs among all processes.
func scan(abs string) (*Proc, bool, error) {
	all, err := pids()
	if err != nil {
		return nil, false, err
	}
	ok := filepath.Join(abs, "supervise", "ok")
	var candidates []int
	for _, pid := range all {
		st, err := readStat(pid)
		if err != nil || st.comm != "runsv" || st.state == 'Z' {
			continue
		}
		// A child runsv has just forked to exec ./run (or ./finish) is
		// still called runsv and holds its parent's files, ok among them.
		if parent, err := readStat(st.ppid); err == nil && parent.comm == "runsv" {
			continue
		}
		if hasOpen(pid, ok) {
			// The one holding the lock: prefer it to one still starting.
			candidates = append([]int{pid}, candidates...)
			continue
		}
		if runsvFor(pid, abs) {
			candidates = append(candidates, pid)
		}
	}
	for _, pid := range candidates {
		p, err := newProc(pid)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		return p, true, nil
	}
	return nil, false, nil
}

// runsvFor reports whether runsv pid works in abs or was started for it.
func runsvFor(pid int, abs string) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	if cwd, err := os.Readlink(proc + "/cwd"); err == nil && cwd == abs {
		return true
	}
	b, err := os.ReadFile(proc + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	return len(args) == 2 && filepath.IsAbs(args[1]) && filepath.Clean(args[1]) == abs
}

// State is a service's state as runsv reports it.
type State struct {
	// Up: the service process runs. When runsv is gone (Supervised is false)
	// its last report is checked against /proc: a service left running by a
	// dead runsv is Up but not Supervised.
	Up bool
	// PID of the service process, when Up.
	PID int
	// Since is when the service last changed between up and down, from
	// supervise/status; zero when runsv has not reported yet.
	Since time.Time
	// Phase is runsv's "run", "down" or "finish" (the finish script runs).
	Phase string
	// WantUp: runsv means to keep the service up (false after Stop).
	WantUp bool
	// Supervised: a runsv runs for the directory.
	Supervised bool
	// LastExit is how the service last exited, when it has.
	LastExit *Exit
}

// Exit is how a service process ended.
type Exit struct {
	Code   int // exit code, or -1 when a signal ended it
	Signal int // the signal, when Code is -1
}

// Status reads the service's state from the files runsv keeps in
// dir/supervise, without running sv. A directory that does not exist is an
// error wrapping fs.ErrNotExist; one that runsv never ran in is down.
func Status(dir string) (State, error) {
	abs, err := canonical(dir)
	if err != nil {
		return State{}, fmt.Errorf("supervise: status %s: %w", dir, err)
	}
	s := State{Phase: "down", Supervised: supervised(abs), LastExit: lastExit(abs)}
	b, err := readStatus(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("supervise: status %s: %w", abs, err)
	}
	if sec := binary.BigEndian.Uint64(b[0:8]); sec > taiOffset {
		s.Since = time.Unix(int64(sec-taiOffset), int64(binary.BigEndian.Uint32(b[8:12])))
	}
	pid := int(binary.LittleEndian.Uint32(b[12:16]))
	s.WantUp = b[17] == 'u'
	switch b[19] {
	case 1:
		s.Phase = "run"
	case 2:
		s.Phase = "finish"
	}
	if s.Phase == "run" && pid > 0 {
		if s.Supervised {
			s.Up = true
		} else if st, err := readStat(pid); err == nil && st.state != 'Z' && marked(pid, abs) {
			s.Up = true // left running by a runsv that died
		}
	}
	if s.Up {
		s.PID = pid
	}
	return s, nil
}

// readStatus reads runit's 20-byte status: TAI64N label of the last change
// (12 bytes), the pid (4 bytes, little-endian), paused, want ('u'/'d'), got
// TERM, state.
func readStatus(abs string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(abs, "supervise", "status"))
	if err != nil {
		return nil, err
	}
	if len(b) < 20 {
		return nil, fmt.Errorf("supervise/status has %d bytes, want 20", len(b))
	}
	return b, nil
}

// runningPID is the pid of the service that runsv reports running, or 0: the
// part of Status that stopping needs.
func runningPID(abs string) int {
	b, err := readStatus(abs)
	if err != nil || b[19] != 1 {
		return 0
	}
	return int(binary.LittleEndian.Uint32(b[12:16]))
}

// taiOffset turns a TAI64 label into Unix seconds: 2^62 plus the 10 seconds
// by which TAI led UTC in 1970, as runit's tai_unix counts.
const taiOffset = 1<<62 + 10

// supervised reports whether a runsv runs for abs: runsv keeps supervise/ok
// open for reading, so opening it for writing succeeds only while it runs
// (this is how sv checks).
func supervised(abs string) bool {
	fd, err := unix.Open(filepath.Join(abs, "supervise", "ok"), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // ENXIO: no reader; ENOENT: never ran
	}
	unix.Close(fd)
	return true
}

// lastExit reads the exit status the finish script recorded, if any.
func lastExit(abs string) *Exit {
	b, err := os.ReadFile(filepath.Join(abs, lastExitFile))
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return nil
	}
	code, err1 := strconv.Atoi(f[0])
	low, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return nil
	}
	e := &Exit{Code: code}
	if code == -1 {
		e.Signal = low & 0x7f
	}
	return e
}

// Stop takes the service in dir down and makes its runsv exit: it writes "dx"
// to supervise/control (runsv sends the service SIGTERM and SIGCONT, does not
// restart it, and exits once it is down), then waits for runsv, the service
// and any process carrying the service's mark to exit. A service left behind
// by a dead runsv gets SIGTERM from Stop itself. When ctx ends first, Stop
// SIGKILLs whatever is left and waits a short grace period for it to die.
// Nothing running is success; an error means something may still run.
func Stop(ctx context.Context, dir string) error { return stopDir(ctx, dir, true) }

// StopSupervisor is Stop for a caller that is tearing the service down for
// good and finds its leftovers itself (the zone runtime kills everything in
// the zone's cgroup or namespace): it kills runsv and sends the service
// SIGTERM itself (see terminate), does not look for processes the service
// left behind, which costs a scan of every process, and the finish script
// does not run.
func StopSupervisor(ctx context.Context, dir string) error { return stopDir(ctx, dir, false) }

// StopRunsv is StopSupervisor for the runsv p that StartWith returned, with
// no search for it. A nil p, or one that has exited, is StopSupervisor.
func StopRunsv(ctx context.Context, dir string, p *Proc) error {
	if p == nil || p.Exited() {
		return StopSupervisor(ctx, dir)
	}
	abs, err := canonical(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return StopSupervisor(ctx, dir)
	}
	if err == nil {
		err = terminate(ctx, abs, p)
	}
	if err != nil {
		return fmt.Errorf("supervise: stop %s: %w", dir, err)
	}
	return nil
}

func stopDir(ctx context.Context, dir string, thorough bool) error {
	abs, err := canonical(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("supervise: stop %s: %w", dir, err)
	}
	if err := stopWith(ctx, abs, thorough); err != nil {
		return fmt.Errorf("supervise: stop %s: %w", abs, err)
	}
	return nil
}

// stopWith stops runsv and its service; thorough also looks for marked
// processes after a clean exit of runsv.
func stopWith(ctx context.Context, abs string, thorough bool) error {
	var procs []*Proc
	defer func() { closeAll(procs) }()
	r, ok, err := find(abs)
	if err != nil {
		return err
	}
	if ok {
		procs = append(procs, r)
		if !thorough {
			return terminate(ctx, abs, r)
		}
		if err := control(abs, "dx"); err != nil {
			return err
		}
		if waitExited(ctx, []*Proc{r}) != nil {
			return killAll(procs, abs)
		}
	}
	// runsv is gone: its service is down, or was left behind by a runsv
	// that died, and may have left children. All carry the mark.
	svc, err := findMarked(abs)
	procs = append(procs, svc...)
	if err != nil {
		return errors.Join(err, killAll(procs, abs))
	}
	for _, p := range svc {
		if err := p.signal(unix.SIGTERM); err != nil {
			return errors.Join(err, killAll(procs, abs))
		}
		p.signal(unix.SIGCONT)
	}
	if waitExited(ctx, svc) != nil {
		return killAll(procs, abs)
	}
	return nil
}

// terminate is StopSupervisor's way when runsv runs: it SIGKILLs runsv, so
// that it restarts nothing and runs no finish script, and sends the service
// SIGTERM (and SIGCONT, if it is stopped), as runsv would, then waits for
// both to exit. Doing runsv's part here saves a round of runsv's
// bookkeeping per zone, which is a tenth of a zone's teardown.
func terminate(ctx context.Context, abs string, r *Proc) error {
	procs := []*Proc{r}
	stopped := false // the service is stopped (SIGSTOP): it needs SIGCONT to see SIGTERM
	if pid := runningPID(abs); pid > 0 {
		// The service is runsv's child: a pid that is not is stale.
		if p, ps, err := newProcStat(pid); err == nil {
			defer p.Close()
			if ps.ppid == r.PID {
				procs = append(procs, p)
				stopped = ps.state == 'T' || ps.state == 't'
			}
		}
	}
	if err := r.signal(unix.SIGKILL); err != nil {
		return err
	}
	for _, p := range procs[1:] {
		p.signal(unix.SIGTERM)
		if stopped {
			p.signal(unix.SIGCONT)
		}
	}
	if waitExited(ctx, procs) != nil {
		return killAll(procs, abs)
	}
	return nil
}

// control writes cmd to runsv's supervise/control FIFO. No reader means no
// runsv, which is not an error: the caller waits for it to be gone anyway.
func control(abs, cmd string) error {
	fd, err := unix.Open(filepath.Join(abs, "supervise", "control"), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open supervise/control: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(cmd)); err != nil && !errors.Is(err, unix.EPIPE) {
		return fmt.Errorf("write %q to supervise/control: %w", cmd, err)
	}
	return nil
}

// killAll SIGKILLs procs (runsv first, so it restarts nothing) and every
// process with the service's mark, and waits killGrace for them to die.
func killAll(procs []*Proc, abs string) error {
	for _, p := range procs {
		p.signal(unix.SIGKILL)
	}
	more, err := findMarked(abs)
	defer closeAll(more)
	for _, p := range more {
		p.signal(unix.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	if werr := waitExited(ctx, append(procs, more...)); werr != nil {
		err = errors.Join(err, fmt.Errorf("processes still alive %v after SIGKILL: %w", killGrace, werr))
	}
	return err
}

// killOrphans SIGKILLs a service left running by a runsv that died, and its
// children, before a new runsv starts the service again.
func killOrphans(ctx context.Context, abs string) error {
	if _, err := os.Stat(filepath.Join(abs, "supervise", "status")); errors.Is(err, fs.ErrNotExist) {
		return nil // runsv never ran here, so no service did either
	}
	ps, err := findMarked(abs)
	defer closeAll(ps)
	if err != nil || len(ps) == 0 {
		return err
	}
	for _, p := range ps {
		p.signal(unix.SIGKILL)
	}
	if err := waitExited(ctx, ps); err != nil {
		return fmt.Errorf("killing the service left by a dead runsv: %w", err)
	}
	return nil
}

// KillMarked SIGKILLs every process that carries the ownership mark of the
// service directory dir, as the mark names it (MarkedProcess.Dir), and waits
// a short grace for them to die. dir need not exist: a service's processes
// can outlive its directory, and Stop, which starts from the directory, does
// not look for them then. runsv carries no mark; Stop stops it.
func KillMarked(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("supervise: kill %s: %w", dir, err)
	}
	if err := killAll(nil, abs); err != nil {
		return fmt.Errorf("supervise: kill %s: %w", abs, err)
	}
	return nil
}

// logTail returns the end of runsv.log, for error messages.
func logTail(abs string) string {
	f, err := os.Open(filepath.Join(abs, logFile))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const n = 512
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return strconv.Quote(string(bytes.TrimSpace(b)))
}
