package linux

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// cgroups gives each zone a cgroup (v2) of its own: runsv is born in it, so
// the zone's supervisor, service and everything they start are in it, and
// only they are. Killing a zone's processes is then one write to
// cgroup.kill, with no walk of /proc. Where there is no cgroup v2 file
// system, root is "" and the runtime finds processes by namespace instead.
type cgroups struct {
	root string // <cgroup2 mount>/sled-agent/<tag>
}

// newCgroups finds the cgroup v2 mount, if any.
func newCgroups(tag string) cgroups {
	mnt := cgroup2Mount()
	if mnt == "" {
		return cgroups{}
	}
	return cgroups{root: filepath.Join(mnt, "sled-agent", tag)}
}

// cgroup2Mount returns where the cgroup v2 file system is mounted, or "".
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "<id> <parent> <dev> <root> <mount point> <options> ... - <fstype> <source> <super options>"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 && !strings.Contains(f[4], `\`) {
			return f[4]
		}
	}
	return ""
}

func (c cgroups) available() bool { return c.root != "" }

func (c cgroups) dir(zone string) string { return filepath.Join(c.root, zone) }

// ensure creates the zone's cgroup.
func (c cgroups) ensure(zone string) (string, error) {
	d := c.dir(zone)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", fmt.Errorf("zone cgroup: %w", err)
	}
	return d, nil
}

// exists reports whether the zone has a cgroup.
func (c cgroups) exists(zone string) bool {
	if !c.available() {
		return false
	}
	_, err := os.Stat(filepath.Join(c.dir(zone), "cgroup.procs"))
	return err == nil
}

// kill kills every process in the zone's cgroup, waits (until ctx ends) for
// it to be empty, and removes it. A missing cgroup is not an error.
func (c cgroups) kill(ctx context.Context, zone string) error {
	d := c.dir(zone)
	// Most often the service and runsv have exited already: an empty
	// cgroup is simply removed (the kernel refuses, EBUSY, while it holds
	// a process).
	if err := os.Remove(d); err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("killing the zone's processes: %w", err)
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		ev, err := os.ReadFile(filepath.Join(d, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("zone cgroup: %w", err)
		}
		if bytes.Contains(ev, []byte("populated 0")) {
			break
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the zone's processes did not exit: %w", ctx.Err())
		case <-t.C:
		}
	}
	if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the zone cgroup: %w", err)
	}
	return nil
}

// RemoveEmptyDirs removes the runtime's own cgroup directories, in every
// hierarchy, if no zone or guest is left in them. Tests and benchmarks that
// use their own tag call it last.
func (r *Runtime) RemoveEmptyDirs() {
	r.guests.RemoveEmpty(r.opts.Tag)
	if !r.cg.available() {
		return
	}
	os.Remove(r.cg.root)
	os.Remove(filepath.Dir(r.cg.root)) // sled-agent/, if no other tag uses it
}

// Guests' cgroups.
//
// A VMM zone's service confines its guest's QEMU in a cgroup of its own
// (internal/vmm/guestcg): <zone>.guest next to the zone's cgroup, under
// this runtime's tag, in the v2 hierarchy and in the v1 ones of memory and
// cpu, as the host has them; the runtime names it in the service's command
// (--guest-cgroup). It is the zone's: Destroy kills what runs in it and
// removes it with the rest of the zone, Sweep finds it by its name when its
// zone is gone, and a dead sled's debris includes it once empty.

// guestCgroup is the name of the cgroup of the guest of the named zone
// (guestcg.Name); "" if the tag or the name cannot make one (then no
// service was given one either).
func (r *Runtime) guestCgroup(zone string) string {
	name := guestcg.Name(r.opts.Tag, zone)
	if guestcg.ValidName(name) != nil {
		return ""
	}
	return name
}

// removeGuestCgroup kills whatever runs in the named zone's guest cgroup,
// and removes it from every hierarchy, until ctx ends. A zone without one
// has nothing to do.
func (r *Runtime) removeGuestCgroup(ctx context.Context, zoneName string) error {
	name := r.guestCgroup(zoneName)
	if name == "" || !zone.IsVMM(zoneName) {
		return nil // only a VMM's zone runs a guest
	}
	removed, err := r.guests.Remove(ctx, name)
	if len(removed) > 0 {
		r.opts.Log.Debug("guest cgroup removed", "zone", zoneName, "dirs", removed)
	}
	if err != nil {
		return fmt.Errorf("guest cgroup: %w", err)
	}
	return nil
}
