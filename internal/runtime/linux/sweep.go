package linux

import (
	"bytes"
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
	"syscall"

	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
)

// Sweep removes every part that carries this runtime's marks but belongs
// to no zone that List reports: namespaces, host links, service directories
// with their supervisors, marked processes, per-zone cgroups and guests'
// cgroups (<zone>.guest, in every hierarchy) with what runs in them, left by a
// zone whose root was removed or by an Ensure or Destroy that a crash cut
// short; and the legacy zone roots in our data dir that hold no readable
// mark (a crash between creating a root and renaming its mark into place
// leaves one). A root dataset without our mark is the storage reconciler's
// (a zone dataset not yet used, see roots.go) and is left alone, whatever
// is in it. Roots whose mark carries another tag or names another sled are not
// ours and are left alone, as are parts whose names no zone could have, and
// parts of a zone whose root is not ours that no claim of our sled proves
// ours (see claim.go): those are logged as not ours, unless they are the
// debris of a dead sled (see debris.go), which it removes. It writes the
// claims of our zones that have none (made by the previous version). It
// returns one line per thing removed, for people (e.g. "link
// ozu0123456789ab of zone <id>", "namespace <name>", "process 1234 (sleep)
// of service dir ...", "zone root <path> without a valid mark").
//
// The agent calls it once, at start-up, before it acts on the zones and
// while no Ensure or Destroy runs: to Sweep, a zone still being made looks
// like litter. A failure does not stop it; it returns every error joined.
// When ctx ends it stops acting and reports what it did.
func (r *Runtime) Sweep(ctx context.Context) ([]string, error) {
	zones, unmarked, err := r.knownZones(ctx)
	if err != nil {
		// Without knowing every zone, anything could be one's.
		return nil, fmt.Errorf("sweep: %w", err)
	}
	// Debris of dead sleds first: what it removes is no orphan's.
	debris, errs := r.sweepDebris(ctx, zones.claims)
	o, err := r.findOrphans(zones)
	errs = append(errs, err)
	errs = append(errs, r.removeOrphans(ctx, o)...)
	lines, err := r.gone(o)
	lines = append(debris, lines...)
	errs = append(errs, err)
	removed, rerrs := r.removeUnmarkedRoots(ctx, unmarked)
	lines = append(lines, removed...)
	errs = append(errs, rerrs...)
	if err := errors.Join(errs...); err != nil {
		return lines, fmt.Errorf("sweep: %w", err)
	}
	return lines, nil
}

// zoneSet is what the roots carrying our mark say exists.
type zoneSet struct {
	names map[string]bool // names in the marks, and of the roots' directories
	ids   map[string]bool // lower case
	netns map[string]bool
	// claims are the service directories' claims by zone name, and by
	// zone id (lower case), as they were before the sweep acted.
	claims   map[string]claim
	idClaims map[string]claim
}

// claimedOurs reports whether claim c (ok: there is one) is our sled's; if
// not, why, for the log.
func (r *Runtime) claimedOurs(c claim, ok bool) (bool, string) {
	if ok && c.Sled == r.opts.Sled {
		return true, ""
	}
	return false, sledOf(c, ok)
}

