package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
)

// A zone waiting on a disk that is gone shows that cause in the table, not
// the start of a long chain cut at the column's width.
func TestZoneTableRootCauseFirst(t *testing.T) {
	const (
		disk = "9272fa96-eef8-4c63-9e0b-5b2f6c1d7a10"
		pool = "oxp_5e8b1a2c-3d4e-4f50-8a6b-7c8d9e0f1a2b"
	)
	long := "storage not ready: pool " + pool + " is not managed: disk " + disk + ": disk not found"
	short := "time not yet synchronized: NTP zone reports no reference time yet"
	var b bytes.Buffer
	err := printZoneTable(&b, []api.ZoneSummary{
		{Name: "oxz_crucible_a", Wanted: true, State: "waiting", Since: time.Now(), WaitingFor: long},
		{Name: "oxz_crucible_b", Wanted: true, State: "waiting", Since: time.Now(), WaitingFor: short},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if len(lines) < 3 {
		t.Fatalf("table:\n%s", b.String())
	}
	for _, want := range []string{"waiting", "storage not ready: disk not found (disk 9272fa96…; pool oxp_5e8b1a2c… is not managed)"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("line %q does not show %q", lines[1], want)
		}
	}
	// A part in parentheses is one part; a root cause still too long has
	// its UUIDs shortened too.
	nested := "time not yet synchronized: NTP zone not running: oxz_ntp_a700528f-f600-4908-94ac-9c06442ef6b4 is waiting (" + long + ")"
	if got, want := rootFirst(nested, 100), "time not yet synchronized: oxz_ntp_a700528f… is waiting (storage not ready: pool oxp_5e8b1a2c… is n…"; got != want {
		t.Errorf("rootFirst(%q) = %q, want %q", nested, got, want)
	}
	// A message that fits is shown as it is.
	if !strings.Contains(lines[2], short) {
		t.Errorf("line %q does not show %q", lines[2], short)
	}
}

// inventory has a storage line (disks and datasets ok of all, what is
// wrong) and a time line (synchronized or not, and why).
func TestInventoryStorageAndTime(t *testing.T) {
	inv := &api.AgentInventory{
		Storage: &storage.Status{
			Configured: true,
			Disks: []storage.DiskStatus{
				{ID: "d1", Result: storage.Result{OK: true}},
				{ID: "9272fa96-eef8-4c63-9e0b-5b2f6c1d7a10", Result: storage.Result{Message: "disk not found"}},
			},
			Datasets: []storage.DatasetStatus{
				{Name: "oxp_a/crypt/zone", Result: storage.Result{OK: true}},
				{Name: "oxp_b/crypt/zone", Result: storage.Result{Message: "pool oxp_b is not managed: disk 9272fa96-eef8-4c63-9e0b-5b2f6c1d7a10: disk not found"}},
				{Name: "oxp_b/crypt/debug", Result: storage.Result{Message: "pool oxp_b is not managed"}},
			},
		},
		TimeSync: &timesync.Status{Reason: "NTP zone reports no reference time yet"},
	}
	var b bytes.Buffer
	if err := printInventory(&b, inv); err != nil {
		t.Fatal(err)
	}
	out := oneLine(b.String()) // whatever the columns' widths
	for _, want := range []string{
		"1/2 disks ok, 1/3 datasets ok",
		"disk 9272fa96-eef8-4c63-9e0b-5b2f6c1d7a10 disk not found",
		"dataset oxp_b/crypt/zone",
		"not synchronized: NTP zone reports no reference time yet",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inventory does not show %q:\n%s", want, out)
		}
	}
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	inv.TimeSync = &timesync.Status{Synced: true, Released: true, Since: since, Source: "ntp.example", Stratum: 2}
	b.Reset()
	if err := printInventory(&b, inv); err != nil {
		t.Fatal(err)
	}
	if want := "time synchronized since 2026-01-02 03:04:05; source ntp.example, stratum 2"; !strings.Contains(oneLine(b.String()), want) {
		t.Errorf("inventory does not show %q:\n%s", want, b.String())
	}
}

