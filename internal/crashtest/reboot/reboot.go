// Package reboot simulates a host reboot for one agent's objects: what a
// reboot takes away (every process, network namespace, link, cgroup, mount,
// loop device and the per-boot run directory) is removed, and what it keeps
// (the data dir, the vdev files and the pools' data on them) is left. The
// crash test and the agent's cold-boot tests use it between an agent and the
// next one started on the same data dir.
//
// It touches only what carries the host's unique tag and prefix, or lies
// under its own directories: never another agent's zones, nor anything of
// the real host.
package reboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
)

// Host names one agent's objects on this machine.
type Host struct {
	// Tag is the agent's zone tag (--zone-tag): its cgroups
	// (sled-agent/<tag>), its links' aliases, its service directories
	// (<RunDir>/<tag>) and its NTP zones' socket directories
	// (/run/sled-agent-ntp/<tag>-*). It must be one of the caller's own,
	// not the default.
	Tag string
	// NetnsPrefix starts the name of every namespace of its zones
	// (--netns-prefix); required, so that no other namespace is touched.
	NetnsPrefix string
	// RunDir is its run dir (--run-dir), which lasts one boot: emptied.
	RunDir string
	// PoolRoot is where its pools are mounted (--pool-root): everything
	// mounted under it is unmounted.
	PoolRoot string
	// VdevDir holds its file-backed disks (--vdev-dir): their loop devices
	// are detached. The files stay, as disks do.
	VdevDir string
	// Services are the agent's own service directories beside its zones'
	// (its data path's, agent.VPCServiceDir): their supervisors and every
	// process carrying their marks are killed. Each must be under RunDir.
	Services []string
}

// Deadline bounds a whole reboot: processes that do not die, cgroups that
// do not empty by then make it fail.
const Deadline = time.Minute

// Reboot does to h's objects what a host reboot does. The agent itself must
// be dead already (the caller killed or stopped it): Reboot kills what it
// started, its zones' supervisors, services and guests, through the zones'
// cgroups, their namespaces, the marks of their service directories and
// their supervisors' directories; then removes the namespaces, the links,
// the cgroups and the NTP socket directories, unmounts the pools, detaches
// the loop devices and empties the run dir. It returns one line per kind of
// thing removed, for the log.
func Reboot(ctx context.Context, h Host) ([]string, error) {
	if err := h.valid(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, Deadline)
	defer cancel()
	var done []string
	killed, err := h.killAll(ctx)
	done = append(done, fmt.Sprintf("%d processes killed", killed))
	if err != nil {
		return done, err
	}
	var errs []error
	n, err := h.removeCgroups(ctx)
	done = append(done, fmt.Sprintf("%d cgroups removed", n))
	errs = append(errs, err)
	n, err = h.removeNetwork(ctx)
	done = append(done, fmt.Sprintf("%d namespaces removed, with their links", n))
	errs = append(errs, err)
	socks, _ := filepath.Glob(filepath.Join(chrony.SocketRoot, h.Tag+"-*"))
	for _, d := range socks {
		errs = append(errs, os.RemoveAll(d))
	}
	done = append(done, fmt.Sprintf("%d NTP socket dirs removed", len(socks)))
	// The run dir first: nothing should be mounted there, but whatever is
	// goes before its files do.
	for _, dir := range []string{h.RunDir, h.PoolRoot} {
		mounts := btrfs.Mounts(dir)
		if err := btrfs.ReleaseUnder(ctx, dir); err != nil {
			errs = append(errs, err)
		}
		done = append(done, fmt.Sprintf("%d mounts under %s unmounted", len(mounts), dir))
	}
	loops := btrfs.LoopsBackedBy(h.VdevDir)
	if err := h.detachLoops(ctx); err != nil {
		errs = append(errs, err)
	}
	done = append(done, fmt.Sprintf("%d loop devices detached", len(loops)))
	n, err = emptyDir(h.RunDir)
	done = append(done, fmt.Sprintf("%d entries of the run dir removed", n))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return done, err
	}
	return done, h.check()
}

// check says what of h's is left that a reboot takes away: nil if nothing.
func (h Host) check() error {
	var left []string
	if procs, err := h.processes(); err != nil {
		return err
	} else if len(procs) > 0 {
		left = append(left, fmt.Sprintf("processes %v", slices.Sorted(maps.Keys(procs))))
	}
	namespaces, links, err := zonenet.List(h.NetnsPrefix, h.Tag)
	if err != nil {
		return fmt.Errorf("reboot: %w", err)
	}
	if len(namespaces)+len(links) > 0 {
		left = append(left, fmt.Sprintf("namespaces %v, links %+v", namespaces, links))
	}
	if d := h.cgroupDirs(); len(d) > 0 {
		left = append(left, fmt.Sprintf("cgroups %+v", d))
	}
	if socks, _ := filepath.Glob(filepath.Join(chrony.SocketRoot, h.Tag+"-*")); len(socks) > 0 {
		left = append(left, fmt.Sprintf("NTP socket dirs %v", socks))
	}
	for _, dir := range []string{h.RunDir, h.PoolRoot} {
		if m := btrfs.Mounts(dir); len(m) > 0 {
			left = append(left, fmt.Sprintf("mounts %v", m))
		}
	}
	if l := btrfs.LoopsBackedBy(h.VdevDir); len(l) > 0 {
		left = append(left, fmt.Sprintf("loop devices %v", l))
	}
	if ents, _ := os.ReadDir(h.RunDir); len(ents) > 0 {
		left = append(left, fmt.Sprintf("%d entries in the run dir", len(ents)))
	}
	if len(left) > 0 {
		return fmt.Errorf("reboot: left behind: %s", strings.Join(left, "; "))
	}
	return nil
}

