package linux

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// Which sled a part is of.
//
// The tag and the namespace prefix say that a part is a sled agent's, not
// which sled agent's: two agents with the same tag (two data dirs on one
// host, one after the other, or a teardown pointed at another data dir) see
// each other's namespaces, links, service directories, cgroups and processes.
// (Upstream has no such question: on illumos the host is the sled, and every
// oxz_ zone on it is the one agent's.) One agent per host and tag at a time
// is the agent's host lock; this is what lets an agent tell its sled's parts
// from another's when they were made one after the other.
//
// A part is of our sled when:
//
//   - a zone root: it lies in our data dir, carries our tag, and its mark
//     names our sled, or no sled at all (the previous version of this
//     runtime wrote none: a root in our own data dir is ours by location).
//     A root whose mark names another sled is not ours.
//   - a namespace, link, service directory, cgroup or process of a zone
//     whose root is ours: the zone's. Its other parts go by its name (the
//     namespace, service directory and cgroup), its id (the links' aliases)
//     or its service directory (the processes' environment mark).
//   - any of those parts of a zone whose root is not ours: only when the
//     zone's claim names our sled. The claim is a file in the zone's service
//     directory, written right after the root's mark and before anything
//     else of the zone exists, and removed with the service directory, last
//     of all that Destroy removes but the root. The run dir lasts one boot,
//     as the namespaces, links and processes do, so the claim outlives none
//     of them and none of them outlives it. A part without a claim that
//     names our sled (another sled's, or one the previous version made,
//     which wrote no claims) is not proven ours: it is logged and left
//     alone.
//
// Link aliases and process marks stay as they were ("<tag>:<zone>:<role>"
// and the service directory): the claim proves their sled, and a running
// zone made by the previous version keeps its links and its service (a new
// process mark would mean a new supervisor) when this version adopts it.
// Sweep writes the claims of such zones, whose roots are ours.
//
// A claim outlives its sled's agent when that agent is killed: parts of a
// zone claimed by a sled whose agent is gone and of which nothing lives are
// debris, removed when they are in the way (debris.go).
//
// ClaimFile is the claim's name in the service directory: JSON, with the
// sled's id as "sled_id", its data dir as "data_dir" and the lock its agent
// holds while it runs as "lock".
const ClaimFile = "sled.json"

// claim names the sled whose zone a service directory is.
type claim struct {
	Sled string `json:"sled_id"`
	// DataDir is where the sled's zone roots are (absolute): for people,
	// and for the teardown that clears them.
	DataDir string `json:"data_dir"`
	// Lock is the file the sled's agent holds an flock on while it runs
	// (its data dir's agent.lock): free, that agent is gone. Empty in the
	// claims of the previous version, whose lock was in DataDir.
	Lock string `json:"lock,omitempty"`
}

// ErrOtherSled is wrapped when a zone's parts are claimed by another sled
// and are not debris: they are left alone, and Ensure cannot proceed.
var ErrOtherSled = errors.New("the zone's parts are another sled's")

// claimPath is where the named zone's claim is.
func (r *Runtime) claimPath(zoneName string) string {
	return filepath.Join(r.serviceDir(zoneName), ClaimFile)
}

// readClaim returns the named zone's claim; ok is false if it has none
// that can be read.
func (r *Runtime) readClaim(zoneName string) (c claim, ok bool) {
	data, err := os.ReadFile(r.claimPath(zoneName))
	if err != nil || json.Unmarshal(data, &c) != nil || c.Sled == "" {
		return claim{}, false
	}
	return c, true
}

// claimZone writes the named zone's claim for our sled, unless it holds
// one already. A claim of another sled is taken over if what it claims is
// debris (removed first, see debris.go); else it is an OtherSledError,
// which wraps ErrOtherSled. It is not fsynced: the run dir lasts one boot.
func (r *Runtime) claimZone(ctx context.Context, zoneName string) error {
	if c, ok := r.readClaim(zoneName); ok {
		if c.Sled == r.opts.Sled {
			return nil
		}
		if err := r.clearDebris(ctx, zoneName, c); err != nil {
			return err
		}
	}
	b, err := json.Marshal(claim{Sled: r.opts.Sled, DataDir: r.dataDir, Lock: r.opts.DataDirLock})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(r.claimPath(zoneName), append(b, '\n'), atomicfile.Options{}); err != nil {
		return fmt.Errorf("zone %s: writing its claim: %w", zoneName, err)
	}
	return nil
}

// claims reads the claims of every service directory under our run dir, by
// zone name; a directory without a readable claim is not in it.
func (r *Runtime) claims() (map[string]claim, error) {
	out := map[string]claim{}
	names, err := subdirs(r.serviceRoot())
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if c, ok := r.readClaim(name); ok {
			out[name] = c
		}
	}
	return out, nil
}

// ourMark reports whether a root's mark is of our sled: our tag, and our
// sled or none (see above).
func (r *Runtime) ourMark(o owner) bool {
	return o.Tag == r.opts.Tag && (o.Sled == "" || o.Sled == r.opts.Sled)
}

// sledOf describes, for logs, whose a part claimed by c is.
func sledOf(c claim, ok bool) string {
	if !ok {
		return "no claim names its sled"
	}
	return "claimed by sled " + c.Sled + " (data dir " + c.DataDir + ")"
}

// validSled accepts a sled id as the agent writes one: a UUID in lower case.
func validSled(s string) error {
	if len(s) != 36 || strings.ToLower(s) != s || !zoneShaped("oxz_x_"+s) {
		return fmt.Errorf("sled id %q: want a UUID in lower case", s)
	}
	return nil
}

// provenOurs reports whether the named zone's parts outside our data dir
// (namespace, links, service directory, cgroup, processes) are ours to
// remove: its claim names our sled, or it has no claim and rootOurs (its
// root in our data dir is ours: a zone the previous version made). If not,
// and such a part exists, that is logged.
func (r *Runtime) provenOurs(name string, rootOurs bool) bool {
	c, ok := r.readClaim(name)
	if ok && c.Sled == r.opts.Sled || !ok && rootOurs {
		return true
	}
	if zonenet.NetnsExists(r.netnsName(name)) || !missing(r.serviceDir(name)) || r.cg.exists(name) {
		r.opts.Log.Warn("not ours: leaving alone the zone's namespace, links, service and processes", "zone", name, "why", sledOf(c, ok))
	}
	return false
}

// removeRoots removes the named zone's roots (ours) and nothing else: a
// root dataset's contents only (see roots.go).
func (r *Runtime) removeRoots(name string, roots []string) error {
	var errs []error
	for _, root := range roots {
		if err := r.removeRoot(root); err != nil {
			errs = append(errs, fmt.Errorf("zone root: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroying zone %s: %w", name, err)
	}
	r.forgetRoot(name)
	return nil
}
