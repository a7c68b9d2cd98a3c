package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// The running agent checks its ledger copies: one deleted behind its back
// is written again.
func TestDeletedLedgerCopyIsRewritten(t *testing.T) {
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir, LedgerCheckPeriod: 20 * time.Millisecond, UnderlayIP: exampleSled})
	run(t, a)
	c := newClient(t, a)
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatal(err)
	}
	copyB := filepath.Join(dir, "ledger-b", agent.LedgerFile)
	if err := os.Remove(copyB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted copy to be rewritten", func() (bool, string) {
		_, err := os.Stat(copyB)
		if err != nil {
			return false, err.Error()
		}
		inv, err := c.AgentInventory(t.Context())
		if err != nil {
			return false, err.Error()
		}
		for _, cp := range inv.Ledger.Copies {
			if cp.State != "ok" || cp.Generation != 351 {
				return false, fmt.Sprintf("%+v", inv.Ledger.Copies)
			}
		}
		return true, ""
	})
}

// The sled's own underlay address (--underlay-ip) is refused as a zone's.
func TestZoneOnTheSledsAddressIsRefused(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir()}) // underlay-ip fd00:1122:3344:101::1
	run(t, a)
	c := newClient(t, a)
	z := sledconfigtest.Crucible(0)
	z.ZoneType.Address = "[" + agent.DefaultUnderlayIP + "]:32345"
	doc, err := json.Marshal(sledconfigtest.Config(2, z))
	if err != nil {
		t.Fatal(err)
	}
	err = c.PutConfig(t.Context(), doc)
	want := `zones["` + z.ID + `"].zone_type.address: underlay address fd00:1122:3344:101::1 is the sled's own underlay address`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "400") {
		t.Fatalf("PUT = %v, want a 400 saying %s", err, want)
	}
	if cur := a.Store().Current(); cur != nil {
		t.Fatalf("generation %d ledgered", cur.Generation)
	}
}