func (h Host) valid() error {
	switch {
	case h.Tag == "" || h.Tag == "sled-agent" || strings.ContainsAny(h.Tag, "/."):
		return fmt.Errorf("reboot: tag %q: want a tag of one's own", h.Tag)
	case h.NetnsPrefix == "" || strings.HasPrefix(sledconfig.ZoneNamePrefix, h.NetnsPrefix) || strings.HasPrefix(h.NetnsPrefix, sledconfig.ZoneNamePrefix):
		// A prefix that "oxz_" starts with, or that starts with it, would
		// take in the namespaces of an agent without a prefix.
		return fmt.Errorf("reboot: namespace prefix %q: want a prefix of one's own", h.NetnsPrefix)
	}
	for _, d := range []string{h.RunDir, h.PoolRoot, h.VdevDir} {
		if !filepath.IsAbs(d) || filepath.Clean(d) == "/" {
			return fmt.Errorf("reboot: directory %q: want an absolute path of one's own", d)
		}
	}
	for _, d := range h.Services {
		if rel, err := filepath.Rel(h.RunDir, d); err != nil || !filepath.IsAbs(d) || rel == "." || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("reboot: service directory %q: want one under the run dir %s", d, h.RunDir)
		}
	}
	return nil
}

// killAll kills every process of h's zones until none is left (a
// supervisor may restart a service between two looks), and returns how
// many it killed.
func (h Host) killAll(ctx context.Context) (int, error) {
	killed := map[int]bool{}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		procs, err := h.processes()
		if err != nil {
			return len(killed), err
		}
		if len(procs) == 0 {
			return len(killed), nil
		}
		// Every v2 cgroup below the tag's dies in one write; the rest
		// (v1 guest cgroups, processes found by namespace or mark) one
		// by one.
		if d := h.cgroupDirs(); len(d) > 0 && d[0].V2 {
			if err := os.WriteFile(filepath.Join(d[0].Path, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return len(killed), fmt.Errorf("reboot: killing cgroup %s: %w", d[0].Path, err)
			}
		}
		for pid, still := range procs {
			killPID(pid, still)
			killed[pid] = true
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return len(killed), fmt.Errorf("reboot: processes %v still alive: %w", slices.Sorted(maps.Keys(procs)), ctx.Err())
		case <-t.C:
		}
	}
}

// processes are the live processes of h's zones, each with a check that
// it still is one (for the pid's reuse): those in h's cgroups (every
// hierarchy), in h's namespaces, marked with one of h's service
// directories, and the supervisors of those directories.
func (h Host) processes() (map[int]func() bool, error) {
	out := map[int]func() bool{}
	for _, d := range h.cgroupDirs() {
		_ = filepath.WalkDir(d.Path, func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					out[pid] = func() bool { return inCgroup(pid, path) }
				}
			}
			return nil
		})
	}
	namespaces, _, err := zonenet.List(h.NetnsPrefix, h.Tag)
	if err != nil {
		return nil, fmt.Errorf("reboot: %w", err)
	}
	nets := map[string]bool{}
	for _, ns := range namespaces {
		var st unix.Stat_t
		if unix.Stat(zonenet.NetnsPath(ns), &st) == nil {
			nets["net:["+strconv.FormatUint(st.Ino, 10)+"]"] = true
		}
	}
	if len(nets) > 0 {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if link, _ := os.Readlink("/proc/" + e.Name() + "/ns/net"); nets[link] {
				out[pid] = func() bool {
					link, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
					return nets[link]
				}
			}
		}
	}
	services := filepath.Join(h.RunDir, h.Tag)
	marked, err := supervise.ListMarked(services)
	if err != nil {
		return nil, fmt.Errorf("reboot: %w", err)
	}
	for _, p := range marked {
		out[p.PID] = func() bool { return true } // ListMarked read its mark a moment ago
	}
	dirs, _ := os.ReadDir(services)
	supervised := slices.Clone(h.Services)
	for _, d := range dirs {
		if d.IsDir() {
			supervised = append(supervised, filepath.Join(services, d.Name()))
		}
	}
	for _, dir := range supervised {
		p, ok, err := supervise.Find(dir)
		if err == nil && ok {
			pid := p.PID
			p.Close()
			out[pid] = func() bool { return runsvOf(pid, dir) }
		}
	}
	if len(h.Services) > 0 {
		marked, err := supervise.ListMarked(h.RunDir)
		if err != nil {
			return nil, fmt.Errorf("reboot: %w", err)
		}
		for _, p := range marked {
			if slices.Contains(h.Services, p.Dir) {
				out[p.PID] = func() bool { return true }
			}
		}
	}
	return out, nil
}

