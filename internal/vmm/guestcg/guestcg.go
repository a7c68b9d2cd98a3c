// Package guestcg confines a guest's QEMU in a cgroup of its own, with
// memory, CPU and task limits sized for the guest, on cgroup v2 or v1,
// whichever holds each controller on this host; and removes such cgroups.
//
// A guest's cgroup is named after its VMM's zone, under the zone runtime's
// tag ([Name]): sled-agent/<tag>/<zone>.guest below the root of each
// hierarchy it is made in:
//
//   - the cgroup v2 hierarchy, wherever there is one: QEMU is born in it
//     (clone3 into the cgroup), whatever controllers v2 holds, so that
//     cgroup.kill ends it and nothing else. Where v2 holds the memory, cpu
//     and pids controllers (a pure v2 host), the limits are there too
//     (memory.max, cpu.max, pids.max), once the controllers are enabled in
//     the cgroup.subtree_control of its ancestors: the root, sled-agent/
//     and the tag's directory, none of which holds a process;
//   - the cgroup v1 hierarchies of memory, cpu and pids, for each
//     controller v2 does not hold (a hybrid host, or one without v2):
//     QEMU's pid is written into their cgroup.procs as soon as it has
//     started, while it holds the guest paused (-S), and the limits are
//     memory.limit_in_bytes, cpu.cfs_quota_us per cpu.cfs_period_us and
//     pids.max.
//
// The guest's cgroup is the zone cgroup's sibling, not its child: cgroup
// v2 lets no cgroup that holds processes (the zone's holds runsv and the
// VMM service) enable controllers for its children.
//
// Confinement fails closed: a limit that cannot be set, or a directory
// QEMU cannot be put in, fails QEMU's start ([ErrNotConfined]), saying why;
// QEMU never runs with fewer limits than its guest's. The zone runtime
// removes the cgroups when it destroys the zone ([Host.Remove]).
package guestcg

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Suffix ends the name of a guest's cgroup: its zone's name, then Suffix.
const Suffix = ".guest"

// parent is the directory below a hierarchy's root that holds the zone
// runtime's tags (the linux runtime's cgroups are there too).
const parent = "sled-agent"

// Name is the name of the cgroup of the guest of zone, in the zone runtime
// of tag: its path below the root of each hierarchy.
func Name(tag, zone string) string { return path.Join(parent, tag, zone+Suffix) }

var elemRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidName checks that name is one Name makes: sled-agent/<tag>/<x>.guest,
// each part of letters, digits, '.', '_' and '-' (no "..").
func ValidName(name string) error {
	parts := strings.Split(name, "/")
	if len(parts) != 3 || parts[0] != parent || !strings.HasSuffix(parts[2], Suffix) || len(parts[2]) == len(Suffix) {
		return fmt.Errorf("guest cgroup %q: want %s/<tag>/<zone>%s", name, parent, Suffix)
	}
	for _, p := range parts[1:] {
		if !elemRe.MatchString(p) || p == "." || strings.Contains(p, "..") {
			return fmt.Errorf("guest cgroup %q: %q is not a plain name", name, p)
		}
	}
	return nil
}

// Controllers are the controllers a guest's cgroup limits.
var controllers = []string{"memory", "cpu", "pids"}

// Host is where this host's cgroup hierarchies are mounted.
type Host struct {
	// V2 is the cgroup v2 mount point; "" if there is none.
	V2 string
	// V1 maps each controller a guest's cgroup limits (memory, cpu, pids) to
	// the mount point of the v1 hierarchy that holds it, if one does.
	V1 map[string]string
	// write writes a cgroup file (writeFile); tests record it.
	write func(path, data string) error
}

func (h Host) writer() func(path, data string) error {
	if h.write != nil {
		return h.write
	}
	return writeFile
}

// Detect finds this host's hierarchies in /proc/self/mountinfo; a host
// whose mountinfo cannot be read has none.
func Detect() Host {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Host{}
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo reads the cgroup mounts of a mountinfo file: the first
// cgroup2 mount, and for each controller the first v1 mount holding it.
func parseMountinfo(r io.Reader) Host {
	h := Host{V1: map[string]string{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// "<id> <parent> <dev> <root> <mount point> <options> ... - <fstype> <source> <super options>"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		if len(f) < 5 || strings.Contains(f[4], `\`) { // an escaped (odd) mount point
			continue
		}
		mnt := f[4]
		p := strings.Fields(post)
		if len(p) < 3 {
			continue
		}
		switch p[0] {
		case "cgroup2":
			if h.V2 == "" {
				h.V2 = mnt
			}
		case "cgroup":
			for _, opt := range strings.Split(p[2], ",") {
				for _, c := range controllers {
					if opt == c && h.V1[c] == "" {
						h.V1[c] = mnt
					}
				}
			}
		}
	}
	return h
}

// Dir is one hierarchy's directory of a guest's cgroup.
type Dir struct {
	Path string
	V2   bool
}

// Dirs are the directories the guest cgroup name has, or would have, in
// each hierarchy of h: v2 first.
func (h Host) Dirs(name string) []Dir {
	var out []Dir
	for _, root := range h.roots() {
		out = append(out, Dir{Path: filepath.Join(root, name), V2: root == h.V2})
	}
	return out
}

// roots are the mount points of h's hierarchies that a guest's cgroup may
// be in: v2 first, then the v1 ones of memory and cpu (once each, should
// they be mounted together).
func (h Host) roots() []string {
	var out []string
	if h.V2 != "" {
		out = append(out, h.V2)
	}
	for _, c := range controllers {
		if m := h.V1[c]; m != "" && m != h.V2 && !contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

func contains(s []string, x string) bool {
	for _, e := range s {
		if e == x {
			return true
		}
	}
	return false
}
