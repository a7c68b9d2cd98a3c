package linux_test

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// poolDir is where the zone's filesystem pool is mounted under the pool
// root.
func (e *env) poolDir(s zone.Spec) string {
	return filepath.Join(e.pools, "ext", strings.TrimPrefix(*s.Config.FilesystemPool, "oxp_"))
}

// onDatasets makes the zone's root dataset, and if data, its durable
// dataset, as the storage reconciler would (a plain directory stands in for
// a subvolume: the runtime does not care), and returns s with their paths.
func (e *env) onDatasets(t *testing.T, s zone.Spec, data bool) zone.Spec {
	t.Helper()
	s.Storage.Root = filepath.Join(e.poolDir(s), "crypt", "zone", s.Name)
	if data {
		s.Storage.Data = filepath.Join(e.poolDir(s), "crucible")
	}
	for _, d := range []string{s.Storage.Root, s.Storage.Data} {
		if d != "" {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

// restart replaces e's runtime with a new one made with the same options,
// as a restarted agent makes it: it knows only what it finds.
func (e *env) restart(t *testing.T) {
	t.Helper()
	rt, err := linux.New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	e.rt = rt
}

// entries returns the names in dir, failing the test if it cannot be read.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A zone whose spec names its root dataset lives there: its mark is in the
// dataset's directory, List, Names and Inspect find it (also after a
// restart, with its files), and Destroy empties the directory and leaves
// it for the next start.
func TestZoneRootIsItsDataset(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s := e.onDatasets(t, spec(0x61), false)
	e.ensure(s)
	healthy(t, s)
	if _, err := os.Stat(filepath.Join(s.Storage.Root, "zone.json")); err != nil {
		t.Fatalf("no mark in the root dataset: %v", err)
	}
	if !missing(rootOf(e, s)) {
		t.Errorf("a legacy root %s was made too", rootOf(e, s))
	}
	// The zone's own files in its root.
	writeFile(t, filepath.Join(s.Storage.Root, "var", "log", "service.log"), "started\n")

	// A restarted runtime finds it on its dataset, running, and leaves its
	// root as it is; Ensure of the running zone changes nothing.
	e.restart(t)
	if o, ok := e.observed(s.Name); !ok || !o.Running || o.Hash != s.Hash {
		t.Fatalf("List after restart: %+v (found %v)", o, ok)
	}
	if names, err := e.rt.Names(ctx, "oxz_"); err != nil || !slices.Equal(names, []string{s.Name}) {
		t.Errorf("Names = %v, %v", names, err)
	}
	if o, ok, err := e.rt.Inspect(ctx, s.Name); err != nil || !ok || !o.Running {
		t.Errorf("Inspect = %+v, %v, %v", o, ok, err)
	}
	e.ensure(s)
	if b, err := os.ReadFile(filepath.Join(s.Storage.Root, "var", "log", "service.log")); err != nil || string(b) != "started\n" {
		t.Errorf("the zone's file after restart and Ensure: %q, %v", b, err)
	}

	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, s.Storage.Root); len(got) != 0 {
		t.Errorf("root dataset after Destroy holds %v, want nothing", got)
	}
	if _, ok := e.observed(s.Name); ok {
		t.Error("List still shows the zone")
	}
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if _, err := os.Stat(s.Storage.Root); err != nil {
		t.Fatalf("root dataset after a second Destroy: %v", err)
	}

	// The next start uses the same dataset.
	e.ensure(s)
	healthy(t, s)
	if o, ok := e.observed(s.Name); !ok || !o.Running {
		t.Fatalf("List after the second start: %+v (found %v)", o, ok)
	}
}

// A Destroy cut short leaves a root dataset that still holds its mark and
// some of the zone's files: the zone is still listed, and the next Destroy
// finishes the job, leaving the directory.
func TestDestroyFinishesAHalfEmptiedRootDataset(t *testing.T) {
	e := newEnv(t, nil)
	s := e.onDatasets(t, spec(0x62), false)
	mark := `{"tag": "` + e.tag + `", "sled_id": "` + e.sled + `", "id": "` + s.ID + `", "name": "` + s.Name + `"}`
	writeFile(t, filepath.Join(s.Storage.Root, "zone.json"), mark)
	writeFile(t, filepath.Join(s.Storage.Root, "var", "tmp", "left"), "x")
	if o, ok := e.observed(s.Name); !ok || o.Running {
		t.Fatalf("List: %+v (found %v), want the zone, not running", o, ok)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, s.Storage.Root); len(got) != 0 {
		t.Errorf("root dataset after Destroy holds %v, want nothing", got)
	}
}

// nothingMade fails the test if anything of zone s exists: a namespace, a
// service directory, a legacy root.
func nothingMade(t *testing.T, e *env, s zone.Spec) {
	t.Helper()
	for what, exists := range map[string]bool{
		"namespace":     !missing("/run/netns/" + e.prefix + s.Name),
		"service dir":   !missing(serviceDir(t, e, s)),
		"a legacy root": !missing(rootOf(e, s)),
	} {
		if exists {
			t.Errorf("%s of the zone was made", what)
		}
	}
}

// A spec whose root dataset is missing, or is not where that zone's root
// dataset must be, is an error naming the path, and nothing of the zone is
// made.
func TestZoneRootDatasetMissingOrMisplaced(t *testing.T) {
	e := newEnv(t, nil)
	elsewhere := t.TempDir()
	for i, c := range []struct {
		name string
		// root sets up the root dataset in pool dir pool for zone s and
		// returns the path to give; want is what the error must say.
		root func(s zone.Spec, pool string) string
		want string
	}{
		{"missing", func(s zone.Spec, pool string) string {
			return filepath.Join(pool, "crypt", "zone", s.Name)
		}, "no such file or directory"},
		{"on another pool", func(s zone.Spec, pool string) string {
			return mkdir(t, filepath.Join(e.pools, "ext", uuid.NewString(), "crypt", "zone", s.Name))
		}, "is not the zone's root dataset"},
		{"another zone's", func(s zone.Spec, pool string) string {
			return mkdir(t, filepath.Join(pool, "crypt", "zone", spec(0x7f).Name))
		}, "is not the zone's root dataset"},
		{"not a zone dataset", func(s zone.Spec, pool string) string {
			return mkdir(t, filepath.Join(pool, "crypt", "debug", s.Name))
		}, "is not the zone's root dataset"},
		{"outside the pool root", func(s zone.Spec, pool string) string {
			return mkdir(t, filepath.Join(elsewhere, "ext", filepath.Base(pool), "crypt", "zone", s.Name))
		}, "is not the zone's root dataset"},
		{"a file", func(s zone.Spec, pool string) string {
			root := filepath.Join(pool, "crypt", "zone", s.Name)
			writeFile(t, root, "")
			return root
		}, "is not a directory"},
		{"a symbolic link", func(s zone.Spec, pool string) string {
			root := filepath.Join(pool, "crypt", "zone", s.Name)
			symlink(t, mkdir(t, filepath.Join(elsewhere, s.Name)), root)
			return root
		}, "is not a directory"},
		{"through a symbolic link", func(s zone.Spec, pool string) string {
			real := mkdir(t, filepath.Join(elsewhere, "pool-"+s.ID))
			mkdir(t, filepath.Join(real, "crypt", "zone", s.Name))
			mkdir(t, filepath.Dir(pool))
			symlink(t, real, pool)
			return filepath.Join(pool, "crypt", "zone", s.Name)
		}, "reached through a symbolic link"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec(0x91 + i)
			s.Storage.Root = c.root(s, e.poolDir(s))
			before := tree(t, e.pools)
			ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
			defer cancel()
			err := e.rt.Ensure(ctx, s)
			if err == nil || !strings.Contains(err.Error(), s.Storage.Root) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Ensure = %v, want an error naming %s and saying %q", err, s.Storage.Root, c.want)
			}
			if c.name == "missing" && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Ensure = %v, want it to wrap fs.ErrNotExist", err)
			}
			nothingMade(t, e, s)
			if after := tree(t, e.pools); !maps.Equal(before, after) {
				t.Errorf("the pool root changed:\nbefore %v\nafter  %v", before, after)
			}
			if got := tree(t, elsewhere); slices.ContainsFunc(slices.Collect(maps.Keys(got)), func(p string) bool { return strings.HasSuffix(p, "zone.json") }) {
				t.Errorf("a mark was written outside the pool root: %v", got)
			}
		})
	}
}

