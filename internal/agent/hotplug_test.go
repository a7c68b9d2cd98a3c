package agent_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// inventoryDisk is what GET /inventory says of one disk, as a client
// generated from upstream's document reads it.
type inventoryDisks struct {
	Disks []struct {
		Identity struct{ Serial string } `json:"identity"`
	} `json:"disks"`
	Last struct {
		ExternalDisks map[string]struct {
			Result  string `json:"result"`
			Message string `json:"message"`
		} `json:"external_disks"`
	} `json:"last_reconciliation"`
}

// diskSeen says whether GET /inventory lists the disk with serial, and its
// last reconciliation's result.
func diskSeen(w *wire, serial, diskID string) (listed bool, result string) {
	x := w.do(http.MethodGet, "/inventory", nil, http.StatusOK)
	var inv inventoryDisks
	if err := json.Unmarshal(x.Body, &inv); err != nil {
		w.t.Fatal(err)
	}
	for _, d := range inv.Disks {
		if d.Identity.Serial == serial {
			listed = true
		}
	}
	r := inv.Last.ExternalDisks[diskID]
	return listed, strings.TrimSpace(r.Result + " " + r.Message)
}

// newHotplugAgent runs a sim agent whose storage period (10 minutes) no
// test waits for, with a client of each kind, and the crucible whose disk
// the tests pull.
func newHotplugAgent(t *testing.T) (*agent.Agent, *client.Client, *wire, sledconfig.Zone) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir(), StoragePeriod: 10 * time.Minute})
	run(t, a)
	return a, newClient(t, a), newWire(t, a), sledconfigtest.Crucible(0)
}

// A disk pulled out (the sim's present fault) is missing from GET
// /inventory at once, with its storage period at 10 minutes: the fault is
// a disk event; put back, it is listed and managed again at once.
func TestPulledDiskShowsInInventoryAtOnce(t *testing.T) {
	a, c, w, z := newHotplugAgent(t)
	disk := sledconfigtest.DiskFor(*z.FilesystemPool)
	serial, diskID := disk.Identity.Serial, disk.ID
	putZones(t, c, 1, z)
	waitFor(t, "storage ensured", func() (bool, string) { return storageDone(a.Storage().Status()) })
	if listed, res := diskSeen(w, serial, diskID); !listed || res != "ok" {
		t.Fatalf("before: listed %v, %s", listed, res)
	}

	t0 := time.Now()
	setFaults(t, a, `{"zones": {}, "disks": {"`+serial+`": {"present": false}}}`)
	waitFor(t, "the pulled disk missing from GET /inventory", func() (bool, string) {
		listed, res := diskSeen(w, serial, diskID)
		return !listed && strings.HasPrefix(res, "err") && strings.Contains(res, "not found"), res
	})
	t.Logf("pulled out: missing from GET /inventory after %s", time.Since(t0).Round(time.Millisecond))

	t0 = time.Now()
	setFaults(t, a, `{"zones": {}}`)
	waitFor(t, "the disk put back listed and managed", func() (bool, string) {
		listed, res := diskSeen(w, serial, diskID)
		return listed && res == "ok", res
	})
	t.Logf("put back: listed and ok after %s", time.Since(t0).Round(time.Millisecond))
}

// A disk pulled out while its call hangs is reported not found at once,
// not when the hung call's deadline (a minute) ends.
func TestDiskPulledWhileItsCallHangs(t *testing.T) {
	a, c, w, z := newHotplugAgent(t)
	disk := sledconfigtest.DiskFor(*z.FilesystemPool)
	serial, diskID := disk.Identity.Serial, disk.ID
	setFaults(t, a, `{"zones": {}, "disks": {"`+serial+`": {"ensure": "hang"}}}`)
	putZones(t, c, 1, z)
	waitFor(t, "the disk's call in flight", func() (bool, string) {
		for _, d := range a.Storage().Status().Disks {
			if d.ID == diskID {
				return d.Activity != "", d.Activity
			}
		}
		return false, "no such disk"
	})
	t0 := time.Now()
	setFaults(t, a, `{"zones": {}, "disks": {"`+serial+`": {"ensure": "hang", "present": false}}}`)
	waitFor(t, "the pulled disk missing from GET /inventory", func() (bool, string) {
		listed, res := diskSeen(w, serial, diskID)
		return !listed && strings.HasPrefix(res, "err") && strings.Contains(res, "not found"), res
	})
	t.Logf("pulled out during a hung call: not found in GET /inventory after %s", time.Since(t0).Round(time.Millisecond))
}
