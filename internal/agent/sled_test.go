package agent_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// hostZones are crucibles on addresses no other test uses, on pools of
// the test's (tag's) own.
func hostZones(tag string, idx ...int) []sledconfig.Zone {
	var zones []sledconfig.Zone
	for _, i := range idx {
		z := sledconfigtest.Crucible(i)
		z.ZoneType.Address = fmt.Sprintf("[fd00:1122:3344:1f1::%x]:32345", i)
		zones = append(zones, z)
	}
	return sledconfigtest.OwnPools(tag, zones...)
}

// putHostZones puts a config of zones and waits for them all to run.
func putHostZones(t *testing.T, c *client.Client, dir, tag string, gen uint64, zones []sledconfig.Zone) {
	t.Helper()
	if err := c.PutConfig(t.Context(), linuxDoc(t, dir, tag, gen, zones...)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, z := range zones {
		want[z.Name()] = "running"
	}
	waitStates(t, c, want)
}

// An agent on another data dir with the same tag, started after the first
// stopped, and a teardown of its data dir, remove its own zones and leave
// the first's running: same service processes, namespaces and links.
func TestLinuxAgentOfAnotherDataDirLeavesTheZonesAlone(t *testing.T) {
	tag, prefix, dirA, runDir := linuxEnv(t)
	cfgA := agent.Config{DataDir: dirA, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dirA), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: "fd00:1122:3344:1f1::1"}
	cfgB := cfgA
	cfgB.DataDir = linuxDataDir(t)
	cfgB.VdevDir = vdevDir(cfgB.DataDir)
	// The second sled's zones, if the test stops before its teardown (the
	// first's go with linuxEnv's cleanup, which runs after this one).
	t.Cleanup(func() { agent.Teardown(context.Background(), cfgB, nil) })

	a := newAgent(t, cfgA)
	stopA := run(t, a)
	zonesA := hostZones(tag, 0x71, 0x72)
	putHostZones(t, newClient(t, a), dirA, tag, 1, zonesA)
	pids := servicePIDs(t, runDir, tag, zonesA)
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	same := func(when string) {
		t.Helper()
		for _, z := range zonesA {
			if !zonenet.NetnsExists(prefix + z.Name()) {
				t.Errorf("%s: zone %s's namespace is gone", when, z.Name())
			}
		}
		if now := servicePIDs(t, runDir, tag, zonesA); !maps.Equal(now, pids) {
			t.Errorf("%s: the first sled's services were %v, are %v", when, pids, now)
		}
		_, links, err := zonenet.List(prefix, tag)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, l := range links {
			ids[l.ZoneID] = true
		}
		for _, z := range zonesA {
			if !ids[z.ID] {
				t.Errorf("%s: zone %s's links are gone (links: %v)", when, z.Name(), links)
			}
		}
	}

	b := newAgent(t, cfgB)
	stopB := run(t, b)
	cB := newClient(t, b)
	zonesB := hostZones(tag, 0x73)
	putHostZones(t, cB, cfgB.DataDir, tag, 1, zonesB)
	waitFor(t, "the second agent's sweep", func() (bool, string) {
		rs, err := cB.Restore(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return rs.Swept, fmt.Sprintf("%+v", rs)
	})
	same("after the second agent's start")
	if err := stopB(); err != nil {
		t.Fatal(err)
	}

	// The second sled's zone goes, then its storage is released: its
	// pool unmounted, its vdev's loop device detached.
	want := []string{"zone " + zonesB[0].Name()}
	loops := btrfs.LoopsBackedBy(cfgB.VdevDir)
	pools := sledconfigtest.Pools(zonesB...)
	if len(loops) != 1 || len(pools) != 1 {
		t.Fatalf("the second sled's loop devices %v and pools %v: want one each", loops, pools)
	}
	pool := strings.TrimPrefix(pools[0], "oxp_")
	want = append(want,
		"pool "+pool+" mounted at "+filepath.Join(cfgB.DataDir, "storage", "ext", pool)+" (unmounted)",
		"loop device "+loops[0]+" of "+filepath.Join(cfgB.VdevDir, "u2_"+sledconfigtest.VdevNames(tag+"-", zonesB...)[0]+".vdev")+" (detached)")
	removed, err := agent.Teardown(t.Context(), cfgB, testLogger(t))
	if err != nil {
		t.Fatalf("teardown: %v (removed %q)", err, removed)
	}
	if strings.Join(removed, "\n") != strings.Join(want, "\n") {
		t.Errorf("teardown removed %q, want %q", removed, want)
	}
	if l := btrfs.LoopsBackedBy(cfgB.VdevDir); len(l) != 0 {
		t.Errorf("the second sled's loop devices after its teardown: %v", l)
	}
	if zonenet.NetnsExists(prefix + zonesB[0].Name()) {
		t.Errorf("teardown left the second sled's zone %s", zonesB[0].Name())
	}
	same("after the second data dir's teardown")

	// The first agent, back, adopts its zones as they are.
	a = newAgent(t, cfgA)
	run(t, a)
	waitStates(t, newClient(t, a), map[string]string{zonesA[0].Name(): "running", zonesA[1].Name(): "running"})
	same("after the first agent's restart")
}