// knownZones reads every root as List does and returns the zones, and the
// roots that hold no valid mark. A mark it could not read for want of
// resources (descriptors, memory) is an error: it says nothing of the root.
func (r *Runtime) knownZones(ctx context.Context) (zoneSet, []string, error) {
	zs := zoneSet{names: map[string]bool{}, ids: map[string]bool{}, netns: map[string]bool{}}
	paths, err := r.rootPaths()
	if err != nil {
		return zs, nil, err
	}
	var unmarked, unclaimed []string
	for _, root := range paths {
		if err := ctx.Err(); err != nil {
			return zs, nil, err
		}
		o, err := readOwner(root)
		switch {
		case err == nil && r.ourMark(o):
			zs.names[o.Name] = true
			zs.names[filepath.Base(root)] = true
			zs.ids[strings.ToLower(o.ID)] = true
			zs.netns[o.Netns] = true
			unclaimed = append(unclaimed, o.Name)
		case err == nil && o.Tag == r.opts.Tag:
			r.opts.Log.Warn("sweep: not ours: leaving alone a zone root whose mark names another sled", "root", root, "sled", o.Sled)
		case err == nil:
			// Another agent's, or no one's: not ours to judge.
		case transient(err):
			return zs, nil, fmt.Errorf("reading the mark of %s: %w", root, err)
		case r.livesUnmarked(root):
			// Its mark is lost or damaged, but the zone's parts exist:
			// a crash while the root was made leaves none (the mark is
			// renamed into place before anything else of the zone is
			// made). Not knowing what it is, is not knowing that it is
			// unwanted: it is left alone, parts and root.
			name := filepath.Base(root)
			r.opts.Log.Warn("sweep: leaving alone a zone whose root's mark cannot be read but whose parts exist", "root", root, "err", err)
			zs.names[name] = true
			zs.ids[idFromName(name)] = true
			zs.netns[r.netnsName(name)] = true
		default:
			unmarked = append(unmarked, root)
		}
	}
	// Our zones that have parts but no claim were made by the previous
	// version: their roots prove them ours, and now their claims do.
	for _, name := range unclaimed {
		if _, ok := r.readClaim(name); ok || missing(r.serviceDir(name)) && !zonenet.NetnsExists(r.netnsName(name)) {
			continue
		}
		if err := r.claimZone(ctx, name); err != nil {
			r.opts.Log.Warn("sweep: not claiming a zone of ours", "zone", name, "err", err)
		}
	}
	if zs.claims, err = r.claims(); err != nil {
		return zs, nil, fmt.Errorf("reading claims: %w", err)
	}
	zs.idClaims = map[string]claim{}
	for name, c := range zs.claims {
		if zoneShaped(name) {
			zs.idClaims[idFromName(name)] = c
		}
	}
	return zs, unmarked, nil
}

// livesUnmarked reports whether the zone of root, whose mark cannot be
// read, has parts: its namespace or its service directory.
func (r *Runtime) livesUnmarked(root string) bool {
	name := filepath.Base(root)
	if !zoneShaped(name) {
		return false
	}
	return !missing(r.serviceDir(name)) || zonenet.NetnsExists(r.netnsName(name))
}

