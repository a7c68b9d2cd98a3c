package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// A VMM zone of which the agent has no record is shown unknown, and
// removed only by the operator's command, with --yes.
func TestVMMRemoveUnknown(t *testing.T) {
	a := startAgentWith(t, agent.Config{LedgerCheckPeriod: 20 * time.Millisecond})
	const id = "00000000-0000-4000-8000-0000000000bb"
	stray := zone.Spec{Name: zone.VMMNamePrefix + id, ID: id, Hash: "x"}
	stray.Config.ZoneType.Type = zone.VMMZoneType
	if err := a.Sim().Ensure(t.Context(), stray); err != nil {
		t.Fatal(err)
	}
	want := "vmm " + id + "  unknown: zone " + stray.Name + " runs but no readable record of it: no record of it in "
	deadline := time.Now().Add(waitDeadline)
	for {
		out := sledAt(t, a.url, "inventory").ok(t).stdout
		if strings.Contains(out, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inventory does not show the VMM unknown (%q):\n%s", want, out)
		}
		time.Sleep(waitInterval)
	}
	sledAt(t, a.url, "vmm", "remove-unknown", id).failed(t, "pass --yes")
	if _, ok := a.Sim().Incarnation(stray.Name); !ok {
		t.Fatal("remove-unknown without --yes removed the zone")
	}
	out := sledAt(t, a.url, "vmm", "remove-unknown", id, "--yes").ok(t).stdout
	if !strings.Contains(out, "VMM "+id+" removed: zone "+stray.Name+" torn down (removed on purpose; ") {
		t.Errorf("remove-unknown said %q", out)
	}
	if _, ok := a.Sim().Incarnation(stray.Name); ok {
		t.Fatal("remove-unknown --yes left the zone")
	}
	sledAt(t, a.url, "vmm", "remove-unknown", id, "--yes").failed(t, "404", "no unknown VMM "+id)
	sledAt(t, a.url, "vmm", "remove-unknown", "nope", "--yes").failed(t, "400", `propolis_id "nope" is not a UUID`)
}
