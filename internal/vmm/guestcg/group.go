package guestcg

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNotConfined is a start refused because QEMU could not be confined as
// its guest's cgroup says: a limit not set, or QEMU not put in a
// directory of its cgroup. QEMU then does not run.
var ErrNotConfined = errors.New("QEMU cannot be confined")

// Group is one guest's cgroup, as Make made it: where each limit was
// written, or why it was not; Start puts QEMU in it.
type Group struct {
	name   string
	limits Limits
	v2     string   // its v2 directory; "" if none
	v2why  string   // why there is no v2 directory on a host that has v2
	v1     []string // its v1 directories: QEMU's pid is written into each
	memory limit
	cpu    limit
	pids   limit
	write  func(path, data string) error
}

// limit is where one limit is written, or why it is not.
type limit struct {
	dir string // the directory whose files hold it; "" if it is not set
	v2  bool
	why string // why it is not set
}

// limit is where controller c's limit is.
func (g *Group) limit(c string) *limit {
	switch c {
	case "memory":
		return &g.memory
	case "cpu":
		return &g.cpu
	}
	return &g.pids
}

// Make makes the cgroup name (see Name) of a guest with limits l in h's
// hierarchies, and writes the limits (see the package's doc). What it
// could not do, the returned Group says (String), and its Start refuses to
// start QEMU.
func Make(h Host, name string, l Limits) *Group {
	g := &Group{name: name, limits: l, write: h.writer()}
	if err := ValidName(name); err != nil {
		g.memory.why, g.cpu.why, g.pids.why = err.Error(), err.Error(), err.Error()
		return g
	}
	var v2ctl map[string]bool
	v2why := "there is no cgroup v2 hierarchy"
	if h.V2 != "" {
		dir := filepath.Join(h.V2, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			v2why = fmt.Sprintf("cgroup v2: %v", err)
			g.v2why = v2why
		} else {
			g.v2 = dir
			v2ctl, v2why = v2Controllers(h.V2)
		}
	}
	for _, c := range controllers {
		p := g.limit(c)
		switch {
		case v2ctl[c]:
			*p = g.limitV2(h.V2, c)
		case h.V1[c] != "":
			*p = g.limitV1(h.V1[c], c)
		case v2ctl != nil:
			p.why = "no cgroup hierarchy holds the " + c + " controller (cgroup v2 offers " + v2Offers(v2ctl) + ")"
		default:
			p.why = "no cgroup hierarchy holds the " + c + " controller (" + v2why + ")"
		}
	}
	return g
}

// None is a Group that confines nothing, for why: its Start refuses to
// start QEMU.
func None(why string) *Group {
	return &Group{memory: limit{why: why}, cpu: limit{why: why}, pids: limit{why: why}, write: writeFile}
}

// v2Controllers reads the controllers v2's root offers (cgroup.controllers).
func v2Controllers(root string) (map[string]bool, string) {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Sprintf("cgroup v2: %v", err)
	}
	out := map[string]bool{}
	for _, c := range strings.Fields(string(b)) {
		out[c] = true
	}
	return out, ""
}

