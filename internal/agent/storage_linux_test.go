package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
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
