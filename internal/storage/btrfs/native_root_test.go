package btrfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// noTools makes every command the backend would start fail to be found,
// until the returned function (or the end of the test) puts them back:
// what still works runs without a process.
func noTools(t *testing.T) (restore func()) {
	t.Helper()
	saved := toolDirs
	toolDirs = []string{t.TempDir()}
	restore = func() { toolDirs = saved }
	t.Cleanup(restore)
	return restore
}

// Making, changing, listing and destroying datasets on an open pool starts
// no process: btrfs-progs are not there to start, and every step is as
// btrfs-progs see it.
func TestDatasetsWithoutProcesses(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	poolID, pool := r.pool(ctx, "a")
	zone := dataset(poolID, "zone")
	root := dataset(poolID, "zone/oxz_crucible_"+uuid.NewString())
	durable := dataset(poolID, "crucible")
	durable.Quota = ptr(uint64(100 << 20))

	restore := noTools(t)
	for _, d := range []storage.DatasetConfig{zone, root, durable} {
		if _, err := r.b.EnsureDataset(ctx, d); err != nil {
			t.Fatalf("EnsureDataset %s: %v", d.Name(), err)
		}
	}
	durable.Quota = ptr(uint64(200 << 20))
	if _, err := r.b.EnsureDataset(ctx, durable); err != nil {
		t.Fatalf("changing the quota: %v", err)
	}
	list, err := r.b.Datasets(ctx, poolID)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, d := range list {
		names[d.Name] = d.ID
	}
	for _, d := range []storage.DatasetConfig{zone, root, durable} {
		if names[d.Name()] != d.ID {
			t.Errorf("dataset %s listed with id %q, want %s (listed: %v)", d.Name(), names[d.Name()], d.ID, names)
		}
	}
	if err := r.b.DestroyDataset(ctx, poolID, zone.Name()); err != nil {
		t.Fatalf("DestroyDataset: %v", err)
	}
	restore()

	// As btrfs-progs see it: the quota, and the zone dataset gone with
	// the root inside it.
	if out, err := exec.Command("btrfs", "qgroup", "show", "-re", "--raw", pool.Mountpoint).CombinedOutput(); err != nil || !qgroupLimited(string(out), "crucible", "209715200") {
		t.Errorf("qgroup show: %v\n%s", err, out)
	}
	out, err := exec.Command("btrfs", "subvolume", "list", pool.Mountpoint).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs subvolume list: %v %s", err, out)
	}
	if strings.Contains(string(out), "zone") || !strings.Contains(string(out), "path crucible\n") {
		t.Errorf("btrfs subvolume list after destroying the zone dataset:\n%s", out)
	}
}

// The list made without a process is, line for line, btrfs-progs' own:
// nested subvolumes, subvolumes in plain directories, temporary names.
func TestSubvolumeListAsProgs(t *testing.T) {
	r := newRig(t, "a")
	ctx := testCtx(t)
	_, pool := r.pool(ctx, "a")
	mnt := pool.Mountpoint
	progs := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("btrfs", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("btrfs %s: %v %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	progs("subvolume", "create", filepath.Join(mnt, "crypt"))
	progs("subvolume", "create", filepath.Join(mnt, "crypt", "zone"))
	progs("subvolume", "create", filepath.Join(mnt, "crypt", "zone", ".oxide-new-oxz_x"))
	if err := os.MkdirAll(filepath.Join(mnt, "crypt", "plain", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	progs("subvolume", "create", filepath.Join(mnt, "crypt", "plain", "deeper", "sub"))
	progs("subvolume", "create", filepath.Join(mnt, "gone"))
	progs("subvolume", "delete", filepath.Join(mnt, "gone"))

	got, err := listSubvolumes(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if want := progs("subvolume", "list", mnt); string(got) != want {
		t.Errorf("listed:\n%s\nbtrfs subvolume list:\n%s", got, want)
	}
}

// A step made without a process that does not return (a syscall stuck on
// a dead disk) is given up at its deadline, as a command is killed there;
// while it lingers, the next step on the same pool fails at once rather
// than leave another goroutine behind, and a step on another pool runs.
func TestNativeStepGivenUpAtDeadline(t *testing.T) {
	b, err := New(Options{VdevDir: t.TempDir(), PoolRoot: "/pools"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	stuck := make(chan struct{})
	defer close(stuck)
	_, err = b.runNative(ctx, []string{"btrfs", "subvolume", "create", "/pools/ext/p1/crypt/debug"}, func() ([]byte, error) { <-stuck; return nil, nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stuck step = %v, want it given up at its deadline", err)
	}
	ran := false
	_, err = b.runNative(context.Background(), []string{"btrfs", "subvolume", "list", "/pools/ext/p1"}, func() ([]byte, error) { ran = true; return nil, nil })
	if !errors.Is(err, ErrHung) || ran {
		t.Fatalf("the next step on the stuck pool = %v (ran: %v), want ErrHung at once", err, ran)
	}
	if _, err := b.runNative(context.Background(), []string{"btrfs", "subvolume", "list", "/pools/ext/p2"}, func() ([]byte, error) { return nil, nil }); err != nil {
		t.Fatalf("a step on another pool = %v", err)
	}
}
