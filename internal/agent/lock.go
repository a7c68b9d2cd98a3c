package agent

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
)

// lockFile, in the data dir, is held (flock) by the agent using the dir;
// the Linux runtime's claims name it, to tell a dead sled's debris.
const lockFile = linux.DataDirLockFile

// HostLockDir holds the host-wide locks of the linux runtime, one per zone
// tag: sled-agent-<tag>.lock. It is /run/lock, not the run dir: the agent
// mounts a tmpfs on its run dir when that is not on one, which would hide a
// lock taken there from the next agent.
const HostLockDir = "/run/lock"

// DefaultZoneTag is the linux runtime's ownership tag when none is given.
const DefaultZoneTag = "sled-agent"

// ErrInUse is wrapped when the data dir, or the host's zones of a tag, are
// held by another process.
var ErrInUse = errors.New("in use by another sled agent")

// LockDataDir takes the data dir for this process: an agent, or an operator
// command that must not run beside one (teardown). The lock is released by
// closing the file, or by the process ending however it ends. A dir held by
// another process is an error naming that process.
func LockDataDir(dataDir string) (*os.File, error) {
	f, _, err := lockDataDir(dataDir)
	return f, err
}

// lockReleaseWait bounds how long a lock whose holder is gone may take to be
// released: an agent killed a moment ago (SIGKILL, then restarted by its
// supervisor or the crash test) was seen to leave its data dir's lock held
// for a moment with no process holding the file, and a restart must not fail
// for it.
const lockReleaseWait = 3 * time.Second

// lockDataDir is LockDataDir, saying how long it waited for a holder that
// was gone to release the lock.
func lockDataDir(dataDir string) (*os.File, time.Duration, error) {
	path := filepath.Join(dataDir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("locking data dir: %w", err)
	}
	start := time.Now()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, 0, fmt.Errorf("locking data dir %s: %w", dataDir, err)
		}
		holder, _ := os.ReadFile(path)
		pid := strings.TrimSpace(string(holder))
		state := processState(pid)
		if state == ", gone" && time.Since(start) < lockReleaseWait {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		f.Close()
		if waited := time.Since(start).Round(time.Millisecond); waited > 0 && state == ", gone" {
			state += fmt.Sprintf(", its lock still held %s later", waited)
		}
		return nil, 0, fmt.Errorf("data dir %s is %w (pid %s%s%s): one agent per data dir", dataDir, ErrInUse, pid, state, openBy(path))
	}
	// Who holds it, for the message above; the lock itself is the flock.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, time.Since(start), nil
}

// dataDirHeld says whether another process holds the data dir's lock,
// without creating or writing anything: nil if the dir, its lock file, or a
// holder is not there.
func dataDirHeld(dataDir string) error {
	path := filepath.Join(dataDir, lockFile)
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	}
	holder, _ := os.ReadFile(path)
	pid := strings.TrimSpace(string(holder))
	return fmt.Errorf("data dir %s is %w (pid %s%s%s): one agent per data dir", dataDir, ErrInUse, pid, processState(pid), openBy(path))
}

// LockHost takes the host's zones of the linux runtime's tag for this
// process (an agent, or a teardown), whatever its data dir: two agents with
// the same tag see each other's namespaces, links and processes, and each
// would take the other's for its own leftovers. Tests that use their own tags
// run side by side. The lock is released by closing the file, or by the
// process ending however it ends. Held by another process, it is an error
// naming that process and its data dir.
func LockHost(tag, dataDir string) (*os.File, error) {
	tag = cmp.Or(tag, DefaultZoneTag)
	if !validTag(tag) {
		return nil, fmt.Errorf("zone tag %q: want 1–20 bytes of [a-z0-9-]", tag)
	}
	path := hostLockPath(tag)
	err := os.MkdirAll(HostLockDir, 0o755)
	var f *os.File
	if err == nil {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("locking the host (the linux runtime needs root): %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("locking the host: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := cmp.Or(strings.TrimSpace(string(holder)), "a process that has not yet said who it is")
			return nil, fmt.Errorf("the zones of tag %q on this host are %w (%s%s; lock %s): one agent per host", tag, ErrInUse, who, openBy(path), path)
		}
		return nil, fmt.Errorf("locking the host (%s): %w", path, err)
	}
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+", data dir "+dataDir+"\n"), 0)
	}
	return f, nil
}

// processState says what state the process pid is in, as ", state D
// (disk sleep)", or ", gone" when there is no such process.
func processState(pid string) string {
	if _, err := strconv.Atoi(pid); err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return ", gone"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if st, ok := strings.CutPrefix(l, "State:"); ok {
			return ", state " + strings.TrimSpace(st)
		}
	}
	return ""
}

// openBy names the processes that have path open, as "; open in pid N
// (comm)…": the lock's holders, whose pid the file may not say (a process
// that inherited the descriptor holds the lock too). "" if none is found.
func openBy(path string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	seen := map[string]bool{}
	var who []string
	for _, fd := range procs {
		if target, err := os.Readlink(fd); err != nil || target != path {
			continue
		}
		pid := strings.Split(fd, "/")[2]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		who = append(who, "pid "+pid+" ("+strings.TrimSpace(string(comm))+")")
	}
	// A loop device holds its backing file open without a descriptor.
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		if b, err := os.ReadFile(bf); err == nil && strings.TrimSpace(string(b)) == path {
			who = append(who, "/dev/"+strings.Split(bf, "/")[3]+" (a loop device backed by it)")
		}
	}
	if len(who) == 0 {
		return ""
	}
	return "; open in " + strings.Join(who, ", ")
}

func hostLockPath(tag string) string {
	return filepath.Join(HostLockDir, "sled-agent-"+tag+".lock")
}

// RemoveHostLock removes the host lock file of a tag that tests or tools made
// up for themselves, once no process of theirs can take it any more; a lock
// file held by a process is left. Lock files are otherwise left in place:
// removing one that a starting agent has just opened would let a third take
// a new one beside it.
func RemoveHostLock(tag string) error {
	if !validTag(tag) || tag == DefaultZoneTag {
		return fmt.Errorf("zone tag %q: not a tag of one's own", tag)
	}
	path := hostLockPath(tag)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%s: %w", path, ErrInUse)
	}
	return os.Remove(path)
}

// lockFor takes what an agent or a teardown with cfg must hold: the data
// dir, and for the linux runtime the host's zones of its tag, both before
// anything touches the OS. The sim runtime touches no OS object (its
// simulated OS is a file in the data dir), so sim agents on one host need
// only their own data dirs.
func lockFor(cfg Config, log *slog.Logger) (io.Closer, error) {
	dir, waited, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if waited > 10*time.Millisecond && log != nil {
		log.Warn("the data dir's lock was released only after a wait; its last holder had ended", "waited", waited.Round(time.Millisecond))
	}
	if cfg.Runtime != "linux" {
		return dir, nil
	}
	host, err := LockHost(cfg.ZoneTag, cfg.DataDir)
	if err != nil {
		dir.Close()
		return nil, err
	}
	return locks{dir, host}, nil
}

// locks releases every lock it holds when closed.
type locks []*os.File

func (l locks) Close() error {
	var errs []error
	for _, f := range l {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// validTag accepts what the linux runtime accepts as a tag: 1–20 bytes of
// [a-z0-9-] (it is part of the lock's file name).
func validTag(s string) bool {
	if len(s) == 0 || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}
