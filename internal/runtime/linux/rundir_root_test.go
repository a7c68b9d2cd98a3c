package linux_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
)

// isTmpfsMount says whether dir is a tmpfs mount point.
func isTmpfsMount(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC && a.Dev != b.Dev
}

// The tmpfs the runtime mounted on its run dir is unmounted by
// ReleaseRunDir when it holds only the runtime's own; with another's files
// in it, it is left, saying why; one it did not mount is never touched.
func TestReleaseRunDirUnmountsOnlyItsOwnEmptyTmpfs(t *testing.T) {
	var run string
	e := newEnvWith(t, nil, func(o *linux.Options) {
		run = filepath.Join(t.TempDir(), "run")
		o.RunDir, o.TmpfsRunDir = run, true
	})
	t.Cleanup(func() {
		if isTmpfsMount(t, run) {
			unix.Unmount(run, unix.MNT_DETACH)
		}
	})
	if !isTmpfsMount(t, run) {
		t.Fatalf("run dir %s: no tmpfs mounted", run)
	}
	other := filepath.Join(run, "other-tag.boot")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	released, left, err := e.rt.ReleaseRunDir()
	if err != nil || released != "" || !strings.Contains(left, "other-tag.boot") {
		t.Errorf("with another's file: released %q, left %q, %v", released, left, err)
	}
	if !isTmpfsMount(t, run) {
		t.Fatal("unmounted with another's file in it")
	}
	os.Remove(other)
	if err := os.WriteFile(filepath.Join(run, e.tag+".boot"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	released, left, err = e.rt.ReleaseRunDir()
	if err != nil || left != "" || !strings.Contains(released, run) {
		t.Errorf("with its own alone: released %q, left %q, %v", released, left, err)
	}
	if isTmpfsMount(t, run) {
		t.Error("still mounted")
	}

	// A tmpfs it did not mount: not its to unmount.
	mine := filepath.Join(t.TempDir(), "mine")
	if err := os.Mkdir(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mine, "tmpfs", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mine, unix.MNT_DETACH) })
	opts := e.opts
	opts.RunDir, opts.TmpfsRunDir = mine, true
	rt, err := linux.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	released, left, err = rt.ReleaseRunDir()
	if err != nil || released != "" || left != "" || !isTmpfsMount(t, mine) {
		t.Errorf("a tmpfs it did not mount: released %q, left %q, %v", released, left, err)
	}
}
