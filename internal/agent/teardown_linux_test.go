package agent_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// onTmpfsMount says whether dir is a tmpfs mount point.
func onTmpfsMount(dir string) bool {
	var st unix.Statfs_t
	var a, b unix.Stat_t
	if unix.Statfs(dir, &st) != nil || unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC && a.Dev != b.Dev
}

// A teardown as the docs give it, without --vdev-dir, still detaches
// the loop devices the agent attached to its vdev files (it recorded them
// in its data dir), and unmounts the tmpfs the agent mounted on its run dir.
func TestLinuxTeardownReleasesRecordedLoopsAndRunDirTmpfs(t *testing.T) {
	tag, prefix, dir, _ := linuxEnv(t)
	runDir := filepath.Join(t.TempDir(), "run")
	t.Cleanup(func() {
		if onTmpfsMount(runDir) {
			unix.Unmount(runDir, unix.MNT_DETACH)
		}
	})
	vdevs, pools := filepath.Join(dir, "vdev"), filepath.Join(dir, "pools")
	if err := os.MkdirAll(vdevs, 0o755); err != nil {
		t.Fatal(err)
	}
	const diskID, poolID = "a1b2c3d4-0000-4000-8000-0000000000d1", "a1b2c3d4-1111-4111-8111-0000000000d1"
	file := filepath.Join(vdevs, "u2_"+tag+"-d.vdev")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(300 << 20)
	f.Close()
	doc, err := json.Marshal(map[string]any{
		"generation": 2, "zones": map[string]any{}, "measurements": []any{}, "remove_mupdate_override": nil, "datasets": map[string]any{},
		"disks": map[string]any{diskID: map[string]any{"id": diskID, "pool_id": poolID,
			"identity": map[string]any{"vendor": "synthetic-vendor", "model": "synthetic-model-U2", "serial": "synthetic-serial-" + tag + "-d"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{DataDir: dir, RunDir: runDir, TmpfsRunDir: true, Runtime: "linux", ZoneTag: tag, NetnsPrefix: prefix, VdevDir: vdevs, PoolRoot: pools}
	a := newAgent(t, cfg)
	stop := run(t, a)
	if err := newClient(t, a).PutConfig(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the disk ok", func() (bool, string) { return storageDone(a.Storage().Status()) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	loops := btrfs.LoopsBackedBy(vdevs)
	if len(loops) != 1 {
		t.Fatalf("loop devices of the vdev dir: %v, want one", loops)
	}
	if !onTmpfsMount(runDir) {
		t.Fatalf("the agent mounted no tmpfs on its run dir %s", runDir)
	}

	// The teardown of the docs: no --vdev-dir.
	cfg.VdevDir = ""
	r, err := agent.TeardownReport(t.Context(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("teardown: %v (removed %q)", err, r.Removed)
	}
	for _, want := range []string{
		"loop device " + loops[0] + " of " + file + " (detached)",
		"run dir " + runDir + " (tmpfs unmounted)",
	} {
		if !slices.Contains(r.Removed, want) {
			t.Errorf("teardown removed %q, want %q among them", r.Removed, want)
		}
	}
	if len(r.Left) != 0 {
		t.Errorf("teardown left %q", r.Left)
	}
	if l := btrfs.LoopsBackedBy(vdevs); len(l) != 0 {
		t.Errorf("still attached after the teardown: %v", l)
	}
	if onTmpfsMount(runDir) {
		t.Errorf("run dir %s still a tmpfs after the teardown", runDir)
	}
	if _, err := os.Stat(filepath.Join(dir, agent.LoopRecordFile)); !os.IsNotExist(err) {
		t.Errorf("the record of attached vdev files after the teardown: %v", err)
	}
}