// A zone the NAT reconciler ignores for its NIC's VNI is shown, and why.
func TestInventoryNATIgnored(t *testing.T) {
	inv := &api.AgentInventory{NAT: &nat.Status{Discovery: nat.Discovery{Source: "dns"}, Desired: []string{}, Ignored: []string{"oxz_nexus_x: vni 7777"}}}
	var b bytes.Buffer
	if err := printInventory(&b, inv); err != nil {
		t.Fatal(err)
	}
	if want := "oxz_nexus_x: vni 7777: its NIC is outside the services VPC (VNI 100), so it gets no NAT entry"; !strings.Contains(oneLine(b.String()), want) {
		t.Errorf("inventory does not show %q:\n%s", want, b.String())
	}
}

// zone show of a zone removed from the config says it was removed, and
// when, with its history; the zone lists no longer show it.
func TestRemovedZoneShown(t *testing.T) {
	a, zones, _ := convergedAgent(t)
	var gone sledconfig.Zone
	for _, n := range slices.Sorted(maps.Keys(zones)) {
		if zones[n].ZoneType.Type == "crucible" {
			gone = zones[n]
			break
		}
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(sledconfig.Example(), &doc); err != nil {
		t.Fatal(err)
	}
	var zs map[string]json.RawMessage
	if err := json.Unmarshal(doc["zones"], &zs); err != nil {
		t.Fatal(err)
	}
	delete(zs, gone.ID)
	doc["zones"], _ = json.Marshal(zs)
	doc["generation"] = json.RawMessage("352")
	next, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	sledAt(t, a.url, "config", "put", writeFile(t, "sled-config.json", next)).ok(t)

	deadline := time.Now().Add(waitDeadline)
	for {
		r := sledAt(t, a.url, "zones").ok(t)
		if !strings.Contains(r.stdout, gone.Name()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, the removed zone is still listed:\n%s", waitDeadline, r.stdout)
		}
		time.Sleep(waitInterval)
	}
	for _, key := range []string{gone.Name(), gone.ID} {
		r := sledAt(t, a.url, "zone", "show", key).ok(t)
		for _, want := range []string{"removed from the config, torn down at ", "state", "removed; last ", "running", "removed", "no longer in the config"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("zone show %s of a removed zone does not show %q:\n%s", key, want, r.stdout)
			}
		}
	}
	r := sledAt(t, a.url, "zone", "show", gone.ID, "-o", "json").ok(t)
	var z api.ZoneDetail
	if err := json.Unmarshal([]byte(r.stdout), &z); err != nil {
		t.Fatal(err)
	}
	if z.RemovedAt == nil || len(z.History) == 0 || z.History[len(z.History)-1].Event != "removed" {
		t.Errorf("zone show -o json of a removed zone: removed_at %v, history %+v", z.RemovedAt, z.History)
	}
}

// A zone's history survives an agent restart: the agent keeps the
// histories in its data dir.
func TestZoneHistorySurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	run := func() (url string, stop func()) {
		a, err := agent.New(agent.Config{Listen: "127.0.0.1:0", DataDir: dir, UnderlayIP: exampleSled}, slog.New(slog.NewTextHandler(t.Output(), nil)))
		if err != nil {
			t.Fatalf("agent.New: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		stopped := false
		stop = func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(waitDeadline):
				t.Errorf("Run did not return within %s of its context being cancelled", waitDeadline)
			}
		}
		t.Cleanup(stop)
		return "http://" + a.Addr(), stop
	}
	url, stop := run()
	sledAt(t, url, "config", "put", writeFile(t, "sled-config.json", sledconfig.Example())).ok(t)
	zones := exampleZones(t)
	names := slices.Sorted(maps.Keys(zones))
	waitAllRunning(t, &testAgent{url: url}, names)
	var before api.ZoneDetail
	if err := json.Unmarshal([]byte(sledAt(t, url, "zone", "show", names[0], "-o", "json").ok(t).stdout), &before); err != nil {
		t.Fatal(err)
	}
	stop()

	url, _ = run()
	waitAllRunning(t, &testAgent{url: url}, names) // adopted
	var after api.ZoneDetail
	if err := json.Unmarshal([]byte(sledAt(t, url, "zone", "show", names[0], "-o", "json").ok(t).stdout), &after); err != nil {
		t.Fatal(err)
	}
	if len(after.History) < len(before.History) {
		t.Fatalf("after a restart, %d events, want the %d before and any since: %+v", len(after.History), len(before.History), after.History)
	}
	for i, e := range before.History {
		if a := after.History[i]; !a.At.Equal(e.At) || a.Event != e.Event {
			t.Errorf("after a restart, event %d = %+v, want %+v", i, a, e)
		}
	}
}