// {data} is the zone's durable dataset, in its command and in its readiness
// command (also when the restore protocol asks Healthy with the ledgered
// spec, which does not say where the datasets are); an image that uses it in
// a zone without a durable dataset is an error, and nothing of the zone is
// made. Destroy leaves the durable dataset as it is.
func TestDataPlaceholderIsTheDurableDataset(t *testing.T) {
	// The service writes the path it was given into that path, then
	// serves; it is ready once the file says the path it was given.
	e := newEnv(t, map[string]linux.Image{
		"crucible": {
			Command: []string{"/bin/sh", "-c", `echo "$2" > "$2/seen"; exec "$0" tcp-listen "$1"`, "{agent}", "{listen}", "{data}"},
			Ready:   linux.Ready{Command: []string{"/bin/sh", "-c", `test "$(cat "$1/seen")" = "$1"`, "sh", "{data}"}},
		},
		// Only the readiness command uses {data}.
		"clickhouse": {
			Command: []string{"{agent}", "tcp-listen", "{listen}"},
			Ready:   linux.Ready{Command: []string{"/bin/sh", "-c", `test -d "$1"`, "sh", "{data}"}},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s := e.onDatasets(t, spec(0x71), true)
	e.ensure(s)
	if b, err := os.ReadFile(filepath.Join(s.Storage.Data, "seen")); err != nil || string(b) != s.Storage.Data+"\n" {
		t.Fatalf("the service got {data} = %q (%v), want %s", b, err, s.Storage.Data)
	}
	ledgered := s
	ledgered.Storage = zone.Storage{}
	if err := e.rt.Healthy(ctx, ledgered); err != nil {
		t.Errorf("Healthy with the ledgered spec: %v", err)
	}
	e.restart(t)
	if err := e.rt.Healthy(ctx, ledgered); err != nil {
		t.Errorf("Healthy with the ledgered spec after a restart: %v", err)
	}
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, s.Storage.Data); !slices.Equal(got, []string{"seen"}) {
		t.Errorf("durable dataset after Destroy holds %v, want what the service wrote", got)
	}

	clickhouse := spec(0x72)
	clickhouse.Config.ZoneType.Type = "clickhouse"
	clickhouse = zone.SpecFor(&clickhouse.Config)
	for _, s := range []zone.Spec{e.onDatasets(t, spec(0x73), false), e.onDatasets(t, clickhouse, false)} {
		err := e.rt.Ensure(ctx, s)
		if err == nil || !strings.Contains(err.Error(), "{data}") || !strings.Contains(err.Error(), "no durable dataset") {
			t.Errorf("%s: Ensure = %v, want an error saying it has no durable dataset for {data}", s.Name, err)
		}
		nothingMade(t, e, s)
		if got := entries(t, s.Storage.Root); len(got) != 0 {
			t.Errorf("%s: root dataset holds %v", s.Name, got)
		}
	}
}

// Sweep leaves a root dataset without our mark, and everything in it, as
// it is: it is the storage reconciler's (a zone dataset not yet used, or
// one whose mark is garbage), not litter of ours. A legacy root without a
// valid mark is still removed, and a zone on its dataset is a zone.
func TestSweepLeavesUnmarkedRootDatasetsAlone(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	whole := e.onDatasets(t, spec(0x81), false)
	e.ensure(whole)
	if _, err := os.Stat(filepath.Join(whole.Storage.Root, "zone.json")); err != nil {
		t.Fatalf("no mark in the root dataset: %v", err)
	}
	wholeSt := status(t, serviceDir(t, e, whole))

	fresh := e.onDatasets(t, spec(0x82), false).Storage.Root
	used := e.onDatasets(t, spec(0x83), false).Storage.Root
	writeFile(t, filepath.Join(used, "zone.json"), `{"tag": "`+e.tag+`", "id": "`)
	writeFile(t, filepath.Join(used, ".zone.json.tmp123456"), `{"tag": "`+e.tag+`"}`)
	writeFile(t, filepath.Join(used, "var", "db", "blob"), "precious\x00bytes")
	symlink(t, "/etc/hostname", filepath.Join(used, "link"))
	legacy := rootOf(e, spec(0x84))
	writeFile(t, filepath.Join(legacy, ".zone.json.tmp123456"), `{"tag": "`+e.tag+`"}`)
	before := tree(t, e.pools)

	lines, err := e.rt.Sweep(ctx)
	if want := []string{"zone root " + legacy + " without a valid mark"}; err != nil || !slices.Equal(lines, want) {
		t.Fatalf("Sweep: %q, %v; want %q", lines, err, want)
	}
	if after := tree(t, e.pools); !maps.Equal(before, after) {
		t.Errorf("the pool root changed:\nbefore %v\nafter  %v", before, after)
	}
	if _, ok := before[strings.TrimPrefix(fresh, e.pools)]; !ok {
		t.Errorf("tree has no %s: %v", fresh, before)
	}
	if now := status(t, serviceDir(t, e, whole)); now.PID != wholeSt.PID {
		t.Errorf("the zone on its dataset: service was %+v, is %+v", wholeSt, now)
	}
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	mkdir(t, filepath.Dir(link))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func missing(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// tree describes everything under dir, by path below it: each entry's
// type and permissions, and a file's content or a link's target.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[strings.TrimPrefix(path, dir)] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
