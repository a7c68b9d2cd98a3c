package agent_test

import (
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The sim runtime keeps its simulated OS in the data dir, so a restarted
// agent finds the zones the last one left running, as on a real sled.
func TestRestartAdoptsZonesWithoutRestartingThem(t *testing.T) {
	cfg := example(t)
	dir := t.TempDir()
	first := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	stop := run(t, first)
	c := newClient(t, first)
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatalf("PUT /omicron-config: %v", err)
	}
	waitStates(t, c, allRunning(cfg))
	before := map[string]uint64{}
	for _, name := range zoneNames(cfg) {
		n, ok := first.Sim().Incarnation(name)
		if !ok {
			t.Fatalf("zone %s not in the sim", name)
		}
		before[name] = n
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	second := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	run(t, second)
	c = newClient(t, second)
	waitFor(t, "restore done", func() (bool, string) {
		rs, err := c.Restore(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return rs.Done, "not done"
	})
	rs, err := c.Restore(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rs.Found != len(cfg.Zones) || rs.Adopted != len(cfg.Zones) || !rs.HadConfig {
		t.Errorf("GET /agent/restore = %+v, want all %d zones found and adopted", rs, len(cfg.Zones))
	}
	waitStates(t, c, allRunning(cfg))
	for name, n := range before {
		if got, _ := second.Sim().Incarnation(name); got != n {
			t.Errorf("zone %s restarted: incarnation %d → %d", name, n, got)
		}
		zd, err := c.Zone(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		// The history outlives the agent: what the first one did comes
		// before the adoption; nothing is started or stopped after it.
		adopted := -1
		for i, e := range zd.History {
			if e.Event == "adopted" {
				adopted = i
			}
		}
		if adopted < 0 {
			t.Errorf("zone %s: no adoption in its history: %+v", name, zd.History)
		}
		for _, e := range zd.History[adopted+1:] {
			if e.Event == "start" || e.Event == "stop" {
				t.Errorf("zone %s: %q after the restart; it should have been adopted", name, e.Event)
			}
		}
	}
}

func TestOneAgentPerDataDir(t *testing.T) {
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir})
	run(t, a)
	_, err := agent.New(agent.Config{DataDir: dir, Listen: "127.0.0.1:0"}, nil)
	if err == nil || !strings.Contains(err.Error(), "in use by another sled agent") {
		t.Fatalf("a second agent on the same data dir: %v", err)
	}
}

func TestTeardownEmptiesTheSledAndKeepsTheLedger(t *testing.T) {
	cfg := example(t)
	dir := t.TempDir()
	a := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	stop := run(t, a)
	c := newClient(t, a)
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatal(err)
	}
	waitStates(t, c, allRunning(cfg))
	if _, err := agent.Teardown(t.Context(), agent.Config{DataDir: dir}, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("teardown beside a running agent: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	removed, err := agent.Teardown(t.Context(), agent.Config{DataDir: dir}, nil)
	if err != nil || len(removed) != len(cfg.Zones) {
		t.Fatalf("teardown removed %d (%v), want %d zones", len(removed), err, len(cfg.Zones))
	}
	again := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	if cur := again.Store().Current(); cur == nil || cur.Generation != cfg.Generation {
		t.Fatalf("ledger after teardown: %v", cur)
	}
	if obs, err := again.Sim().List(t.Context()); err != nil || len(obs) != 0 {
		t.Fatalf("zones after teardown: %v, %v", obs, err)
	}
	again.Close()
}