func v2Offers(ctl map[string]bool) string {
	var out []string
	for c := range ctl {
		out = append(out, c)
	}
	if len(out) == 0 {
		return "none"
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// limitV2 enables controller c for the guest's cgroup (in every ancestor's
// cgroup.subtree_control, from v2's root down) and writes its limit.
func (g *Group) limitV2(root, c string) limit {
	dirs := []string{root}
	for d := root; ; {
		rel, _ := filepath.Rel(d, g.v2)
		first, _, more := strings.Cut(rel, "/")
		if !more {
			break
		}
		d = filepath.Join(d, first)
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := enable(g.write, d, c); err != nil {
			return limit{why: fmt.Sprintf("cgroup v2: enabling the %s controller in %s: %v", c, d, err)}
		}
	}
	if err := g.writeLimit(g.v2, c, true); err != nil {
		return limit{why: "cgroup v2: " + err.Error()}
	}
	return limit{dir: g.v2, v2: true}
}

// enable enables controller c for the children of the v2 cgroup dir, if it
// is not enabled already.
func enable(write func(path, data string) error, dir, c string) error {
	f := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	for _, e := range strings.Fields(string(b)) {
		if e == c {
			return nil
		}
	}
	return write(f, "+"+c)
}

// limitV1 makes the guest's cgroup in the v1 hierarchy mounted at mnt and
// writes controller c's limit.
func (g *Group) limitV1(mnt, c string) limit {
	dir := filepath.Join(mnt, g.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return limit{why: "cgroup v1: " + err.Error()}
	}
	if !contains(g.v1, dir) {
		g.v1 = append(g.v1, dir)
	}
	if err := g.writeLimit(dir, c, false); err != nil {
		return limit{why: "cgroup v1: " + err.Error()}
	}
	return limit{dir: dir}
}

// writeLimit writes controller c's limit into dir.
func (g *Group) writeLimit(dir, c string, v2 bool) error {
	us := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	var files [][2]string
	switch {
	case c == "memory" && v2:
		files = [][2]string{{"memory.max", strconv.FormatInt(g.limits.MemoryBytes, 10)}}
	case c == "memory":
		files = [][2]string{{"memory.limit_in_bytes", strconv.FormatInt(g.limits.MemoryBytes, 10)}}
	case c == "cpu" && v2:
		files = [][2]string{{"cpu.max", us(g.limits.CPUQuota) + " " + us(g.limits.CPUPeriod)}}
	case c == "cpu":
		// The period first: the quota is checked against it.
		files = [][2]string{{"cpu.cfs_period_us", us(g.limits.CPUPeriod)}, {"cpu.cfs_quota_us", us(g.limits.CPUQuota)}}
	case c == "pids":
		files = [][2]string{{"pids.max", strconv.FormatInt(g.limits.Pids, 10)}}
	}
	for _, f := range files {
		if err := g.write(filepath.Join(dir, f[0]), f[1]); err != nil {
			return fmt.Errorf("writing %s: %w", f[0], err)
		}
	}
	return nil
}

// writeFile writes a cgroup file, which must exist: the kernel makes them.
func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(s))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Start returns a Start hook that starts QEMU's command with next (nil:
// (*exec.Cmd).Start) in the guest's cgroup: born in its v2 directory
// (SysProcAttr.UseCgroupFD), then its pid written into the v1 ones. QEMU
// holds the guest paused until it is told to run it, so it runs no guest
// code before it is in place. It fails closed: a limit Make could not
// set, or a directory QEMU cannot be put in, fails the start (ErrNotConfined),
// and a QEMU started but not placed is killed and reaped first.
func (g *Group) Start(next func(*exec.Cmd) error) func(*exec.Cmd) error {
	if next == nil {
		next = (*exec.Cmd).Start
	}
	return func(cmd *exec.Cmd) error {
		if why := g.unset(); why != "" {
			return fmt.Errorf("%w: %s", ErrNotConfined, why)
		}
		if g.v2 != "" {
			f, err := os.Open(g.v2)
			if err != nil {
				return fmt.Errorf("%w: cgroup v2: %w", ErrNotConfined, err)
			}
			defer f.Close()
			if cmd.SysProcAttr == nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{}
			}
			cmd.SysProcAttr.UseCgroupFD = true
			cmd.SysProcAttr.CgroupFD = int(f.Fd())
			if err := next(cmd); err != nil {
				return fmt.Errorf("in cgroup %s: %w", g.v2, err)
			}
		} else if err := next(cmd); err != nil {
			return err
		}
		pid := strconv.Itoa(cmd.Process.Pid)
		for _, d := range g.v1 {
			if err := g.write(filepath.Join(d, "cgroup.procs"), pid); err != nil {
				// Not where its limits are: it does not run.
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				return fmt.Errorf("%w: QEMU could not be put in %s: %w", ErrNotConfined, d, err)
			}
		}
		return nil
	}
}

// unset says why a limit is not set, or QEMU would not be born in its v2
// cgroup; "" if all is in place.
func (g *Group) unset() string {
	var why []string
	if g.v2why != "" {
		why = append(why, g.v2why)
	}
	for _, c := range controllers {
		if l := g.limit(c); l.dir == "" {
			why = append(why, c+" not limited: "+l.why)
		}
	}
	return strings.Join(why, "; ")
}

// String says how QEMU is confined, or why it cannot be, for people: which
// cgroup version holds each limit.
func (g *Group) String() string {
	var set, unset []string
	for _, l := range []struct {
		what, value string
		limit
	}{{"memory", g.limits.memory(), g.memory}, {"CPU", g.limits.cpu(), g.cpu}, {"tasks", g.limits.pids(), g.pids}} {
		if l.dir != "" {
			set = append(set, fmt.Sprintf("%s ≤ %s (cgroup %s)", l.what, l.value, version(l.v2)))
		} else {
			unset = append(unset, l.what+" not limited: "+l.why)
		}
	}
	var b strings.Builder
	switch {
	case len(set) == 0 && g.memory.why == g.cpu.why && g.cpu.why == g.pids.why && g.memory.why != "":
		return "not confined: " + g.memory.why
	case len(set) == 0:
		b.WriteString("not confined")
	default:
		b.WriteString("confined in cgroup " + g.name + ": " + strings.Join(set, ", "))
	}
	for _, u := range unset {
		b.WriteString("; " + u)
	}
	if g.v2why != "" {
		b.WriteString("; not born in its cgroup: " + g.v2why)
	}
	return b.String()
}

func version(v2 bool) string {
	if v2 {
		return "v2"
	}
	return "v1"
}

// MemoryKill says, once QEMU has exited, that the memory limit of its
// cgroup killed it (the kernel's OOM killer counted a kill in it:
// memory.events' oom_kill on v2, memory.oom_control's on v1); "" if it did
// not, or if that cannot be told.
func (g *Group) MemoryKill() string {
	if g.memory.dir == "" {
		return ""
	}
	file := filepath.Join(g.memory.dir, "memory.oom_control")
	if g.memory.v2 {
		file = filepath.Join(g.memory.dir, "memory.events")
	}
	n := oomKills(file)
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf("killed by its cgroup's memory limit of %s (oom_kill %d in %s)", g.limits.memory(), n, file)
}

// oomKills reads the "oom_kill N" line of a memory controller's file; -1
// if there is none.
func oomKills(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// Populated lists the directories of the guest cgroup name that hold a
// process, or whose processes cannot be read (what cannot be seen is not
// known to be empty).
func (h Host) Populated(name string) []string {
	var out []string
	for _, d := range h.Dirs(name) {
		pids, err := readPIDs(d.Path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			out = append(out, fmt.Sprintf("cgroup %s (processes not known: %v)", d.Path, err))
		case len(pids) > 0:
			out = append(out, fmt.Sprintf("processes %v in cgroup %s", pids, d.Path))
		}
	}
	return out
}
