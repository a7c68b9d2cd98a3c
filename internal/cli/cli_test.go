package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/agent/agenttest"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Deadlines of the hang detectors; nothing here asserts how fast anything is.
const (
	waitDeadline = 20 * time.Second
	waitInterval = 20 * time.Millisecond
	// devDeadline bounds the whole dev run, whose zones take up to 3 s each
	// to start.
	devDeadline = 60 * time.Second
)

// testAgent is an agent running in-process on loopback.
type testAgent struct {
	*agent.Agent
	url string
}

// exampleSled is the underlay address of the example config's sled, as
// dev's.
const exampleSled = "fd00:1122:3344:103::1"

// startAgent runs an agent until the test ends.
func startAgent(t *testing.T) *testAgent {
	t.Helper()
	return startAgentWith(t, agent.Config{})
}

// startAgentWith runs an agent set up by cfg, on loopback with a temporary
// data dir, until the test ends.
func startAgentWith(t *testing.T, cfg agent.Config) *testAgent {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	if cfg.UnderlayIP == "" {
		cfg.UnderlayIP = exampleSled // the example config's zones are in its /64
	}
	a := agenttest.Run(t, cfg)
	return &testAgent{Agent: a, url: "http://" + a.Addr()}
}

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
}

// sled runs the command line with args and captures its output.
func sled(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// sledAt runs an operator command against the agent at url.
func sledAt(t *testing.T, url string, args ...string) result {
	t.Helper()
	return sled(t, append([]string{"--url", url}, args...)...)
}

// ok fails the test unless r succeeded quietly.
func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	return r
}

// failed fails the test unless r exited 1 with one line on stderr, saying
// "sled-agent: " and then every one of want, and nothing on stdout. It
// returns the reason.
func (r result) failed(t *testing.T, want ...string) string {
	t.Helper()
	if r.code != 1 {
		t.Errorf("exit %d, want 1; stdout:\n%s", r.code, r.stdout)
	}
	if r.stdout != "" {
		t.Errorf("stdout of a failed command = %q, want nothing", r.stdout)
	}
	reason, ok := strings.CutPrefix(r.stderr, "sled-agent: ")
	if !ok || !strings.HasSuffix(reason, "\n") || strings.Count(reason, "\n") != 1 || strings.TrimSpace(reason) == "" {
		t.Errorf("stderr = %q, want one line \"sled-agent: <reason>\"", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(reason, w) {
			t.Errorf("reason %q does not mention %q", reason, w)
		}
	}
	return reason
}

// writeFile writes data to a new file in a temporary directory.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func exampleZones(t *testing.T) map[string]sledconfig.Zone {
	t.Helper()
	cfg, err := sledconfig.Parse(sledconfig.Example())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]sledconfig.Zone{}
	for _, z := range cfg.Zones {
		byName[z.Name()] = z
	}
	return byName
}

// waitAllRunning waits until every zone of the example config runs.
func waitAllRunning(t *testing.T, a *testAgent, names []string) {
	t.Helper()
	c, err := client.New(a.url)
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = 5 * time.Second
	deadline := time.Now().Add(waitDeadline)
	for {
		running, err := c.Zones(t.Context())
		if err == nil && slices.Equal(running, names) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, running zones %q (err %v), want %q", waitDeadline, running, err, names)
		}
		time.Sleep(waitInterval)
	}
}

// convergedAgent runs an agent, puts the example config with the CLI and
// waits for every zone to run.
func convergedAgent(t *testing.T) (*testAgent, map[string]sledconfig.Zone, []string) {
	t.Helper()
	a := startAgent(t)
	zones := exampleZones(t)
	names := slices.Sorted(maps.Keys(zones))
	sledAt(t, a.url, "config", "put", writeFile(t, "sled-config.json", sledconfig.Example())).ok(t)
	waitAllRunning(t, a, names)
	return a, zones, names
}

func TestConfigPut(t *testing.T) {
	a := startAgent(t)
	path := writeFile(t, "sled-config.json", sledconfig.Example())

	r := sledAt(t, a.url, "config", "put", path).ok(t)
	if want := "config generation 351 ledgered; zones are being reconciled (see: sled-agent zones)\n"; r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	if cur := a.Store().Current(); cur == nil || cur.Generation != 351 {
		t.Errorf("ledgered config after put = %v, want generation 351", cur)
	}
	// The same config again is accepted as already ledgered.
	sledAt(t, a.url, "config", "put", path).ok(t)

	sledAt(t, a.url, "config", "put", filepath.Join(t.TempDir(), "missing.json")).failed(t, "reading config", "missing.json")
	sledAt(t, a.url, "config", "put").failed(t, "accepts 1 arg")
}