// transient reports whether err is a failure of the reader, not of the file.
func transient(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// orphans are the parts with our marks that belong to no zone, as they were
// before the sweep acted.
type orphans struct {
	zones      map[string]bool // names of the (dead) zones the parts are of
	namespaces []string
	links      []zonenet.Link
	services   []string // service directories
	cgroups    []string // cgroup directories
	procs      []supervise.MarkedProcess
}

// findOrphans lists what carries our marks and keeps what belongs to no
// zone in zones. A part it could not list is an error; the others are
// still returned.
func (r *Runtime) findOrphans(zones zoneSet) (orphans, error) {
	o := orphans{zones: map[string]bool{}}
	var errs []error
	nss, links, err := zonenet.List(r.netnsName(sledconfig.ZoneNamePrefix), r.opts.Tag)
	errs = append(errs, err)
	// Probes' zones and their links are the probes reconciler's
	// (internal/probes), which keeps and removes them: not the zones'.
	probeIDs := map[string]bool{}
	for _, ns := range nss {
		if id, ok := strings.CutPrefix(ns, r.netnsName(probes.ZonePrefix)); ok {
			probeIDs[strings.ToLower(id)] = true
			continue
		}
		if !zones.netns[ns] && r.adopt(&o, zones, strings.TrimPrefix(ns, r.opts.NetnsPrefix), "namespace "+ns) {
			o.namespaces = append(o.namespaces, ns)
		}
	}
	for _, l := range links {
		id := strings.ToLower(l.ZoneID)
		if zones.ids[id] || probeIDs[id] {
			continue
		}
		c, ok := zones.idClaims[id]
		if ours, why := r.claimedOurs(c, ok); !ours {
			r.opts.Log.Warn("sweep: not ours: leaving alone a link", "part", fmt.Sprintf("link %s of zone %s", l.Name, l.ZoneID), "why", why)
			continue
		}
		o.links = append(o.links, l)
	}
	services, err := subdirs(r.serviceRoot())
	errs = append(errs, err)
	for _, name := range services {
		if r.adopt(&o, zones, name, "service dir "+r.serviceDir(name)) {
			o.services = append(o.services, r.serviceDir(name))
		}
	}
	if r.cg.available() {
		cgs, err := subdirs(r.cg.root)
		errs = append(errs, err)
		for _, name := range cgs {
			if strings.HasSuffix(name, guestcg.Suffix) {
				continue // a guest's, below
			}
			if r.adopt(&o, zones, name, "cgroup "+r.cg.dir(name)) {
				o.cgroups = append(o.cgroups, r.cg.dir(name))
			}
		}
	}
	// Guests' cgroups, in every hierarchy: their zone's, by name.
	guests, err := r.guests.Guests(r.opts.Tag)
	errs = append(errs, err)
	for _, name := range slices.Sorted(maps.Keys(guests)) {
		dirs := guests[name]
		if r.adopt(&o, zones, name, "guest cgroup "+strings.Join(dirs, ", ")) {
			o.cgroups = append(o.cgroups, dirs...)
		}
	}
	procs, err := r.markedProcs(zones, &o)
	o.procs = procs
	errs = append(errs, err)
	return o, errors.Join(errs...)
}

// markedProcs returns the processes marked with the service directory of a
// zone that is not in zones.
func (r *Runtime) markedProcs(zones zoneSet, o *orphans) ([]supervise.MarkedProcess, error) {
	root, err := filepath.Abs(r.serviceRoot())
	if err != nil {
		return nil, err
	}
	all, err := supervise.ListMarked(root)
	if err != nil {
		return nil, err
	}
	var out []supervise.MarkedProcess
	for _, p := range all {
		part := fmt.Sprintf("process %d (%s) of service dir %s", p.PID, p.Comm, p.Dir)
		if filepath.Dir(p.Dir) != root {
			r.opts.Log.Warn("sweep: leaving alone a process marked with no zone's service dir", "part", part)
			continue
		}
		if r.adopt(o, zones, filepath.Base(p.Dir), part) {
			out = append(out, p)
		}
	}
	return out, nil
}

// adopt reports whether a part named name belongs to an orphan zone, and
// notes that zone. Names of zones in zones are not orphans'. A name no zone
// could have, one that holds a zone's id (its links are that zone's links),
// or one of a zone whose claim does not name our sled, is not taken: the
// part is logged and left alone.
func (r *Runtime) adopt(o *orphans, zones zoneSet, name, part string) bool {
	c, claimed := zones.claims[name]
	switch {
	case zones.names[name]:
		return false
	case !zoneShaped(name):
		r.opts.Log.Warn("sweep: leaving alone a part whose name no zone could have", "part", part)
		return false
	case zones.ids[idFromName(name)]:
		r.opts.Log.Warn("sweep: leaving alone a part whose name holds a zone's id", "part", part)
		return false
	}
	if ours, why := r.claimedOurs(c, claimed); !ours {
		r.opts.Log.Warn("sweep: not ours: leaving alone a part", "part", part, "why", why)
		return false
	}
	o.zones[name] = true
	return true
}

// removeOrphans destroys the orphan zones, then removes what Destroy, which
// goes by a zone's name, does not reach: links whose zone left no other part,
// and marked processes whose service directory is gone.
func (r *Runtime) removeOrphans(ctx context.Context, o orphans) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(o.zones)) {
		if err := ctx.Err(); err != nil {
			return append(errs, err)
		}
		if err := r.Destroy(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	destroyed := map[string]bool{}
	for name := range o.zones {
		destroyed[idFromName(name)] = true
	}
	for _, l := range o.links {
		id := strings.ToLower(l.ZoneID)
		if destroyed[id] {
			continue
		}
		destroyed[id] = true
		if err := ctx.Err(); err != nil {
			return append(errs, err)
		}
		if err := zonenet.RemoveLinks(ctx, r.opts.Tag, id); err != nil {
			errs = append(errs, err)
		}
	}
	killed := map[string]bool{}
	for _, p := range o.procs {
		if killed[p.Dir] || !stillMarked(p) {
			continue
		}
		killed[p.Dir] = true
		if err := ctx.Err(); err != nil {
			return append(errs, err)
		}
		if err := supervise.KillMarked(p.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// gone returns a line for each orphan part that no longer exists.
func (r *Runtime) gone(o orphans) ([]string, error) {
	var lines []string
	nss, links, err := zonenet.List(r.netnsName(sledconfig.ZoneNamePrefix), r.opts.Tag)
	if err == nil {
		for _, ns := range o.namespaces {
			if !slices.Contains(nss, ns) {
				lines = append(lines, "namespace "+ns)
			}
		}
		for _, l := range o.links {
			if !slices.ContainsFunc(links, func(m zonenet.Link) bool { return m.Name == l.Name }) {
				lines = append(lines, fmt.Sprintf("link %s of zone %s", l.Name, l.ZoneID))
			}
		}
	}
	for _, d := range o.services {
		if missing(d) {
			lines = append(lines, "service dir "+d)
		}
	}
	for _, d := range o.cgroups {
		if missing(d) {
			lines = append(lines, "cgroup "+d)
		}
	}
	for _, p := range o.procs {
		if !stillMarked(p) {
			lines = append(lines, fmt.Sprintf("process %d (%s) of service dir %s", p.PID, p.Comm, p.Dir))
		}
	}
	return lines, err
}

// removeUnmarkedRoots removes the roots that knownZones found without a
// valid mark, if they still are real directories of legacy zone roots in
// our data dir without one. Root datasets are not ours to remove.
func (r *Runtime) removeUnmarkedRoots(ctx context.Context, roots []string) ([]string, []error) {
	var lines []string
	var errs []error
	for _, root := range roots {
		if err := ctx.Err(); err != nil {
			return lines, append(errs, err)
		}
		if r.placeOf(root) != legacyPlace {
			continue
		}
		if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
			continue // gone, or not a directory Ensure made
		}
		if _, err := readOwner(root); err == nil || transient(err) {
			continue
		}
		if err := os.RemoveAll(root); err != nil {
			errs = append(errs, fmt.Errorf("zone root without a valid mark: %w", err))
			continue
		}
		lines = append(lines, fmt.Sprintf("zone root %s without a valid mark", root))
	}
	return lines, errs
}

// zoneShaped reports whether name is one a zone could have:
// oxz_<kind>_<id>, the kind of lower-case letters, '_' and '-' (VMM zones'
// is propolis-server), the id a UUID in lower case (as sledconfig.Zone.Name
// writes it). Such a name holds nothing that a path or a glob pattern (see
// rootsOf) reads specially.
func zoneShaped(name string) bool {
	rest, ok := strings.CutPrefix(name, sledconfig.ZoneNamePrefix)
	if !ok || len(rest) < 38 || rest[len(rest)-37] != '_' {
		return false
	}
	kind, id := rest[:len(rest)-37], rest[len(rest)-36:]
	for i := 0; i < len(kind); i++ {
		if c := kind[i]; (c < 'a' || c > 'z') && c != '_' && c != '-' {
			return false
		}
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// subdirs returns the names of the directories in dir; a missing dir has
// none.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func missing(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// stillMarked reports whether p still runs with its mark. A process that
// exited, even one not yet reaped, shows an empty environment.
func stillMarked(p supervise.MarkedProcess) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/environ")
	if err != nil {
		return false
	}
	want := []byte(supervise.MarkerEnv + "=" + p.Dir)
	for e := range bytes.SplitSeq(b, []byte{0}) {
		if bytes.Equal(e, want) {
			return true
		}
	}
	return false
}
