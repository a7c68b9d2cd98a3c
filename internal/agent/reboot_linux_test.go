package agent_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/crashtest/reboot"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone/ntpzonetest"
)

// TestLinuxColdBootWithoutOnePool is upstream's cold-boot case of omicron
// #10953 (boundary NTP and internal DNS on one sled waiting on each other
// when a pool does not come back): a sled with a boundary NTP zone (its
// servers a reference chronyd on this host), an internal DNS zone and two
// crucibles, each on a pool of its own, is rebooted (internal/crashtest/
// reboot) and one pool's vdev file is moved aside before the new agent
// starts: a crucible's, or the internal DNS zone's (upstream's case: the
// sled's internal DNS zone on the pool that did not come back). Every zone
// not on that pool comes up again, time sync included (the NTP zone
// synchronized, the crucibles ok), the data in the durable datasets of the
// pools that came back reads back the same, and the zone of the missing
// pool waits, saying which pool it waits for. Then the disk comes back (the
// file moved in again) and, without another restart, its pool is adopted
// and its zone comes up with its data (upstream's sled had its disk adopted
// and its zones started only when its agent was restarted).
func TestLinuxColdBootWithoutOnePool(t *testing.T) {
	t.Run("a crucible's pool", func(t *testing.T) { coldBootWithout(t, 3) })
	t.Run("the internal DNS zone's pool", func(t *testing.T) { coldBootWithout(t, 1) })
}

// coldBootWithout runs TestLinuxColdBootWithoutOnePool with the pool of
// zone i (1: internal DNS, 3: a crucible) missing after the reboot.
func coldBootWithout(t *testing.T, i int) {
	tag, prefix, dir, runDir := linuxEnv(t)
	bins, err := chrony.Find()
	if err != nil {
		t.Skipf("needs chronyd and chronyc (scripts/setup installs them): %v", err)
	}
	// Addresses no other test uses: the reference's /64, and a sled of an
	// availability zone (a /48) of its own, whose internal DNS /64s
	// (its ::1 to ::5 /64s) the DNS zone sits in, as the subnet rule
	// wants.
	refAddr := netip.MustParseAddr("fd00:1122:3344:1e7::1")
	ntpzonetest.StartReference(t, bins, tag, refAddr, 7)
	const sled = "fd00:1122:31e9:101::"
	dnsZone := sledconfigtest.InternalDNS(0)
	dnsZone.ZoneType.DNSAddress = "[fd00:1122:31e9:1::1]:53"
	dnsZone.ZoneType.HTTPAddress = "[fd00:1122:31e9:1::1]:5353"
	dnsZone.ZoneType.GZAddress = "fd00:1122:31e9:1::2"
	c0, c1 := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)
	c0.ZoneType.Address = "[" + sled + "6]:32345"
	c1.ZoneType.Address = "[" + sled + "7]:32345"
	zones := sledconfigtest.OwnPools(tag, sledconfigtest.BoundaryNTP(0, "["+sled+"5]:123", refAddr.String()), dnsZone, c0, c1)
	lost := zones[i]
	var others []sledconfig.Zone
	for _, z := range zones {
		if z.ID != lost.ID {
			others = append(others, z)
		}
	}
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: sled + "1"}

	first := newTimedAgent(t, cfg)
	stop := run(t, first)
	c := newClient(t, first)
	if err := c.PutConfig(t.Context(), linuxDoc(t, dir, tag, 1, zones...)); err != nil {
		t.Fatal(err)
	}
	allOK := func(zones []sledconfig.Zone) func() (bool, string) {
		return func() (bool, string) {
			for _, z := range zones {
				if res, msg := zoneResult(t, c, z.ID); res != "ok" {
					return false, z.Name() + ": " + res + " " + msg
				}
			}
			return true, ""
		}
	}
	waitFor(t, "every zone ok before the reboot", allOK(zones))
	// Data in every durable dataset.
	data := map[string]string{}
	lostData := ""
	for _, z := range zones {
		d, ok := z.DurableDataset()
		if !ok {
			continue
		}
		pool, _ := storage.PoolIDFromName(d.PoolName)
		path := filepath.Join(dir, "storage", "ext", pool, strings.TrimPrefix(d.String(), d.PoolName+"/"), "before-the-reboot")
		if err := os.WriteFile(path, []byte(z.ID), 0o600); err != nil {
			t.Fatal(err)
		}
		data[path] = z.ID
		if z.ID == lost.ID {
			lostData = path
		}
	}
	// The agent runs in this process, so it is stopped rather than
	// killed: a stop leaves its zones, pools and VMMs as a kill does.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	removed, err := reboot.Reboot(t.Context(), reboot.Host{Tag: tag, NetnsPrefix: prefix, RunDir: runDir, PoolRoot: filepath.Join(dir, "storage"), VdevDir: vdevDir(dir)})
	t.Logf("rebooted: %v", removed)
	if err != nil {
		t.Fatal(err)
	}
	// The lost zone's disk does not come back.
	lostPool, _ := storage.PoolIDFromName(*lost.FilesystemPool)
	vdev := filepath.Join(vdevDir(dir), "u2_"+sledconfigtest.VdevNames(prefix, lost)[0]+".vdev")
	if err := os.Rename(vdev, filepath.Join(dir, "moved-aside.vdev")); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	second := newTimedAgent(t, cfg)
	run(t, second)
	c = newClient(t, second)
	waitFor(t, "every zone but the lost pool's ok after the reboot", allOK(others))
	took := time.Since(t0)
	inv, err := c.AgentInventory(t.Context())
	if err != nil || inv.TimeSync == nil || !inv.TimeSync.Synced {
		t.Fatalf("timesync after the reboot: %+v, %v", inv.TimeSync, err)
	}
	// The lost zone waits for its pool, and says so, in our view and in
	// upstream's inventory.
	waitFor(t, "the lost pool's zone waiting for it", func() (bool, string) {
		states, err := c.ZoneStates(t.Context())
		if err != nil {
			return false, err.Error()
		}
		for _, s := range states {
			if s.ID != lost.ID {
				continue
			}
			res, msg := zoneResult(t, c, lost.ID)
			ok := s.State == "waiting" && strings.Contains(s.WaitingFor, lostPool) && res == "err" && strings.Contains(msg, lostPool)
			return ok, fmt.Sprintf("%s waiting for %q; inventory %s %q", s.State, s.WaitingFor, res, msg)
		}
		return false, "no such zone"
	})
	for path, want := range data {
		if path == lostData {
			continue
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Errorf("%s after the reboot: %q, %v; want %q", path, got, err, want)
		}
	}
	t.Logf("after the reboot every zone but %s was ok in %v", lost.Name(), took.Round(time.Millisecond))

	// The disk comes back: its pool is adopted as it was, and its zone
	// starts.
	if err := os.Rename(filepath.Join(dir, "moved-aside.vdev"), vdev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every zone ok once the lost disk is back", allOK(zones))
	if got, err := os.ReadFile(lostData); err != nil || string(got) != lost.ID {
		t.Errorf("%s once its disk is back: %q, %v; want %q", lostData, got, err, lost.ID)
	}
}