func TestConfigPutInvalid(t *testing.T) {
	a := startAgent(t)
	// A config whose first zone's id differs from its key.
	var doc map[string]any
	if err := json.Unmarshal(sledconfig.Example(), &doc); err != nil {
		t.Fatal(err)
	}
	zones := doc["zones"].(map[string]any)
	first := slices.Sorted(maps.Keys(zones))[0]
	zones[first].(map[string]any)["id"] = "00000000-0000-4000-8000-000000000001"
	bad, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}

	// What the server says about it, asked directly.
	c, err := client.New(a.url)
	if err != nil {
		t.Fatal(err)
	}
	err = c.PutConfig(t.Context(), bad)
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Body.Message == "" {
		t.Fatalf("PUT of an invalid config: %v, want a 400 with a message", err)
	}

	sledAt(t, a.url, "config", "put", writeFile(t, "bad.json", bad)).failed(t, "400", oneLine(apiErr.Body.Message))
	if cur := a.Store().Current(); cur != nil {
		t.Errorf("an invalid config was ledgered: generation %d", cur.Generation)
	}

	// Not JSON at all: still one line, with the server's reason.
	sledAt(t, a.url, "config", "put", writeFile(t, "junk.json", []byte("{\n\"generation\": \n"))).failed(t, "400", "invalid sled config")
}

func TestOperatorCommands(t *testing.T) {
	a, zones, names := convergedAgent(t)

	t.Run("inventory", func(t *testing.T) {
		r := sledAt(t, a.url, "inventory").ok(t)
		for _, want := range []string{a.SledID(), "gimlet", "generation 351, 13 zones", "last reconciliation", "generation 351: 13/13 zones ok", "simulated; reservoir "} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("inventory does not show %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("inventory json", func(t *testing.T) {
		r := sledAt(t, a.url, "inventory", "-o", "json").ok(t)
		var inv api.AgentInventory
		if err := json.Unmarshal([]byte(r.stdout), &inv); err != nil {
			t.Fatalf("inventory -o json is not JSON: %v\n%s", err, r.stdout)
		}
		if inv.SledID != a.SledID() {
			t.Errorf("sled_id = %q, want %q", inv.SledID, a.SledID())
		}
		if inv.LedgeredConfig == nil || inv.LedgeredConfig.Generation != 351 || len(inv.ZoneStates) != 13 {
			t.Errorf("ledgered_config = %v and %d zone states, want generation 351 and 13", inv.LedgeredConfig, len(inv.ZoneStates))
		}
	})

	t.Run("inventory upstream", func(t *testing.T) {
		r := sledAt(t, a.url, "inventory", "--upstream").ok(t)
		var inv api.Inventory
		if err := json.Unmarshal([]byte(r.stdout), &inv); err != nil {
			t.Fatalf("inventory --upstream is not JSON: %v\n%s", err, r.stdout)
		}
		if inv.SledID != a.SledID() {
			t.Errorf("sled_id = %q, want %q", inv.SledID, a.SledID())
		}
		if inv.LedgeredSledConfig == nil || inv.LedgeredSledConfig.Generation != 351 {
			t.Errorf("ledgered_sled_config = %v, want generation 351", inv.LedgeredSledConfig)
		}
		if strings.Contains(r.stdout, "zone_states") {
			t.Errorf("upstream's inventory has our zone_states")
		}
	})

	t.Run("zones table", func(t *testing.T) {
		r := sledAt(t, a.url, "zones").ok(t)
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 1+len(names) || !strings.HasPrefix(lines[0], "ZONE ") {
			t.Fatalf("want a header and %d zones:\n%s", len(names), r.stdout)
		}
		var got [][2]string
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) < 2 {
				t.Fatalf("zone line %q has no state", l)
			}
			got = append(got, [2]string{f[0], f[1]})
		}
		var want [][2]string
		for _, n := range names {
			want = append(want, [2]string{n, "running"})
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("zones (name, state) (-want +got):\n%s", diff)
		}
	})

	t.Run("zones json", func(t *testing.T) {
		r := sledAt(t, a.url, "zones", "-o", "json").ok(t)
		var got []api.ZoneSummary
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("zones -o json is not a JSON array of zones: %v\n%s", err, r.stdout)
		}
		if len(got) != len(names) {
			t.Errorf("zones -o json lists %d zones, want %d", len(got), len(names))
		}
	})

	t.Run("zones running json", func(t *testing.T) {
		r := sledAt(t, a.url, "zones", "--running", "-o", "json").ok(t)
		var got []string
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("zones --running -o json is not a JSON array of names: %v\n%s", err, r.stdout)
		}
		if diff := cmp.Diff(names, got); diff != "" {
			t.Errorf("running zones (-want +got):\n%s", diff)
		}
	})

	t.Run("zones running table", func(t *testing.T) {
		r := sledAt(t, a.url, "zones", "--running").ok(t)
		if diff := cmp.Diff(strings.Join(names, "\n")+"\n", r.stdout); diff != "" {
			t.Errorf("zones --running (-want +got):\n%s", diff)
		}
	})

	z := zones[names[0]]
	for _, arg := range []string{z.ID, z.Name()} {
		t.Run("zone show "+arg, func(t *testing.T) {
			r := sledAt(t, a.url, "zone", "show", arg).ok(t)
			for _, want := range []string{z.Name(), z.ID, z.ZoneType.Type, "running since", "history:", "start", "started in"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("zone show does not show %q:\n%s", want, r.stdout)
				}
			}
		})
	}

	t.Run("zone show json", func(t *testing.T) {
		r := sledAt(t, a.url, "zone", "show", z.ID, "-o", "json").ok(t)
		var got api.ZoneDetail
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("zone show -o json is not JSON: %v\n%s", err, r.stdout)
		}
		if got.Name != z.Name() || got.State != "running" || len(got.History) == 0 {
			t.Errorf("zone show -o json = %+v, want %s running with a history", got, z.Name())
		}
	})

	t.Run("zone show nope", func(t *testing.T) {
		sledAt(t, a.url, "zone", "show", "nope").failed(t, "404", "nope")
	})

	for _, args := range [][]string{
		{"inventory", "-o", "yaml"},
		{"zones", "-o", "yaml"},
		{"-o", "yaml", "zones", "--running"},
		{"zone", "show", z.ID, "-o", "yaml"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			sledAt(t, a.url, args...).failed(t, "yaml", "table or json")
		})
	}
}

