package btrfs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// needRoot skips a test that needs root, btrfs-progs and loop devices.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: attaches loop devices, makes and mounts btrfs filesystems")
	}
	needTools(t, "mkfs.btrfs", "btrfs", "blkid", "mount", "umount")
	if !exists("/dev/loop-control") {
		t.Skip("needs loop devices: no /dev/loop-control")
	}
	if fs, _ := os.ReadFile("/proc/filesystems"); !strings.Contains(string(fs), "\tbtrfs\n") {
		t.Skip("needs a kernel with btrfs")
	}
}

func needTools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := lookTool(n); err != nil {
			t.Skipf("needs %s (scripts/setup installs btrfs-progs and util-linux): %v", n, err)
		}
	}
}

// rig is one test's own synthetic disks, pool root and backend. Its
// cleanup unmounts every mount under its directory and detaches every loop
// device backed by its files, and nothing else.
type rig struct {
	t        testing.TB
	dir      string
	vdevDir  string
	poolRoot string
	tag      string
	b        *Backend
	rec      *recorder
}

const vdevSize = 300 << 20

func newRig(t testing.TB, disks ...string) *rig {
	t.Helper()
	needRoot(t)
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: dir, vdevDir: filepath.Join(dir, "vdev"), poolRoot: filepath.Join(dir, "pools"), tag: "t" + rand.Text()[:8]}
	t.Cleanup(r.cleanup) // after TempDir's: runs before it removes the files
	if err := os.MkdirAll(r.vdevDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		r.addVdev(d)
	}
	r.b = r.newBackend()
	return r
}

// newBackend is a backend on the rig's dirs, as after an agent restart,
// whose commands are recorded.
func (r *rig) newBackend() *Backend {
	b, err := New(Options{VdevDir: r.vdevDir, PoolRoot: r.poolRoot, Tag: r.tag, CommandTimeout: time.Minute})
	if err != nil {
		r.t.Fatal(err)
	}
	r.rec = &recorder{next: b.run}
	b.run = r.rec.run
	return b
}

// addVdev makes a sparse synthetic disk "u2_<tag>-<name>.vdev" (or m2_ if
// name begins with "m2:").
func (r *rig) addVdev(name string) string {
	prefix := "u2_"
	if n, ok := strings.CutPrefix(name, "m2:"); ok {
		prefix, name = "m2_", n
	}
	p := filepath.Join(r.vdevDir, prefix+r.tag+"-"+name+".vdev")
	f, err := os.Create(p)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(vdevSize); err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *rig) vdev(name string) string {
	return filepath.Join(r.vdevDir, "u2_"+r.tag+"-"+name+".vdev")
}

func (r *rig) id(name string) storage.DiskIdentity {
	return syntheticIdentity(r.tag+"-"+name, storage.VariantU2)
}

func (r *rig) cleanup() {
	for _, m := range Mounts(r.dir) {
		if out, err := exec.Command("umount", m).CombinedOutput(); err != nil {
			r.t.Logf("umount %s: %v %s; lazily", m, err, out)
			exec.Command("umount", "--lazy", m).Run()
		}
	}
	r.detach()
}

// detach detaches the loop devices backed by the rig's files.
func (r *rig) detach() {
	for _, dev := range LoopsBackedBy(r.dir) {
		exec.Command("btrfs", "device", "scan", "--forget", dev).Run()
		if err := DetachLoop(dev); err != nil {
			r.t.Logf("detach %s: %v", dev, err)
		}
	}
}

// pool makes a pool on disk name and opens it.
func (r *rig) pool(ctx context.Context, name string) (string, storage.Pool) {
	r.t.Helper()
	id := uuid.NewString()
	if err := r.b.CreatePool(ctx, r.id(name), id); err != nil {
		r.t.Fatalf("CreatePool: %v", err)
	}
	p, err := r.b.OpenPool(ctx, r.id(name), id)
	if err != nil {
		r.t.Fatalf("OpenPool: %v", err)
	}
	return id, p
}

func sha(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// recorder records every command a backend runs.
type recorder struct {
	next runFunc
	mu   sync.Mutex
	cmds []string
}

func (r *recorder) run(ctx context.Context, argv ...string) ([]byte, error) {
	r.mu.Lock()
	r.cmds = append(r.cmds, strings.Join(argv, " "))
	r.mu.Unlock()
	return r.next(ctx, argv...)
}

// take returns the commands run since the last take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cmds
	r.cmds = nil
	return c
}

// changes are the commands among cmds that change something.
func changes(cmds []string) []string {
	var out []string
	for _, c := range cmds {
		if !strings.HasPrefix(c, "blkid ") && !strings.HasPrefix(c, "btrfs subvolume list ") {
			out = append(out, c)
		}
	}
	return out
}

func hasCommand(cmds []string, prefix string) bool {
	return slices.ContainsFunc(cmds, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

func ptr[T any](v T) *T { return &v }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func dataset(poolID, kind string) storage.DatasetConfig {
	return storage.DatasetConfig{ID: uuid.NewString(), PoolID: poolID, Kind: kind}
}

func fileSync(t testing.TB, path string, n int) {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b) // incompressible: zeros would compress to nothing
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("btrfs", "filesystem", "sync", filepath.Dir(path)).CombinedOutput(); err != nil {
		t.Fatalf("sync: %v %s", err, out)
	}
}