// killPID SIGKILLs pid through a pidfd, if still says, once the pidfd pins
// it, that it is the process meant.
func killPID(pid int, still func() bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	if still() {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// runsvOf reports whether pid is a runsv working in dir or naming it on its
// command line.
func runsvOf(pid int, dir string) bool {
	p := "/proc/" + strconv.Itoa(pid)
	comm, _ := os.ReadFile(p + "/comm")
	if strings.TrimSpace(string(comm)) != "runsv" {
		return false
	}
	cwd, _ := os.Readlink(p + "/cwd")
	cmd, _ := os.ReadFile(p + "/cmdline")
	return cwd == dir || slices.Contains(strings.Split(string(cmd), "\x00"), dir)
}

func inCgroup(pid int, dir string) bool {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
}

// cgroupDirs are the tag's directories in every cgroup hierarchy that the
// runtime puts zones or guests in: v2 first.
func (h Host) cgroupDirs() []guestcg.Dir {
	var out []guestcg.Dir
	for _, d := range guestcg.Detect().Dirs(guestcg.Name(h.Tag, "zone")) {
		d.Path = filepath.Dir(d.Path)
		if _, err := os.Stat(d.Path); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// removeCgroups removes the tag's cgroups, deepest first, once empty, and
// the tag's own directory; the shared parent goes only if it is empty.
func (h Host) removeCgroups(ctx context.Context) (int, error) {
	n := 0
	var errs []error
	for _, d := range h.cgroupDirs() {
		var dirs []string
		_ = filepath.WalkDir(d.Path, func(path string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs) // children before their parents
		for _, dir := range dirs {
			if err := rmdirCgroup(ctx, dir); err != nil {
				errs = append(errs, err)
				continue
			}
			n++
		}
		os.Remove(filepath.Dir(d.Path)) // sled-agent/, if no other tag uses it
	}
	return n, errors.Join(errs...)
}

// rmdirCgroup removes an empty cgroup, waiting while the kernel still
// counts a process that was just killed in it (EBUSY).
func rmdirCgroup(ctx context.Context, dir string) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("reboot: removing cgroup %s: %w", dir, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("reboot: removing cgroup %s: %w", dir, errors.Join(err, ctx.Err()))
		case <-t.C:
		}
	}
}

// removeNetwork removes h's namespaces, then the links with h's tag that
// are left (a veth pair goes with its namespace end; a link without one
// stays until deleted).
func (h Host) removeNetwork(ctx context.Context) (int, error) {
	namespaces, _, err := zonenet.List(h.NetnsPrefix, h.Tag)
	if err != nil {
		return 0, fmt.Errorf("reboot: %w", err)
	}
	n := 0
	var errs []error
	for _, ns := range namespaces {
		if err := zonenet.RemoveNetns(ns); err != nil {
			errs = append(errs, fmt.Errorf("reboot: %w", err))
			continue
		}
		n++
	}
	// The kernel frees a namespace, and its end of each pair, a moment
	// after its last reference goes, and the host end with it: look again
	// until no link of the tag is left. One left a while later (a pair
	// whose zone end never made it into the namespace) is deleted; a
	// deletion that fails (the link half torn down meanwhile) is tried
	// again until the deadline.
	var last error
	since := time.Now()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		_, links, err := zonenet.List(h.NetnsPrefix, h.Tag)
		if err != nil {
			return n, errors.Join(append(errs, fmt.Errorf("reboot: %w", err))...)
		}
		if len(links) == 0 {
			return n, errors.Join(errs...)
		}
		if time.Since(since) > time.Second {
			ids := map[string]bool{}
			for _, l := range links {
				ids[l.ZoneID] = true
			}
			for id := range ids {
				if err := zonenet.RemoveLinks(ctx, h.Tag, id); err != nil {
					last = err
				}
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return n, errors.Join(append(errs, fmt.Errorf("reboot: links %+v left: %w", links, errors.Join(ctx.Err(), last)))...)
		case <-t.C:
		}
	}
}

// detachLoops detaches the loop devices of the vdev files until none is
// left. A loop device still open (a pool's filesystem closing it a moment
// after its unmount, a probe of the device) is only marked to go when
// closed, so it is looked for again until the deadline.
func (h Host) detachLoops(ctx context.Context) error {
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		err := btrfs.ReleaseUnder(ctx, h.VdevDir)
		left := btrfs.LoopsBackedBy(h.VdevDir)
		if len(left) == 0 {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("reboot: loop devices %v still attached: %w", left, errors.Join(err, ctx.Err()))
		case <-t.C:
		}
	}
}

// emptyDir removes everything in dir, and returns how many entries it
// held.
func emptyDir(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reboot: %w", err)
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return len(ents), errors.Join(errs...)
}
