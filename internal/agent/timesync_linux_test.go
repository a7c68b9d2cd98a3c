package agent_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone/ntpzonetest"
)

// TestLinuxCrucibleWaitsForTheBoundaryNTPZone is the outside check of time
// sync on Linux: with --ntp-no-clock and a boundary NTP zone whose
// ntp_servers is a reference server on this host (its own link, local
// stratum 7, -x), GET /timesync on the zone's address port 10123 reaches
// sync: true, chronyd runs in the zone, and only then is the crucible ok.
// No clock is set; all NTP traffic stays on this host.
func TestLinuxCrucibleWaitsForTheBoundaryNTPZone(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	bins, err := chrony.Find()
	if err != nil {
		t.Skipf("needs chronyd and chronyc (scripts/setup installs them): %v", err)
	}
	// A /64 no other test uses.
	refAddr := netip.MustParseAddr("fd00:1122:3344:1f8::1")
	ntpzonetest.StartReference(t, bins, tag, refAddr, 7)

	a := newTimedAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: "fd00:1122:3344:1f7::1"})
	run(t, a)
	c := newClient(t, a)
	crucible := sledconfigtest.Crucible(0)
	crucible.ZoneType.Address = "[fd00:1122:3344:1f7::6]:32345"
	zones := sledconfigtest.OwnPools(tag, sledconfigtest.BoundaryNTP(0, "[fd00:1122:3344:1f7::5]:123", refAddr.String()), crucible)
	ntp, crucible := zones[0], zones[1]
	t0 := time.Now()
	if err := c.PutConfig(t.Context(), linuxDoc(t, dir, tag, 1, zones...)); err != nil {
		t.Fatal(err)
	}

	addr, _ := ntp.ServiceAddr()
	url := "http://" + netip.AddrPortFrom(addr.Addr(), timesync.AdminPort).String() + "/timesync"
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	last := ""
	askNTPZone := func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		last = resp.Status + " " + string(b)
		var ts timesync.TimeSync
		return resp.StatusCode == http.StatusOK && json.Unmarshal(b, &ts) == nil && ts.Sync
	}
	var synced, ok time.Duration
	heldSeen := false
	for time.Since(t0) < 90*time.Second && ok == 0 {
		if synced == 0 && askNTPZone() {
			synced = time.Since(t0)
		}
		switch res, msg := zoneResult(t, c, crucible.ID); {
		case res == "ok":
			ok = time.Since(t0)
		case strings.Contains(msg, "time not yet synchronized"):
			heldSeen = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ok == 0 {
		t.Fatalf("the crucible not ok after 90s; /timesync: %s", last)
	}
	if synced == 0 && !askNTPZone() {
		t.Fatalf("the crucible is ok, and its NTP zone's /timesync says %s", last)
	}
	if !heldSeen {
		t.Error("the crucible was never seen waiting for time")
	}
	// The gate's order, in the agent's own records: the crucible started
	// running after the NTP zone first said time was synchronized.
	inv, err := c.AgentInventory(t.Context())
	if err != nil || inv.TimeSync == nil || !inv.TimeSync.Synced || inv.TimeSync.Source != refAddr.String() || inv.TimeSync.Stratum != 8 {
		t.Fatalf("inventory's timesync: %+v, %v", inv.TimeSync, err)
	}
	zs, err := c.Zone(t.Context(), crucible.ID)
	if err != nil || zs.State != "running" || zs.Since.Before(inv.TimeSync.ReleasedAt) {
		t.Fatalf("crucible %s since %v (%v), time first synchronized at %v", zs.State, zs.Since, err, inv.TimeSync.ReleasedAt)
	}
	t.Logf("after the PUT: the NTP zone said synchronized to the agent at %v (to the test at %v), the crucible ok at %v",
		inv.TimeSync.ReleasedAt.Sub(t0).Round(time.Millisecond), synced.Round(time.Millisecond), ok.Round(time.Millisecond))
	if !chronydRuns(t, prefix+ntp.Name()) {
		t.Errorf("no chronyd in the NTP zone's namespace")
	}
}

// chronydRuns reports whether a chronyd runs in the named namespace, with -x.
func chronydRuns(t *testing.T, ns string) bool {
	for _, pid := range namespacePIDs(t, ns) {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.TrimSpace(string(comm)) == "chronyd" && strings.Contains(string(cmdline), "\x00-x") {
			return true
		}
	}
	return false
}

// An internal NTP zone follows the rack's boundary NTP servers that the
// agent finds in internal DNS (AAAA boundary-ntp.control-plane.oxide.internal
// through --dns-server): two sleds on this host, the first with a boundary
// NTP zone following a reference server, the second with an internal NTP
// zone and a crucible; the second's /timesync reaches sync: true at stratum
// 9 through the boundary zone, and its crucible starts.
func TestLinuxInternalNTPFollowsTheBoundaryNTPInDNS(t *testing.T) {
	tagA, prefixA, dirA, runDirA := linuxEnv(t)
	tagB, prefixB, dirB, runDirB := linuxEnv(t)
	bins, err := chrony.Find()
	if err != nil {
		t.Skipf("needs chronyd and chronyc (scripts/setup installs them): %v", err)
	}
	// /64s no other test uses.
	refAddr := netip.MustParseAddr("fd00:1122:3344:1f6::1")
	ntpzonetest.StartReference(t, bins, tagA, refAddr, 7)
	boundary := sledconfigtest.OwnPools(tagA, sledconfigtest.BoundaryNTP(1, "[fd00:1122:3344:1f5::5]:123", refAddr.String()))[0]
	boundaryAddr, _ := boundary.ServiceAddr()

	server := dns.NewServer(nil)
	if err := server.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	if err := server.SetRecords(dns.Records{AAAA: map[string][]netip.Addr{dns.BoundaryNTPName: {boundaryAddr.Addr()}}}); err != nil {
		t.Fatal(err)
	}

	a := newTimedAgent(t, agent.Config{DataDir: dirA, RunDir: runDirA, Runtime: "linux", VdevDir: vdevDir(dirA), ZoneTag: tagA, NetnsPrefix: prefixA, UnderlayIP: "fd00:1122:3344:1f5::1"})
	run(t, a)
	if err := newClient(t, a).PutConfig(t.Context(), linuxDoc(t, dirA, tagA, 1, boundary)); err != nil {
		t.Fatal(err)
	}
	b := newTimedAgent(t, agent.Config{DataDir: dirB, RunDir: runDirB, Runtime: "linux", VdevDir: vdevDir(dirB), ZoneTag: tagB, NetnsPrefix: prefixB,
		DNSServers: []string{server.Addr().String()}, UnderlayIP: "fd00:1122:3344:1f4::1"})
	run(t, b)
	crucible := sledconfigtest.Crucible(1)
	crucible.ZoneType.Address = "[fd00:1122:3344:1f4::6]:32345"
	internal := sledconfigtest.InternalNTP(1)
	internal.ZoneType.Address = "[fd00:1122:3344:1f4::5]:123"
	zones := sledconfigtest.OwnPools(tagB, internal, crucible)
	cB := newClient(t, b)
	t0 := time.Now()
	if err := cB.PutConfig(t.Context(), linuxDoc(t, dirB, tagB, 1, zones...)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second sled's crucible ok", func() (bool, string) {
		res, msg := zoneResult(t, cB, zones[1].ID)
		return res == "ok", res + " " + msg
	})
	inv, err := cB.AgentInventory(t.Context())
	if err != nil || inv.TimeSync == nil || !inv.TimeSync.Synced || inv.TimeSync.Source != boundaryAddr.Addr().String() || inv.TimeSync.Stratum != 9 {
		t.Fatalf("the second sled's timesync: %+v, %v", inv.TimeSync, err)
	}
	if ns := inv.NTPServers; ns == nil || len(ns.Servers) != 1 || ns.Servers[0] != boundaryAddr.Addr() || len(ns.Zones) != 1 {
		t.Errorf("the second sled's ntp_servers: %+v", ns)
	}
	t.Logf("the internal NTP zone synchronized through the boundary NTP zone found in DNS %v after the PUT",
		inv.TimeSync.ReleasedAt.Sub(t0).Round(time.Millisecond))
}
