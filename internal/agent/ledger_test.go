package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The running agent checks its ledger copies: one deleted behind its back
// is written again.
func TestDeletedLedgerCopyIsRewritten(t *testing.T) {
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir, LedgerCheckPeriod: 20 * time.Millisecond})
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
		inv, err := c.Inventory(t.Context())
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
