package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

// Debris of a dead sled.
//
// A claim lasts as long as the run dir (one boot): an agent killed and its
// data dir removed leaves its zones' claims, and without more a new sled
// could never start a zone with one of those ids. So a zone's parts claimed
// by another sled are debris, removed (and logged) when that sled's zone is
// wanted here or at a sweep, when both hold:
//
//   - that sled's agent is gone: the lock its claim names (its data dir's
//     agent.lock, which an agent holds as long as it runs) is free, or
//     missing (its data dir is gone), or is our own data dir's (a sled that
//     used this data dir before ours: one agent per data dir). While the
//     debris is removed the runtime holds that lock, so that sled's agent
//     cannot start meanwhile;
//   - nothing of the zone lives: no namespace, no link with its mark, no
//     supervisor of its service directory, no process with that directory's
//     mark or in its cgroup or its guest's.
//
// What debris is: the service directory (with the claim), the zone's empty
// cgroup, its guest's empty cgroups and an NTP zone's command socket
// directory. Its root, in the other
// sled's data dir, is not ours to touch. Anything else of another sled's is
// refused, as before, with an error (OtherSledError) that says what lives
// and the teardown that clears it.

// DataDirLockFile is the file in a data dir that the agent using it holds
// an flock on for as long as it runs (agent.LockDataDir).
const DataDirLockFile = "agent.lock"

// OtherSledError is returned by Ensure when the zone's parts are another
// sled's and cannot be taken for debris: that sled's agent runs, or parts
// of the zone live. It wraps ErrOtherSled.
type OtherSledError struct {
	Zone    string
	Sled    string // the claiming sled
	DataDir string // its data dir, as its claim says
	// Why says why they are not debris: what lives, or that the sled's
	// agent runs.
	Why string
	// Teardown is the command an operator runs to clear them.
	Teardown string
}

func (e *OtherSledError) Error() string {
	return fmt.Sprintf("zone %s: %v: claimed by sled %s (data dir %s), and %s; to clear them: %s",
		e.Zone, ErrOtherSled, e.Sled, e.DataDir, e.Why, e.Teardown)
}

func (e *OtherSledError) Unwrap() error { return ErrOtherSled }

// claimLock is the lock the agent of claim c's sled holds while it runs; ""
// if the claim says nothing of where it is.
func claimLock(c claim) string {
	if c.Lock != "" {
		return c.Lock
	}
	if c.DataDir != "" {
		// A claim of the previous version: the agent's lock is in its
		// data dir.
		return filepath.Join(c.DataDir, DataDirLockFile)
	}
	return ""
}

// sledGone reports whether the agent of claim c's sled is gone, and why (or
// why not). If it is gone, release must be called once the debris is
// removed: until then the runtime holds that sled's lock, if it has one.
func (r *Runtime) sledGone(c claim) (gone bool, why string, release func()) {
	noop := func() {}
	lock := claimLock(c)
	switch {
	case lock == "":
		return false, "its claim names no data dir, so whether its agent runs cannot be told", noop
	case !filepath.IsAbs(lock):
		return false, "its claim names its lock by a relative path (" + lock + "), so whether its agent runs cannot be told", noop
	case filepath.Clean(lock) == r.opts.DataDirLock:
		return true, "it used this sled's data dir before (one agent per data dir)", noop
	}
	f, err := os.Open(lock)
	if errors.Is(err, fs.ErrNotExist) {
		return true, "its lock " + lock + " is gone (its data dir was removed)", noop
	}
	if err != nil {
		return false, "its lock " + lock + " cannot be read (" + err.Error() + ")", noop
	}
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return true, "its agent is gone (nobody holds its lock " + lock + ")", func() { f.Close() }
	case errors.Is(err, unix.EWOULDBLOCK):
		holder, _ := os.ReadFile(lock)
		f.Close()
		who := ""
		if pid := strings.TrimSpace(string(holder)); pid != "" {
			who = " (pid " + pid + ")"
		}
		return false, "its agent runs: it holds " + lock + who, noop
	default:
		f.Close()
		return false, "its lock " + lock + " cannot be probed (" + err.Error() + ")", noop
	}
}

// liveParts lists what of the named zone lives: its namespace, links with
// its mark, its supervisor, processes with its service directory's mark or
// in its cgroup. A look that fails counts as a live part: what cannot be
// seen is not known to be dead.
func (r *Runtime) liveParts(name string) []string {
	var live []string
	netns := r.netnsName(name)
	if zonenet.NetnsExists(netns) {
		live = append(live, "namespace "+netns)
	}
	if _, links, err := zonenet.List(netns, r.opts.Tag); err != nil {
		live = append(live, "links not known ("+err.Error()+")")
	} else {
		for _, l := range links {
			if strings.EqualFold(l.ZoneID, idFromName(name)) {
				live = append(live, "link "+l.Name)
			}
		}
	}
	svc := r.serviceDir(name)
	if p, found, err := supervise.Find(svc); err != nil {
		live = append(live, "supervisor not known ("+err.Error()+")")
	} else if found {
		live = append(live, fmt.Sprintf("supervisor runsv %d", p.PID))
		p.Close()
	}
	abs, err := filepath.Abs(svc)
	if err == nil {
		var procs []supervise.MarkedProcess
		if procs, err = supervise.ListMarked(r.serviceRoot()); err == nil {
			for _, p := range procs {
				if p.Dir == abs {
					live = append(live, fmt.Sprintf("process %d (%s)", p.PID, p.Comm))
				}
			}
		}
	}
	if err != nil {
		live = append(live, "processes not known ("+err.Error()+")")
	}
	if r.cg.exists(name) {
		ev, err := os.ReadFile(filepath.Join(r.cg.dir(name), "cgroup.events"))
		if err != nil || !bytes.Contains(ev, []byte("populated 0")) {
			live = append(live, "processes in cgroup "+r.cg.dir(name))
		}
	}
	if cg := r.guestCgroup(name); cg != "" {
		live = append(live, r.guests.Populated(cg)...)
	}
	return live
}

