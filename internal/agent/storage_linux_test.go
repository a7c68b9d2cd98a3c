package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// TestLinuxStorageOnVdevs is the outside check of storage on Linux: an
// agent with --vdev-dir and --pool-root, given a config whose disks are
// the vdevs, makes each dataset a directory at
// <pool-root>/ext/<pool id>/<name within the pool> with its id in
// user.oxide.uuid, and reports every disk and dataset ok.
func TestLinuxStorageOnVdevs(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	vdevs, pools := filepath.Join(dir, "vdev"), filepath.Join(dir, "pools")
	if err := os.MkdirAll(vdevs, 0o755); err != nil {
		t.Fatal(err)
	}
	type disk struct{ name, id, pool string }
	disks := []disk{
		{tag + "-a", "a1b2c3d4-0000-4000-8000-00000000000a", "a1b2c3d4-1111-4111-8111-00000000000a"},
		{tag + "-b", "a1b2c3d4-0000-4000-8000-00000000000b", "a1b2c3d4-1111-4111-8111-00000000000b"},
	}
	cfg := map[string]any{"generation": 2, "zones": map[string]any{}, "measurements": []any{}, "remove_mupdate_override": nil}
	diskCfg, dsCfg := map[string]any{}, map[string]any{}
	type want struct{ path, id string }
	var wants []want
	for i, d := range disks {
		f, err := os.Create(filepath.Join(vdevs, "u2_"+d.name+".vdev"))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(300 << 20)
		f.Close()
		diskCfg[d.id] = map[string]any{"id": d.id, "pool_id": d.pool,
			"identity": map[string]any{"vendor": "synthetic-vendor", "model": "synthetic-model-U2", "serial": "synthetic-serial-" + d.name}}
		for j, kind := range []string{"debug", "crucible"} {
			id := fmt.Sprintf("a1b2c3d4-2222-4222-8222-%012x", i*10+j)
			dsCfg[id] = map[string]any{"id": id, "name": map[string]any{"pool_name": "oxp_" + d.pool, "kind": kind},
				"compression": map[string]any{"type": "off"}, "quota": nil, "reservation": nil}
			within := "crypt/" + kind
			if kind == "crucible" {
				within = kind
			}
			wants = append(wants, want{filepath.Join(pools, "ext", d.pool, within), id})
		}
	}
	cfg["disks"], cfg["datasets"] = diskCfg, dsCfg
	doc, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: prefix, VdevDir: vdevs, PoolRoot: pools})
	run(t, a)
	c := newClient(t, a)
	if err := c.PutConfig(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every disk and dataset ok", func() (bool, string) { return storageDone(a.Storage().Status()) })
	for _, w := range wants {
		st, err := os.Stat(w.path)
		if err != nil || !st.IsDir() {
			t.Errorf("dataset %s: %v", w.path, err)
			continue
		}
		buf := make([]byte, 64)
		n, err := unix.Getxattr(w.path, "user.oxide.uuid", buf)
		if err != nil || string(buf[:n]) != w.id {
			t.Errorf("dataset %s: user.oxide.uuid %q, %v; want %s", w.path, buf[:max(n, 0)], err, w.id)
		}
	}
}

// A stopped agent whose vdev file is then deleted and made again, blank (a
// new run of a benchmark, as a new user would), leaves a loop device still
// holding the pool's btrfs: the next agent detaches it and makes the pool
// on the new file, where mkfs.btrfs used to refuse the pool's UUID for
// ever. A teardown then unmounts the pool and detaches the loop device,
// and formats nothing: the agent after it finds the pool with its files.
func TestLinuxStaleVdevLoopAndTeardownReleaseStorage(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	vdevs, pools := filepath.Join(dir, "vdev"), filepath.Join(dir, "pools")
	if err := os.MkdirAll(vdevs, 0o755); err != nil {
		t.Fatal(err)
	}
	const diskID, poolID, dsID = "a1b2c3d4-0000-4000-8000-0000000000c1", "a1b2c3d4-1111-4111-8111-0000000000c1", "a1b2c3d4-2222-4222-8222-0000000000c1"
	file := filepath.Join(vdevs, "u2_"+tag+"-c.vdev")
	newVdev := func() {
		t.Helper()
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(300 << 20)
		f.Close()
	}
	newVdev()
	doc, err := json.Marshal(map[string]any{
		"generation": 2, "zones": map[string]any{}, "measurements": []any{}, "remove_mupdate_override": nil,
		"disks": map[string]any{diskID: map[string]any{"id": diskID, "pool_id": poolID,
			"identity": map[string]any{"vendor": "synthetic-vendor", "model": "synthetic-model-U2", "serial": "synthetic-serial-" + tag + "-c"}}},
		"datasets": map[string]any{dsID: map[string]any{"id": dsID, "name": map[string]any{"pool_name": "oxp_" + poolID, "kind": "debug"},
			"compression": map[string]any{"type": "off"}, "quota": nil, "reservation": nil}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: prefix, VdevDir: vdevs, PoolRoot: pools}
	mnt := filepath.Join(pools, "ext", poolID)
	runUntilStorageDone := func(put bool) {
		t.Helper()
		a := newAgent(t, cfg)
		stop := run(t, a)
		if put {
			if err := newClient(t, a).PutConfig(t.Context(), doc); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the disk and its dataset ok", func() (bool, string) { return storageDone(a.Storage().Status()) })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	runUntilStorageDone(true)
	stale := btrfs.LoopsBackedBy(vdevs)
	if len(stale) != 1 {
		t.Fatalf("loop devices of the vdev dir: %v, want one", stale)
	}

	// The file deleted while its loop device is attached, and made again.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	newVdev()
	runUntilStorageDone(false)
	loops := btrfs.LoopsBackedBy(vdevs)
	if len(loops) != 1 {
		t.Fatalf("loop devices of the vdev dir: %v, want the new file's alone", loops)
	}
	if b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(loops[0]), "loop", "backing_file")); strings.TrimSpace(string(b)) != file {
		t.Errorf("%s is backed by %q, want %s", loops[0], b, file)
	}
	keep := filepath.Join(mnt, "crypt", "debug", "keep")
	if err := os.WriteFile(keep, []byte("me"), 0o600); err != nil {
		t.Fatal(err)
	}

	removed, err := agent.Teardown(t.Context(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("teardown: %v (removed %q)", err, removed)
	}
	want := []string{
		"pool " + poolID + " mounted at " + mnt + " (unmounted)",
		"loop device " + loops[0] + " of " + file + " (detached)",
	}
	if strings.Join(removed, "\n") != strings.Join(want, "\n") {
		t.Errorf("teardown removed %q, want %q", removed, want)
	}
	if m := btrfs.Mounts(pools); len(m) != 0 {
		t.Errorf("still mounted after the teardown: %v", m)
	}
	if l := btrfs.LoopsBackedBy(vdevs); len(l) != 0 {
		t.Errorf("still attached after the teardown: %v", l)
	}

	// Nothing was formatted: the next agent finds the pool as it was.
	runUntilStorageDone(false)
	if b, err := os.ReadFile(keep); err != nil || string(b) != "me" {
		t.Errorf("the dataset's file after the teardown: %q, %v", b, err)
	}
}
