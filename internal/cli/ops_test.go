package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/api"
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
