package btrfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/syncbuf"
)

// loggedBackend is a backend on the rig's dirs, as a new agent's, that logs
// into the returned buffer.
func (r *rig) loggedBackend() (*Backend, *syncbuf.Buffer) {
	log := &syncbuf.Buffer{}
	b, err := New(Options{VdevDir: r.vdevDir, PoolRoot: r.poolRoot, Tag: r.tag, CommandTimeout: time.Minute, Log: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		r.t.Fatal(err)
	}
	return b, log
}

// loopOf returns the loop device attached to the vdev file path.
func loopOf(t *testing.T, path string) string {
	t.Helper()
	dev, ok := findLoop(sysBlock, path)
	if !ok {
		t.Fatalf("no loop device backed by %s", path)
	}
	return dev
}

// backing is the backing file the kernel reports for loop device dev, ""
// if it is detached.
func backing(dev string) string {
	return readTrim(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file"))
}

// A vdev file deleted while its loop device is attached (its pool mounted,
// or not) leaves a loop device holding the pool's btrfs: a new file of the
// same name is made into the same pool, the stale loop device detached
// (and unmounted first) and logged, where mkfs.btrfs used to refuse the
// UUID as not unique. The stale loop device of another pool is left.
func TestCreatePoolDetachesTheStaleLoopOfADeletedVdev(t *testing.T) {
	r := newRig(t, "a", "b", "c")
	ctx := testCtx(t)
	idA, _ := r.pool(ctx, "a") // mounted
	idB, _ := r.pool(ctx, "b")
	if err := r.b.ClosePool(ctx, idB); err != nil { // unmounted
		t.Fatal(err)
	}
	r.pool(ctx, "c") // another pool, whose file goes too
	devA, devB, devC := loopOf(t, r.vdev("a")), loopOf(t, r.vdev("b")), loopOf(t, r.vdev("c"))
	for _, n := range []string{"a", "b", "c"} {
		if err := os.Remove(r.vdev(n)); err != nil {
			t.Fatal(err)
		}
	}
	r.addVdev("a")
	r.addVdev("b")
	if got := backing(devA); got != r.vdev("a")+" (deleted)" {
		t.Fatalf("%s is backed by %q, want the deleted file", devA, got)
	}

	b, log := r.loggedBackend()
	for _, c := range []struct {
		name, id, stale string
	}{{"a", idA, devA}, {"b", idB, devB}} {
		if err := b.CreatePool(ctx, r.id(c.name), c.id); err != nil {
			t.Fatalf("CreatePool %s on the new file %s: %v", c.id, r.vdev(c.name), err)
		}
		if got := backing(c.stale); strings.HasPrefix(got, r.vdev(c.name)) {
			t.Errorf("the stale loop device %s is still attached (%q)", c.stale, got)
		}
		m, mounted, err := mountAt(b.mountpoint(c.id))
		if err != nil || !mounted || !sameDevice(m.source, loopOf(t, r.vdev(c.name))) {
			t.Errorf("pool %s: mounted %v from %q (%v), want the new file's loop device", c.id, mounted, m.source, err)
		}
		if l := log.String(); !strings.Contains(l, "detached the loop device of a deleted vdev file") || !strings.Contains(l, "device="+c.stale) {
			t.Errorf("the log does not say that %s was detached:\n%s", c.stale, l)
		}
	}
	if got := backing(devC); got != r.vdev("c")+" (deleted)" {
		t.Errorf("another pool's stale loop device %s: backed by %q, want it left", devC, got)
	}
	disks, err := b.Disks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 2 || disks[0].Content != storage.ContentPool || disks[0].PoolID != idA || disks[1].PoolID != idB {
		t.Errorf("disks: %+v", disks)
	}
}

// Release (the agent's teardown) unmounts the pools under the pool root and
// detaches the loop devices of the vdev files, deleted ones too, and leaves
// loop devices of other files: in the vdev dir without the backend's tag,
// or outside it. Nothing is formatted: the pool is adopted again, with
// its files.
func TestReleaseUnmountsPoolsAndDetachesLoops(t *testing.T) {
	r := newRig(t, "a", "b", "d")
	ctx := testCtx(t)
	idA, pA := r.pool(ctx, "a")
	idB, _ := r.pool(ctx, "b")
	if err := r.b.ClosePool(ctx, idB); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pA.Mountpoint, "keep"), []byte("me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Disks(ctx); err != nil { // attaches d
		t.Fatal(err)
	}
	devA, devB, devD := loopOf(t, r.vdev("a")), loopOf(t, r.vdev("b")), loopOf(t, r.vdev("d"))
	if err := os.Remove(r.vdev("d")); err != nil {
		t.Fatal(err)
	}
	// Loop devices the backend did not attach from its vdev files.
	notOurs := filepath.Join(r.vdevDir, "u2_x"+r.tag+"-e.vdev")
	outside := filepath.Join(r.dir, "other", "u2_"+r.tag+"-f.vdev")
	var others []string
	for _, p := range []string{notOurs, outside} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		dev, err := attachLoop(p)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, dev)
	}

	b, _ := r.loggedBackend()
	lines, err := b.Release(ctx)
	if err != nil {
		t.Fatalf("Release: %v (%q)", err, lines)
	}
	want := []string{
		"pool " + idA + " mounted at " + b.mountpoint(idA) + " (unmounted)",
		"loop device " + devA + " of " + r.vdev("a") + " (detached)",
		"loop device " + devB + " of " + r.vdev("b") + " (detached)",
		"loop device " + devD + " of " + r.vdev("d") + " (deleted) (detached)",
	}
	slices.Sort(lines)
	slices.Sort(want)
	if !slices.Equal(lines, want) {
		t.Errorf("Release:\n\t%s\nwant\n\t%s", strings.Join(lines, "\n\t"), strings.Join(want, "\n\t"))
	}
	if m := Mounts(r.poolRoot); len(m) != 0 {
		t.Errorf("still mounted: %v", m)
	}
	if left := LoopsBackedBy(r.vdevDir); !slices.Equal(left, others[:1]) {
		t.Errorf("loop devices backed by the vdev dir's files: %v, want only %s (not the backend's)", left, others[0])
	}
	for i, p := range []string{notOurs, outside} {
		if got := backing(others[i]); got != p {
			t.Errorf("%s, not the backend's, was backed by %s, is %q", others[i], p, got)
		}
	}
	// Releasing again finds nothing.
	if again, err := b.Release(ctx); err != nil || len(again) != 0 {
		t.Errorf("Release again: %q, %v", again, err)
	}
	// The pool is as it was.
	p, err := r.newBackend().OpenPool(ctx, r.id("a"), idA)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(p.Mountpoint, "keep")); err != nil || string(got) != "me" {
		t.Errorf("the pool's file after Release: %q, %v", got, err)
	}
}
