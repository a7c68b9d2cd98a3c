package agent_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// A second linux agent with the same zone tag, on another data dir, does not
// start while the first runs, nor does a teardown of its data dir; the error
// names the first (its pid and data dir). Agents with other tags run side by
// side, and once the first has stopped the second starts.
func TestLinuxSecondAgentWithTheTagRefusesToStart(t *testing.T) {
	tag, prefix, dirA, runDir := linuxEnv(t)
	dirB := linuxDataDir(t)
	cfgA := agent.Config{DataDir: dirA, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: prefix}
	stopA := run(t, newAgent(t, cfgA))

	holder := fmt.Sprintf("pid %d, data dir %s", os.Getpid(), dirA)
	cfgB := cfgA
	cfgB.DataDir, cfgB.Listen = dirB, "127.0.0.1:0"
	if b, err := agent.New(cfgB, testLogger(t)); err == nil {
		b.Close()
		t.Fatal("a second agent with the same tag started")
	} else if !strings.Contains(err.Error(), holder) {
		t.Errorf("second agent: %v; want it to name %q", err, holder)
	}
	if _, err := agent.Teardown(t.Context(), cfgB, testLogger(t)); err == nil || !strings.Contains(err.Error(), holder) {
		t.Errorf("teardown of another data dir: %v; want it refused, naming %q", err, holder)
	}

	// Another tag is another set of zones.
	tagC, prefixC, dirC, runDirC := linuxEnv(t)
	stopC := run(t, newAgent(t, agent.Config{DataDir: dirC, RunDir: runDirC, Runtime: "linux", ZoneTag: tagC, NetnsPrefix: prefixC}))
	if err := stopC(); err != nil {
		t.Fatal(err)
	}

	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	b := newAgent(t, cfgB)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
