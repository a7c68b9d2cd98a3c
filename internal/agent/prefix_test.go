package agent_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

const (
	testBootstrap = "fdb0:a840:2504:101::/64"
	testUnderlay  = "fd00:1122:3344:101::/64" // of agent.DefaultUnderlayIP
	dnsPrefix     = "fd00:1122:3344:1::/64"   // of sledconfigtest.InternalDNS(0)'s gz_address
)

func startDDM(t *testing.T) *ddmsim.Server {
	t.Helper()
	d := ddmsim.New(nil)
	if err := d.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// withDDM is an agent config for the sim runtime that keeps its prefixes
// in d; period is the prefix reconciler's.
func withDDM(dir string, d *ddmsim.Server, period time.Duration) agent.Config {
	return agent.Config{DataDir: dir, DDMURL: d.URL(), BootstrapPrefix: testBootstrap, PrefixPeriod: period}
}

func originated(d *ddmsim.Server) []string {
	var out []string
	for _, p := range d.Originated() {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// waitOriginated waits until d originates exactly want.
func waitOriginated(t *testing.T, d *ddmsim.Server, want ...string) time.Duration {
	t.Helper()
	slices.Sort(want)
	t0 := time.Now()
	waitFor(t, fmt.Sprintf("DDM to originate %v", want), func() (bool, string) {
		got := originated(d)
		return slices.Equal(got, want), fmt.Sprint(got)
	})
	return time.Since(t0)
}

func putZones(t *testing.T, c *client.Client, gen uint64, zones ...sledconfig.Zone) {
	t.Helper()
	doc, err := json.Marshal(sledconfigtest.Config(gen, zones...))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutConfig(t.Context(), doc); err != nil {
		t.Fatalf("PUT /omicron-config: %v", err)
	}
}

// An hour's period: only the zone reconciler's word can bring the change.
func TestRemovedDNSZoneIsWithdrawnAtOnce(t *testing.T) {
	d := startDDM(t)
	_, c := start(t, withDDM(t.TempDir(), d, time.Hour))
	dns, crucible := sledconfigtest.InternalDNS(0), sledconfigtest.Crucible(0)
	putZones(t, c, 1, dns, crucible)
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)

	putZones(t, c, 2, crucible)
	took := waitOriginated(t, d, testBootstrap, testUnderlay)
	t.Logf("withdrawn %s after the PUT", took.Round(time.Millisecond))
	inv, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.DDM == nil || inv.DDM.URL != d.URL() || len(inv.DDM.Desired) != 2 || inv.DDM.LastSuccess == nil || inv.DDM.LastError != "" {
		t.Fatalf("inventory ddm %+v", inv.DDM)
	}
	last := inv.DDM.History[len(inv.DDM.History)-1]
	if last.Action != "withdrew" || last.Prefix != dnsPrefix || last.Why != "no longer wanted" {
		t.Fatalf("last change %+v", last)
	}
}

// The agent dies after ledgering a config without the DNS zone, before the
// zone is torn down: the restarted agent withdraws the prefix all the same.
func TestCrashBeforeTeardownStillWithdraws(t *testing.T) {
	d := startDDM(t)
	dir := t.TempDir()
	first := newAgent(t, withDDM(dir, d, time.Hour))
	stop := run(t, first)
	c := newClient(t, first)
	dns, crucible := sledconfigtest.InternalDNS(0), sledconfigtest.Crucible(0)
	putZones(t, c, 1, dns, crucible)
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open([]string{filepath.Join(dir, "ledger-a"), filepath.Join(dir, "ledger-b")}, agent.LedgerFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(sledconfigtest.Config(2, crucible))
	if err := configstore.Open(l, nil, nil, configstore.Options{}).Put(t.Context(), doc); err != nil {
		t.Fatal(err)
	}

	second := newAgent(t, withDDM(dir, d, time.Hour))
	run(t, second)
	waitOriginated(t, d, testBootstrap, testUnderlay)
	c = newClient(t, second)
	waitStates(t, c, map[string]string{crucible.Name(): "running"})
}

// A restarted agent must not withdraw the prefix of a DNS zone it adopts.
func TestRestartKeepsTheLiveDNSPrefix(t *testing.T) {
	d := startDDM(t)
	dir := t.TempDir()
	first := newAgent(t, withDDM(dir, d, time.Hour))
	stop := run(t, first)
	putZones(t, newClient(t, first), 1, sledconfigtest.InternalDNS(0))
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := d.Requests()["DELETE /prefix"]
	second := newAgent(t, withDDM(dir, d, time.Hour))
	run(t, second)
	c := newClient(t, second)
	waitFor(t, "the restarted agent's first prefix pass", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		return inv.DDM.Passes > 0, fmt.Sprintf("%+v", inv.DDM)
	})
	if n := d.Requests()["DELETE /prefix"]; n != before {
		t.Fatalf("the restarted agent withdrew something (%d withdrawals); originated %v", n-before, originated(d))
	}
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
}

// A restarted agent keeps the prefix of a DNS zone it finds existing but
// not answering: the zone is waited for, not running, and its prefix must
// stay in DDM the whole time (it was withdrawn until the service answered).
func TestRestartKeepsThePrefixOfADNSZoneSlowToAnswer(t *testing.T) {
	d := startDDM(t)
	dir := t.TempDir()
	dns := sledconfigtest.InternalDNS(0)
	first := newAgent(t, withDDM(dir, d, time.Hour))
	stop := run(t, first)
	putZones(t, newClient(t, first), 1, dns)
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	faults := filepath.Join(t.TempDir(), "faults.json")
	if err := os.WriteFile(faults, []byte(`{"zones":{"`+dns.ID+`":{"health":"fail"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := d.Requests()["DELETE /prefix"]
	cfg := withDDM(dir, d, time.Hour)
	cfg.SimFaults = faults
	second := newAgent(t, cfg)
	run(t, second)
	c := newClient(t, second)
	waitFor(t, "the restarted agent's first prefix pass, with the DNS zone not answering", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		return inv.DDM.Passes > 0, fmt.Sprintf("%+v", inv.DDM)
	})
	time.Sleep(500 * time.Millisecond) // passes that the zone's changes bring
	if z, err := c.Zone(t.Context(), dns.ID); err != nil || z.State == "running" {
		t.Fatalf("DNS zone %+v, %v: want it waited for, not running", z, err)
	}
	if n := d.Requests()["DELETE /prefix"]; n != before {
		t.Fatalf("the restarted agent withdrew a prefix while the DNS zone was slow to answer; originated %v", originated(d))
	}
	// It answers again: running, and the prefix never moved.
	if err := c.SetSimFaults(t.Context(), []byte(`{"zones":{}}`)); err != nil {
		t.Fatal(err)
	}
	waitStates(t, c, map[string]string{dns.Name(): "running"})
	if n := d.Requests()["DELETE /prefix"]; n != before {
		t.Fatalf("withdrawals after the DNS zone answered: %d", n-before)
	}
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
}

func TestDDMDownThenBackConverges(t *testing.T) {
	d := startDDM(t)
	if err := d.SetFault(ddmsim.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	_, c := start(t, withDDM(t.TempDir(), d, time.Hour))
	putZones(t, c, 1, sledconfigtest.InternalDNS(0))
	waitStates(t, c, map[string]string{sledconfigtest.InternalDNS(0).Name(): "running"})
	waitFor(t, "the failure reported", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		return inv.DDM.LastError != "" && inv.DDM.Failures > 0, fmt.Sprintf("%+v", inv.DDM)
	})
	back := time.Now()
	if err := d.SetFault(ddmsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	t.Logf("converged %s after DDM came back", time.Since(back).Round(time.Millisecond))
	waitFor(t, "the error cleared", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		return inv.DDM.LastError == "" && inv.DDM.InSync, fmt.Sprintf("%+v", inv.DDM)
	})
}

func TestDDMRestartedEmptyIsFilledAgain(t *testing.T) {
	d := startDDM(t)
	_, c := start(t, withDDM(t.TempDir(), d, 100*time.Millisecond))
	putZones(t, c, 1, sledconfigtest.InternalDNS(0))
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
	d.RestartEmpty()
	waitOriginated(t, d, testBootstrap, testUnderlay, dnsPrefix)
}

func TestForeignPrefixIsWithdrawnAndReported(t *testing.T) {
	d := startDDM(t)
	_, c := start(t, withDDM(t.TempDir(), d, 100*time.Millisecond))
	waitOriginated(t, d, testBootstrap, testUnderlay)
	foreign := netip.MustParsePrefix("fd00:dead:beef::/64")
	d.Inject(foreign)
	waitOriginated(t, d, testBootstrap, testUnderlay)
	// The report follows the withdrawal, by as little as the reconciler
	// takes to note it.
	waitFor(t, "the foreign prefix's withdrawal reported", func() (bool, string) {
		inv, err := c.AgentInventory(t.Context())
		if err != nil || inv.DDM == nil {
			return false, fmt.Sprint(err)
		}
		for _, ch := range inv.DDM.History {
			if ch.Prefix == foreign.String() && ch.Action == "withdrew" && ch.Why == "not this sled's" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", inv.DDM.History)
	})
}
