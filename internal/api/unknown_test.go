package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// A config whose zones carry members this agent does not know (sent by a
// newer control plane) is ledgered as given and restarts no zone: upstream
// ignores such members, and a zone is realised from what it knows.
func TestUnknownMembersRestartNoZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSled(t, sim.Options{RecordCalls: true})
		zones := sledconfigtest.Crucibles(3)
		doc := func(gen uint64, extra bool) []byte {
			t.Helper()
			b, err := json.Marshal(sledconfigtest.Config(gen, zones...))
			if err != nil {
				t.Fatal(err)
			}
			if !extra {
				return b
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			z := m["zones"].(map[string]any)[zones[1].ID].(map[string]any)
			z["added_in_a_later_version"] = map[string]any{"enabled": true}
			z["zone_type"].(map[string]any)["new_knob"] = 7
			b, err = json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		if r := s.put(doc(1, false)); r.status != http.StatusNoContent {
			t.Fatalf("PUT gen 1: %d %s", r.status, r.body)
		}
		synctest.Wait()
		before := len(s.rt.Calls())
		if ensures := countOps(s.rt.Calls(), "ensure"); ensures != len(zones) {
			t.Fatalf("%d ensures for %d zones", ensures, len(zones))
		}
		if r := s.put(doc(2, true)); r.status != http.StatusNoContent {
			t.Fatalf("PUT gen 2 with unknown members: %d %s", r.status, r.body)
		}
		synctest.Wait()
		for _, c := range s.rt.Calls()[before:] {
			if c.Op == "ensure" || c.Op == "destroy" {
				t.Errorf("after a config that only added unknown members: %s %s", c.Op, c.Zone)
			}
		}
		kept := 0
		for _, f := range s.ledgerFiles() {
			if strings.Contains(f, `"added_in_a_later_version"`) && strings.Contains(f, `"new_knob"`) {
				kept++
			}
		}
		if kept < 2 {
			t.Errorf("%d ledger copies keep the unknown members as given, want both", kept)
		}
		inv := s.agentInventory()
		for _, z := range inv["zone_states"].([]any) {
			z := z.(map[string]any)
			if z["state"] != "running" {
				t.Errorf("zone %v: %v", z["name"], z["state"])
			}
		}
	})
}

func countOps(calls []sim.Call, op string) int {
	n := 0
	for _, c := range calls {
		if c.Op == op {
			n++
		}
	}
	return n
}
