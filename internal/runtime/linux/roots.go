package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Where zone roots are.
//
// A zone root is in one of two places, and nowhere else:
//
//   - on its dataset: <PoolRoot>/ext/<pool id>/crypt/zone/<zone name>, the
//     zone's transient root dataset on its filesystem pool, which the
//     storage reconciler makes and passes in spec.Storage.Root. The runtime
//     never creates that directory, and never removes it: Destroy empties
//     it, the mark last. (Upstream too keeps the zone/<name> dataset when
//     it uninstalls a zone; unlike upstream, nothing here wipes zone roots
//     when a disk is adopted, so a zone that is still running keeps its
//     files across an agent restart.)
//   - legacy: <DataDir>/pools/<pool>/zones/<zone name>, when the spec has no
//     Storage.Root (the runtime used on its own: its tests, bench zones).
//     Ensure creates it and Destroy removes it whole.
//
// Both are ours by location and by the mark in them. A dataset root without
// our mark is the storage reconciler's (a zone dataset not yet used), and
// Sweep leaves it alone; a legacy root without a valid mark is litter of a
// crash in our own data dir, and Sweep removes it. The durable dataset
// (spec.Storage.Data) is never removed or emptied: the runtime only passes
// its path to the zone's service ({data}).

// rootPlace is where a zone root is.
type rootPlace int

const (
	notARoot rootPlace = iota
	legacyPlace
	datasetPlace
)

// placeOf says where path is as a zone root: on a dataset, legacy, or
// neither (then it is not ours to touch). It goes by the clean path alone.
func (r *Runtime) placeOf(path string) rootPlace {
	if filepath.Clean(path) != path || !strings.HasPrefix(filepath.Base(path), sledconfig.ZoneNamePrefix) {
		return notARoot
	}
	dir := filepath.Dir(path)
	// <DataDir>/pools/<pool>/zones
	if filepath.Base(dir) == "zones" && filepath.Dir(filepath.Dir(dir)) == filepath.Join(r.opts.DataDir, "pools") {
		return legacyPlace
	}
	// <PoolRoot>/ext/<pool id>/crypt/zone
	crypt := filepath.Dir(dir)
	pool := filepath.Dir(crypt)
	if filepath.Base(dir) == "zone" && filepath.Base(crypt) == "crypt" && filepath.Dir(pool) == filepath.Join(r.opts.PoolRoot, "ext") && uuidShaped(filepath.Base(pool)) {
		return datasetPlace
	}
	return notARoot
}

// uuidShaped reports whether s is a UUID in lower case.
func uuidShaped(s string) bool { return validSled(s) == nil }

// legacyRoot is where the zone's root lives when it has no dataset: on its
// pool under the data dir, if it has one.
func (r *Runtime) legacyRoot(spec zone.Spec) string {
	pool := "nopool"
	if p := spec.Config.FilesystemPool; p != nil && *p != "" {
		pool = *p // validated: ox[ip]_<uuid>
	}
	return filepath.Join(r.opts.DataDir, "pools", pool, "zones", spec.Name)
}

// datasetRootOf is where the zone's root dataset must be: on its
// filesystem pool.
func (r *Runtime) datasetRootOf(spec zone.Spec) (string, error) {
	var pool string
	if p := spec.Config.FilesystemPool; p != nil {
		pool = *p
	}
	id, ok := strings.CutPrefix(pool, "oxp_")
	if !ok || !uuidShaped(id) {
		return "", fmt.Errorf("zone %s: a root dataset needs an external filesystem pool (oxp_<id>), not %q", spec.Name, pool)
	}
	return filepath.Join(r.opts.PoolRoot, "ext", id, "crypt", "zone", spec.Name), nil
}

