//go:build linux

package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// errGone reports that a process has exited (or its PID now names another
// process).
var errGone = errors.New("process gone")

// Proc is a process found or started by this package: a runsv, or a process
// of a supervised service. It holds a pidfd, so signals and exit watches reach
// this process even if its PID is later reused. Close releases the pidfd.
type Proc struct {
	PID int

	start uint64 // start time in clock ticks after boot: with PID, the process's identity

	mu      sync.Mutex
	fd      int // pidfd (O_NONBLOCK); -1 after Close
	cleanup runtime.Cleanup
}

// newProc pins the process pid: it opens a pidfd on it and reads its start
// time, which with the PID names it. errGone when it has exited.
func newProc(pid int) (*Proc, error) {
	p, _, err := newProcStat(pid)
	return p, err
}

// newProcStat is newProc returning the process's stat too. The stat is read
// after the pidfd is opened and before the pidfd shows the process still
// alive, so both are of the same process, with one read of the stat. A
// process that has exited (a zombie too) is errGone.
func newProcStat(pid int) (*Proc, procStat, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, procStat{}, fmt.Errorf("pid %d: %w", pid, errGone)
	}
	if err != nil {
		return nil, procStat{}, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	st, err := readStat(pid)
	if err == nil && pidfdReadable(fd) {
		err = fmt.Errorf("pid %d: %w", pid, errGone)
	}
	if err != nil {
		unix.Close(fd)
		return nil, procStat{}, err
	}
	p := &Proc{PID: pid, start: st.start, fd: fd}
	p.cleanup = runtime.AddCleanup(p, func(fd int) { unix.Close(fd) }, fd)
	return p, st, nil
}

// openPidfd opens a non-blocking pidfd for pid and checks that pid still
// names the process that started at start.
func openPidfd(pid int, start uint64) (int, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return -1, fmt.Errorf("pid %d: %w", pid, errGone)
	}
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// The pidfd refers to whatever process had the PID when it was opened:
	// if that is still the process that started at start, it is ours.
	if st, err := readStat(pid); err != nil || st.start != start {
		unix.Close(fd)
		return -1, fmt.Errorf("pid %d: %w", pid, errGone)
	}
	return fd, nil
}

// Close releases the process's pidfd. The process is not affected; Watch and
// the package's functions still work on a closed Proc, by PID and start time.
func (p *Proc) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return nil
	}
	p.cleanup.Stop()
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// pidfd returns a new pidfd for the process, which the caller closes.
func (p *Proc) pidfd() (int, error) {
	p.mu.Lock()
	fd := p.fd
	if fd >= 0 {
		nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		p.mu.Unlock()
		if err != nil {
			return -1, fmt.Errorf("dup pidfd: %w", err)
		}
		return nfd, nil
	}
	p.mu.Unlock()
	return openPidfd(p.PID, p.start)
}

// Exited reports whether the process has exited (a zombie has).
func (p *Proc) Exited() bool {
	fd, err := p.pidfd()
	if err != nil {
		return errors.Is(err, errGone)
	}
	defer unix.Close(fd)
	return pidfdReadable(fd)
}

// signal sends sig to the process; a process that has exited is not an error.
func (p *Proc) signal(sig unix.Signal) error {
	p.mu.Lock()
	if p.fd >= 0 {
		// pidfd_send_signal does not block: the lock guards only the fd.
		err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
		p.mu.Unlock()
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", p.PID, err)
		}
		return nil
	}
	p.mu.Unlock()
	fd, err := p.pidfd()
	if errors.Is(err, errGone) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", p.PID, err)
	}
	return nil
}

// Watch returns a channel that is closed when the process exits. It works for
// processes that are not the agent's children (it waits on a pidfd through
// the Go runtime's poller, holding no thread). The goroutine behind it ends
// when the process exits or ctx ends, whichever is first; once ctx has ended
// the channel may stay open forever, so select on ctx.Done too.
func (p *Proc) Watch(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{})
	fd, err := p.pidfd()
	if errors.Is(err, errGone) {
		close(ch)
		return ch
	}
	if err != nil {
		go p.pollExit(ctx, ch)
		return ch
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	// A deadline can be set only on a file the runtime poller accepted.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		go p.pollExit(ctx, ch)
		return ch
	}
	go func() {
		defer f.Close()
		stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
		rc, err := f.SyscallConn()
		if err != nil {
			return
		}
		// A pidfd becomes readable when the process exits.
		err = rc.Read(func(fd uintptr) bool { return pidfdReadable(int(fd)) })
		if err == nil {
			close(ch)
		}
	}()
	return ch
}