func TestFailingZonesShown(t *testing.T) {
	zones := exampleZones(t)
	// Two zones that other zones do not wait for: not the NTP zone, which
	// every zone that needs synchronized time waits for.
	var names []string
	for _, n := range slices.Sorted(maps.Keys(zones)) {
		if !strings.HasPrefix(n, "oxz_ntp_") {
			names = append(names, n)
		}
	}
	failing := []sledconfig.Zone{zones[names[0]], zones[names[len(names)-1]]}
	faults := writeFile(t, "faults.json", []byte(fmt.Sprintf(
		`{"zones": {%q: {"start": "fail"}, %q: {"start": "fail"}}}`, failing[0].ID, failing[1].ID)))
	a := startAgentWith(t, agent.Config{SimFaults: faults})
	sledAt(t, a.url, "config", "put", writeFile(t, "sled-config.json", sledconfig.Example())).ok(t)

	// Every completed pass has the same outcome: both failing zones fail.
	deadline := time.Now().Add(waitDeadline)
	for {
		r := sledAt(t, a.url, "inventory").ok(t)
		if strings.Contains(r.stdout, "generation 351: 11/13 zones ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, inventory shows no pass with 11/13 zones ok:\n%s", waitDeadline, r.stdout)
		}
		time.Sleep(waitInterval)
	}
	wantIDs := []string{failing[0].ID, failing[1].ID}
	slices.Sort(wantIDs)
	// The failed zones are listed in a stable order (by id), whatever the
	// order of the map they come from.
	for range 8 {
		r := sledAt(t, a.url, "inventory").ok(t)
		var ids []string
		for _, l := range strings.Split(r.stdout, "\n") {
			rest, ok := strings.CutPrefix(l, "  zone ")
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			ids = append(ids, f[0])
			if !strings.Contains(rest, "injected fault") {
				t.Errorf("failed zone line %q does not say why", l)
			}
		}
		if diff := cmp.Diff(wantIDs, ids); diff != "" {
			t.Fatalf("failed zones in inventory (-want +got):\n%s\n%s", diff, r.stdout)
		}
	}

	r := sledAt(t, a.url, "zone", "show", failing[0].ID).ok(t)
	for _, want := range []string{"attempts", "last error", "injected fault", "start failed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("zone show of a failing zone does not show %q:\n%s", want, r.stdout)
		}
	}
}