// rootFor returns the zone's root: its dataset's directory if the spec has
// one, checked to be where that zone's root dataset must be and to exist;
// else the legacy root. The runtime never creates a dataset root.
func (r *Runtime) rootFor(spec zone.Spec) (string, error) {
	if spec.Storage.Root == "" {
		return r.legacyRoot(spec), nil
	}
	want, err := r.datasetRootOf(spec)
	if err != nil {
		return "", err
	}
	if got := filepath.Clean(spec.Storage.Root); got != want {
		return "", fmt.Errorf("zone %s: root %s is not the zone's root dataset, which is at %s", spec.Name, spec.Storage.Root, want)
	}
	if err := r.checkDatasetRoot(want); err != nil {
		return "", fmt.Errorf("zone %s: %w", spec.Name, err)
	}
	return want, nil
}

// checkDatasetRoot checks that root, a path placeOf finds on a dataset, is
// a directory reached through no symbolic link below the pool root: what
// Ensure writes to and Destroy empties is then where its path says.
func (r *Runtime) checkDatasetRoot(root string) error {
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("root dataset %s: %w", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("root dataset %s is not a directory (%s)", root, fi.Mode().Type())
	}
	base, err := filepath.EvalSymlinks(r.opts.PoolRoot)
	if err != nil {
		return fmt.Errorf("pool root: %w", err)
	}
	rel, err := filepath.Rel(r.opts.PoolRoot, root)
	if err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return fmt.Errorf("root dataset %s: %w", root, err)
	}
	if want := filepath.Join(base, rel); real != want {
		return fmt.Errorf("root dataset %s is reached through a symbolic link (it is %s)", root, real)
	}
	return nil
}

// checkData checks the zone's durable dataset path: on a pool under the
// pool root, and not inside the zone's root (which Destroy empties).
func (r *Runtime) checkData(spec zone.Spec, root string) error {
	data := spec.Storage.Data
	if data == "" {
		return nil
	}
	ext := filepath.Join(r.opts.PoolRoot, "ext") + string(filepath.Separator)
	if filepath.Clean(data) != data || !strings.HasPrefix(data, ext) {
		return fmt.Errorf("zone %s: durable dataset %s: want a clean path under %s", spec.Name, data, ext)
	}
	if data == root || strings.HasPrefix(data, root+string(filepath.Separator)) {
		return fmt.Errorf("zone %s: durable dataset %s is inside the zone's root %s", spec.Name, data, root)
	}
	return nil
}

// rootGlobs are the patterns of every place a root of a zone whose name
// matches pattern may be: on datasets first (List prefers them).
func (r *Runtime) rootGlobs(pattern string) []string {
	return []string{
		filepath.Join(r.opts.PoolRoot, "ext", "*", "crypt", "zone", pattern),
		filepath.Join(r.opts.DataDir, "pools", "*", "zones", pattern),
	}
}

// globRoots returns the paths that match pattern in both places, on
// datasets first, and only those that placeOf accepts.
func (r *Runtime) globRoots(pattern string) ([]string, error) {
	var out []string
	for _, g := range r.rootGlobs(pattern) {
		m, err := filepath.Glob(g)
		if err != nil {
			return nil, err
		}
		for _, p := range m {
			if r.placeOf(p) != notARoot {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// removeRoot removes a zone root of ours: a legacy root whole, a dataset
// root's contents only, the mark last, so that a removal cut short leaves a
// marked root that the next Destroy finishes. Anything else is refused.
func (r *Runtime) removeRoot(root string) error {
	switch r.placeOf(root) {
	case legacyPlace:
		return os.RemoveAll(root)
	case datasetPlace:
		if err := r.checkDatasetRoot(root); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return emptyRoot(root)
	default:
		return fmt.Errorf("%s is not where a zone root may be", root)
	}
}

// emptyRoot removes everything in root but root itself, the mark last.
func emptyRoot(root string) error {
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if e.Name() != ownerFile {
			errs = append(errs, os.RemoveAll(filepath.Join(root, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(root, ownerFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// globEscape quotes the characters a glob pattern reads specially.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`).Replace(s)
}
