package agent_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// zoneResult is the zone's result in the last reconciliation, as upstream's
// inventory reports it.
func zoneResult(t *testing.T, c *client.Client, id string) (string, string) {
	t.Helper()
	inv, err := c.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.LastReconciliation == nil {
		return "", "no reconciliation yet"
	}
	res := inv.LastReconciliation.Zones[id]
	return res.Result, res.Message
}

// setFaults puts the sim's fault map.
func setFaults(t *testing.T, a *agent.Agent, doc string) {
	t.Helper()
	if code, b := call(t, a, http.MethodPut, "/debug/sim/faults", doc); code/100 != 2 {
		t.Fatalf("PUT /debug/sim/faults: %d %s", code, b)
	}
}

// With the sim runtime: a crucible waits for its sled's NTP zone to say
// time is synchronized (waiting, naming why; err in upstream's inventory),
// while the NTP and internal DNS zones start; held unsynchronized by the
// fault map, then released, the crucible starts, and our inventory says
// where time comes from.
func TestZonesThatNeedTimeWaitForTheNTPZone(t *testing.T) {
	a := newTimedAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	setFaults(t, a, `{"zones": {}, "timesync": {"synced": false}}`)
	crucible, dns, ntp := sledconfigtest.Crucible(0), sledconfigtest.InternalDNS(0), sledconfigtest.InternalNTP(0)
	putZones(t, c, 1, crucible, dns, ntp)
	waitStates(t, c, map[string]string{dns.Name(): "running", ntp.Name(): "running", crucible.Name(): "waiting"})
	waitFor(t, "the crucible held back by time", func() (bool, string) {
		res, msg := zoneResult(t, c, crucible.ID)
		return res == "err" && strings.Contains(msg, "time not yet synchronized: NTP zone reports no reference time yet"), res + " " + msg
	})
	zs, err := c.Zone(t.Context(), crucible.ID)
	if err != nil || zs.Attempts != 0 || zs.LastError != "" || !strings.HasPrefix(zs.WaitingFor, "time not yet synchronized: ") {
		t.Fatalf("held crucible: %+v, %v (waiting is not failing: no attempts, no error, why it waits)", zs, err)
	}
	setFaults(t, a, `{"zones": {}, "timesync": {"synced": true}}`)
	waitStates(t, c, map[string]string{dns.Name(): "running", ntp.Name(): "running", crucible.Name(): "running"})
	inv, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ts := inv.TimeSync; ts == nil || !ts.Synced || ts.Source != "192.0.2.1" || ts.Stratum != 2 || ts.Since.IsZero() || !strings.Contains(ts.NTPAdmin, ":10123") {
		t.Fatalf("inventory's timesync: %+v", ts)
	}
	// Held unsynchronized again: reported, the running crucible stays.
	setFaults(t, a, `{"zones": {}, "timesync": {"synced": false}}`)
	waitFor(t, "the loss of sync reported", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.TimeSync == nil {
			return false, "no inventory"
		}
		return !inv.TimeSync.Synced && strings.Contains(inv.TimeSync.Reason, "no reference time yet"), inv.TimeSync.Reason
	})
	if zs, err := c.Zone(t.Context(), crucible.ID); err != nil || zs.State != "running" {
		t.Fatalf("crucible after a loss of sync: %+v, %v", zs, err)
	}
}

// Without an NTP zone in the config the crucible waits, saying so; with
// --skip-timesync it starts.
func TestNoNTPZoneAndSkipTimesync(t *testing.T) {
	crucible := sledconfigtest.Crucible(0)
	a := newTimedAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	putZones(t, c, 1, crucible)
	waitFor(t, "the crucible held back by time", func() (bool, string) {
		res, msg := zoneResult(t, c, crucible.ID)
		return res == "err" && strings.Contains(msg, "time not yet synchronized: no NTP zone in the config"), res + " " + msg
	})

	skip := newTimedAgent(t, agent.Config{DataDir: t.TempDir(), SkipTimesync: true})
	run(t, skip)
	c = newClient(t, skip)
	putZones(t, c, 1, crucible)
	waitStates(t, c, map[string]string{crucible.Name(): "running"})
	inv, err := c.AgentInventory(t.Context())
	if err != nil || inv.TimeSync == nil || !inv.TimeSync.Skipped {
		t.Fatalf("inventory's timesync with --skip-timesync: %+v, %v", inv.TimeSync, err)
	}
}

// The NTP zone removed from the config: zones needing time that start
// afterwards wait again, saying why; those running keep running.
func TestNTPZoneRemoved(t *testing.T) {
	a := newTimedAgent(t, agent.Config{DataDir: t.TempDir()})
	run(t, a)
	c := newClient(t, a)
	first, second, ntp := sledconfigtest.Crucible(0), sledconfigtest.Crucible(1), sledconfigtest.InternalNTP(0)
	putZones(t, c, 1, first, ntp)
	waitStates(t, c, map[string]string{first.Name(): "running", ntp.Name(): "running"})
	putZones(t, c, 2, first, second)
	waitFor(t, "the new crucible held back by time", func() (bool, string) {
		res, msg := zoneResult(t, c, second.ID)
		return res == "err" && strings.Contains(msg, "time not yet synchronized: no NTP zone in the config"), res + " " + msg
	})
	if zs, err := c.Zone(t.Context(), first.ID); err != nil || zs.State != "running" {
		t.Fatalf("the running crucible: %+v, %v", zs, err)
	}
}
