package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// moveLedgerAside moves the data dir's ledger directories aside, as an
// operator's mistake or a lost disk would.
func moveLedgerAside(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"ledger-a", "ledger-b"} {
		p := filepath.Join(dir, d)
		if err := os.Rename(p, p+".aside"); err != nil {
			t.Fatal(err)
		}
	}
}

// Without a readable sled config the agent does not know which zones are
// wanted, so it does not know which of its NAT entries are: it deletes
// none while the zones run unmanaged.
func TestLostLedgerKeepsNATEntries(t *testing.T) {
	s := startSwitches(t, 1)
	s.publish(s.dpd...)
	dir := t.TempDir()
	first := newAgent(t, s.config(dir))
	stop := run(t, first)
	c := newClient(t, first)
	putZones(t, c, 1, nexusZone)
	waitStates(t, c, map[string]string{nexusZone.Name(): "running"})
	waitEntries(t, s.dpd[0], nexusEntry)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	moveLedgerAside(t, dir)
	second := newAgent(t, s.config(dir))
	run(t, second)
	c = newClient(t, second)
	// Several passes, each of which would have deleted the entry.
	waitFor(t, "NAT passes of the restarted agent", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.NAT == nil || len(inv.NAT.Switches) == 0 {
			return false, fmt.Sprint(err)
		}
		sw := inv.NAT.Switches[0]
		return sw.Passes >= 3 && len(sw.Kept) == 1, fmt.Sprintf("%+v", sw)
	})
	if got := ours(s.dpd[0]); len(got) != 1 || got[0] != nexusEntry {
		t.Fatalf("the NAT entry of a zone still running, with the ledger lost: %v, want [%s]", got, nexusEntry)
	}
}

// Likewise the routing prefix of an internal DNS zone that still runs.
func TestLostLedgerKeepsDNSPrefix(t *testing.T) {
	d := startDDM(t)
	dir := t.TempDir()
	first := newAgent(t, withDDM(dir, d, time.Hour))
	stop := run(t, first)
	putZones(t, newClient(t, first), 1, sledconfigtest.InternalDNS(0))
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	moveLedgerAside(t, dir)
	before := d.Requests()["DELETE /prefix"]
	second := newAgent(t, withDDM(dir, d, time.Hour))
	run(t, second)
	c := newClient(t, second)
	waitFor(t, "the restarted agent's first prefix pass", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		return inv.DDM.Passes > 0 && slices.Equal(inv.DDM.Kept, []string{dnsPrefix}), fmt.Sprintf("%+v", inv.DDM)
	})
	if n := d.Requests()["DELETE /prefix"]; n != before {
		t.Fatalf("with the ledger lost, the agent withdrew %d prefixes; originated %v", n-before, originated(d))
	}
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
}