// Zones held by a gate read waiting, with why, in the operator commands;
// nothing says they failed.
func TestWaitingZonesShown(t *testing.T) {
	zones := exampleZones(t)
	faults := writeFile(t, "faults.json", []byte(`{"timesync": {"synced": false}}`))
	a := startAgentWith(t, agent.Config{SimFaults: faults})
	sledAt(t, a.url, "config", "put", writeFile(t, "sled-config.json", sledconfig.Example())).ok(t)
	var crucible sledconfig.Zone
	for _, n := range slices.Sorted(maps.Keys(zones)) {
		if zones[n].ZoneType.Type == "crucible" {
			crucible = zones[n]
			break
		}
	}
	const why = "time not yet synchronized: NTP zone reports no reference time yet"

	deadline := time.Now().Add(waitDeadline)
	for {
		r := sledAt(t, a.url, "zones").ok(t)
		var line string
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(l, crucible.Name()+" ") {
				line = l
			}
		}
		if f := strings.Fields(line); len(f) > 1 && f[1] == "waiting" && strings.Contains(line, why) {
			if strings.Contains(r.stdout, "failed") {
				t.Errorf("zones held by time read failed:\n%s", r.stdout)
			}
			if !strings.Contains(line, "looked at again when it changes, or in ") {
				t.Errorf("waiting zone's line %q does not say when it is looked at again", line)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %s is not shown waiting for time:\n%s", waitDeadline, crucible.Name(), r.stdout)
		}
		time.Sleep(waitInterval)
	}

	r := sledAt(t, a.url, "zone", "show", crucible.ID).ok(t)
	for _, want := range []string{"waiting since", "waiting for", why, "looked at again", "start held back"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("zone show of a waiting zone does not show %q:\n%s", want, r.stdout)
		}
	}
	for _, not := range []string{"failed", "last error", "next retry"} {
		if strings.Contains(r.stdout, not) {
			t.Errorf("zone show of a waiting zone shows %q:\n%s", not, r.stdout)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dataDir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"frobnicate"}, []string{"unknown command", "frobnicate"}},
		{[]string{"zones", "--bogus"}, []string{"unknown flag", "--bogus"}},
		{[]string{"zone", "show"}, []string{"accepts 1 arg"}},
		{[]string{"--url", "ftp://example", "zones"}, []string{"ftp://example", "http://host:port"}},
		{[]string{"run", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--role", "switch"}, []string{"role", "switch"}},
		{[]string{"run", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-level", "loud"}, []string{"--log-level", "loud"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			sled(t, tc.args...).failed(t, tc.want...)
		})
	}
}

func TestUnreachableAgent(t *testing.T) {
	// An address nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url := "http://" + addr

	path := writeFile(t, "sled-config.json", sledconfig.Example())
	for _, args := range [][]string{
		{"inventory"},
		{"inventory", "-o", "json"},
		{"zones"},
		{"zones", "--running"},
		{"zone", "show", "nope"},
		{"config", "put", path},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			// The reason names the address and says what to check.
			sledAt(t, url, args...).failed(t, addr, "is an agent running? (--url / SLED_AGENT_URL)")
		})
	}
}

func TestDevConverges(t *testing.T) {
	// dev keeps its data in a temporary directory it removes on exit.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	done := make(chan result, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		code := run([]string{"dev", "--listen", "127.0.0.1:0", "--exit-when-converged"}, &stdout, &stderr)
		done <- result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(devDeadline):
		t.Fatalf("dev --exit-when-converged still running after %s", devDeadline)
	}
	if r.code != 0 {
		t.Fatalf("dev exit %d; stderr:\n%s\nstdout:\n%s", r.code, r.stderr, r.stdout)
	}
	for _, want := range []string{"agent API on http://127.0.0.1:", "put sled config generation 351: 13 zones", "all 13 zones running", "Nexus knows sled ", "stopped"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dev output does not contain %q:\n%s", want, r.stdout)
		}
	}
	// The zones that need synchronized time wait for the NTP zone (it takes
	// at least 0.3 s to start): waiting, with why, never failed.
	waiting := 0
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || !strings.HasPrefix(f[1], "oxz_") {
			continue
		}
		switch f[2] {
		case "failed":
			t.Errorf("dev output shows a zone failed: %q", l)
		case "waiting":
			waiting++
			if !strings.Contains(l, "time not yet synchronized: ") && !strings.Contains(l, "storage not ready: ") {
				t.Errorf("dev output shows a zone waiting without why: %q", l)
			}
		}
	}
	if waiting == 0 {
		t.Errorf("dev output shows no zone waiting for the NTP zone:\n%s", r.stdout)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("dev left %d entries in its temporary directory, e.g. %s", len(left), left[0].Name())
	}
}

func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                      "plain",
		"two\nlines":                 "two lines",
		"  padded \t and\r\nspaced ": "padded and spaced",
		"":                           "",
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}