// removeDebris removes the named zone's debris (see above) and returns one
// line for each thing removed.
func (r *Runtime) removeDebris(name string) ([]string, error) {
	var lines []string
	var errs []error
	if svc := r.serviceDir(name); !missing(svc) {
		if err := os.RemoveAll(svc); err != nil {
			errs = append(errs, fmt.Errorf("service directory: %w", err))
		} else {
			lines = append(lines, "service dir "+svc)
		}
	}
	if r.cg.available() && !missing(r.cg.dir(name)) {
		// rmdir: the kernel refuses a cgroup that holds a process.
		if err := os.Remove(r.cg.dir(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup: %w", err))
		} else if err == nil {
			lines = append(lines, "cgroup "+r.cg.dir(name))
		}
	}
	if cg := r.guestCgroup(name); cg != "" {
		for _, d := range r.guests.Dirs(cg) {
			// rmdir, as above: its guest's QEMU is dead (liveParts).
			if err := os.Remove(d.Path); err == nil {
				lines = append(lines, "guest cgroup "+d.Path)
			} else if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("guest cgroup: %w", err))
			}
		}
	}
	if strings.HasPrefix(name, ntpZonePrefix) {
		id := idFromName(name)
		dir := chrony.SocketDir(r.opts.Tag, id)
		if had := !missing(dir); had {
			if err := r.removeSocketDir(name, id); err != nil {
				errs = append(errs, err)
			} else {
				lines = append(lines, "chrony socket dir "+dir)
			}
		}
	}
	return lines, errors.Join(errs...)
}

// clearDebris removes the named zone's parts that claim c, of another
// sled, left if they are debris, logging what it removed; else it returns
// an OtherSledError.
func (r *Runtime) clearDebris(ctx context.Context, name string, c claim) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := r.takeDebris(name, c, "removed the debris of a dead sled's zone")
	return err
}

// sweepDebris removes, for Sweep, the debris of every zone claimed by
// another sled, and returns what it removed, one line each; a zone that is
// not debris is left alone (findOrphans logs it).
func (r *Runtime) sweepDebris(ctx context.Context, claims map[string]claim) ([]string, []error) {
	var lines []string
	var errs []error
	for name, c := range claims {
		if c.Sled == r.opts.Sled || !zoneShaped(name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return lines, append(errs, err)
		}
		removed, err := r.takeDebris(name, c, "sweep: removed the debris of a dead sled's zone")
		for _, l := range removed {
			lines = append(lines, l+" (debris of sled "+c.Sled+")")
		}
		if err != nil && !errors.As(err, new(*OtherSledError)) {
			errs = append(errs, err)
		}
	}
	return lines, errs
}

// takeDebris removes the named zone's parts that claim c if they are
// debris, logs what it removed with msg, and returns it; parts that are not
// debris are left, and the error is an OtherSledError saying why.
func (r *Runtime) takeDebris(name string, c claim, msg string) ([]string, error) {
	gone, why, release := r.sledGone(c)
	defer release()
	if !gone {
		return nil, r.otherSled(name, c, why)
	}
	if live := r.liveParts(name); len(live) > 0 {
		return nil, r.otherSled(name, c, "parts of the zone live: "+strings.Join(live, ", "))
	}
	removed, err := r.removeDebris(name)
	if len(removed) > 0 {
		r.opts.Log.Info(msg, "zone", name, "sled", c.Sled, "data_dir", c.DataDir, "why", why, "removed", removed)
	}
	if err != nil {
		return removed, fmt.Errorf("zone %s: removing the debris of sled %s: %w", name, c.Sled, err)
	}
	return removed, nil
}

// otherSled is the error for a zone whose parts claim c's sled holds.
func (r *Runtime) otherSled(name string, c claim, why string) error {
	return &OtherSledError{Zone: name, Sled: c.Sled, DataDir: c.DataDir, Why: why, Teardown: r.teardownHint(c)}
}

// teardownHint is the command that clears the zones of claim c's sled,
// with what is known of it: its data dir (or, when that is gone or is
// ours, an empty one: teardown goes by the sled id given), its sled id, and
// this runtime's run dir, tag and namespace prefix where they are not the
// defaults.
func (r *Runtime) teardownHint(c claim) string {
	dataDir := c.DataDir
	pre := ""
	switch {
	case dataDir == "" || filepath.Clean(claimLock(c)) == r.opts.DataDirLock:
		dataDir = "$(mktemp -d)"
	case missing(dataDir):
		pre = "mkdir -p " + dataDir + " && "
	}
	args := []string{"sled-agent", "teardown", "--runtime", "linux", "--data-dir", dataDir, "--sled-id", c.Sled}
	if r.opts.RunDir != defaultRunDir {
		args = append(args, "--run-dir", r.opts.RunDir)
	}
	if r.opts.Tag != defaultTag {
		args = append(args, "--zone-tag", r.opts.Tag)
	}
	if r.opts.NetnsPrefix != "" {
		args = append(args, "--netns-prefix", r.opts.NetnsPrefix)
	}
	args = append(args, "--yes")
	return pre + strings.Join(args, " ") + " (with that sled's agent, and any agent of tag " + r.opts.Tag + " on this host, stopped)"
}