// pollExit is Watch's fallback when no pidfd can be waited on: it checks the
// process every half second.
func (p *Proc) pollExit(ctx context.Context, ch chan struct{}) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if !alive(p.PID, p.start) {
			close(ch)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pidfdReadable polls a pidfd without blocking: readable means exited.
func pidfdReadable(fd int) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}
}

// waitExited waits until every process in ps has exited, or ctx ends.
func waitExited(ctx context.Context, ps []*Proc) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the watches still waiting
	for _, p := range ps {
		select {
		case <-p.Watch(wctx):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// procStat is what this package reads from /proc/PID/stat.
type procStat struct {
	comm  string
	state byte
	ppid  int
	start uint64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, errGone)
	}
	if err != nil {
		return procStat{}, err
	}
	// "pid (comm) state ppid ..."; comm may itself hold ")" or spaces.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("pid %d: malformed stat %q", pid, b)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("pid %d: malformed stat %q", pid, b)
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64) // field 22: starttime
	if err1 != nil || err2 != nil {
		return procStat{}, fmt.Errorf("pid %d: malformed stat %q", pid, b)
	}
	return procStat{comm: string(b[open+1 : end]), state: f[0][0], ppid: ppid, start: start}, nil
}

// alive reports whether the process pid that started at start still runs.
func alive(pid int, start uint64) bool {
	st, err := readStat(pid)
	return err == nil && st.start == start && st.state != 'Z' && st.state != 'X'
}

// pids lists the processes in /proc.
func pids() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// hasOpen reports whether process pid has the file path open.
func hasOpen(pid int, path string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == path {
			return true
		}
	}
	return false
}

// marked reports whether process pid carries the ownership mark of the
// service in directory abs.
func marked(pid int, abs string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	want := []byte(MarkerEnv + "=" + abs)
	for e := range bytes.SplitSeq(b, []byte{0}) {
		if bytes.Equal(e, want) {
			return !isRunsv(pid)
		}
	}
	return false
}

// isRunsv reports whether pid is a runsv (or a child it has forked and not
// yet turned into the service). A runsv of a service prepared with
// PrepareDirect carries the service's mark, which it hands down; it is found
// by its working directory and lock (find), not by the mark.
func isRunsv(pid int) bool {
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && string(bytes.TrimSpace(comm)) == "runsv"
}

// findMarked returns the live processes that carry the ownership mark of the
// service in directory abs: the service and any children it left.
func findMarked(abs string) ([]*Proc, error) {
	all, err := pids()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []*Proc
	for _, pid := range all {
		if pid == self || !marked(pid, abs) {
			continue
		}
		p, err := newProc(pid)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			closeAll(out)
			return nil, err
		}
		if p.Exited() {
			p.Close()
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func closeAll(ps []*Proc) {
	for _, p := range ps {
		p.Close()
	}
}

// MarkedProcess is a live process that carries a service's ownership mark.
type MarkedProcess struct {
	PID int
	// Dir is the service directory its mark names.
	Dir string
	// Comm is the process's command name, for people.
	Comm string
}

// ListMarked returns every live process whose ownership mark names a service
// directory under root: services and whatever they started, including those
// whose supervisor or zone is gone. runsv is not one of them, mark or not
// (Find finds it).
func ListMarked(root string) ([]MarkedProcess, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	all, err := pids()
	if err != nil {
		return nil, err
	}
	prefix := []byte(MarkerEnv + "=" + abs + string(filepath.Separator))
	self := os.Getpid()
	var out []MarkedProcess
	for _, pid := range all {
		if pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			continue // gone, or a kernel thread
		}
		for e := range bytes.SplitSeq(b, []byte{0}) {
			if bytes.HasPrefix(e, prefix) {
				comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
				if c := string(bytes.TrimSpace(comm)); c != "runsv" {
					out = append(out, MarkedProcess{PID: pid, Dir: string(e[len(MarkerEnv)+1:]), Comm: c})
				}
				break
			}
		}
	}
	return out, nil
}
