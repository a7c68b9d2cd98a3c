package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Deadlines of the hang detectors. They bound how long a broken agent can
// stall a test; nothing here asserts how fast anything is.
const (
	waitDeadline = 20 * time.Second
	waitInterval = 20 * time.Millisecond
	stopDeadline = 20 * time.Second
)

// exampleSled is the underlay address of the example config's sled: its
// zones are in that /64 (sledconfig's subnet rule), so an agent that runs
// the example is given it.
const exampleSled = "fd00:1122:3344:103::1"

// example is the built-in real sled config, parsed.
func example(t *testing.T) *sledconfig.Config {
	t.Helper()
	cfg, err := sledconfig.Parse(sledconfig.Example())
	if err != nil {
		t.Fatalf("parsing the example config: %v", err)
	}
	return cfg
}

// zoneNames returns the sorted names of cfg's zones.
func zoneNames(cfg *sledconfig.Config) []string {
	var names []string
	for _, z := range cfg.Zones {
		names = append(names, z.Name())
	}
	slices.Sort(names)
	return names
}

// withGeneration returns doc with its generation replaced.
func withGeneration(t *testing.T, doc []byte, gen uint64) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	m["generation"] = json.RawMessage(strconv.FormatUint(gen, 10))
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newAgent builds an agent listening on an ephemeral loopback port.
//
// Its zones do not wait for synchronized time (SkipTimesync), as the
// configs of tests about other things have no NTP zone; newTimedAgent's do.
func newAgent(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	cfg.SkipTimesync = true
	return newTimedAgent(t, cfg)
}

// newTimedAgent is newAgent with time sync gating as cfg says. Its NTP
// zones, if any, never set the host's clock (NTPNoClock).
func newTimedAgent(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	cfg.NTPNoClock = true
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	a, err := agent.New(cfg, testLogger(t))
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	return a
}

// run runs a until the returned stop is called or the test ends, whichever
// comes first. stop cancels Run, waits for it to return and reports its
// error; it may be called more than once.
func run(t *testing.T, a *agent.Agent) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(stopDeadline):
			return fmt.Errorf("Run did not return within %s of its context being cancelled", stopDeadline)
		}
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stop
}

func newClient(t *testing.T, a *agent.Agent) *client.Client {
	t.Helper()
	c, err := client.New("http://" + a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// A hang detector: no call to a healthy agent comes near it.
	c.Timeout = 5 * time.Second
	return c
}

// start builds and runs an agent and returns it with a client.
func start(t *testing.T, cfg agent.Config) (*agent.Agent, *client.Client) {
	t.Helper()
	a := newAgent(t, cfg)
	run(t, a)
	return a, newClient(t, a)
}

// waitFor polls cond until it reports done, failing the test if that takes
// longer than waitDeadline. cond's description of the state is quoted on
// failure.
func waitFor(t *testing.T, what string, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %s; last seen: %s", what, waitDeadline, state)
		}
		time.Sleep(waitInterval)
	}
}

// zoneStates returns every zone's state by name, as the API reports it.
func zoneStates(ctx context.Context, c *client.Client) (map[string]string, error) {
	zones, err := c.ZoneStates(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(zones))
	for _, z := range zones {
		out[z.Name] = z.State
	}
	return out, nil
}

// waitStates waits until the API reports exactly want (zone name → state).
func waitStates(t *testing.T, c *client.Client, want map[string]string) {
	t.Helper()
	waitFor(t, "zone states", func() (bool, string) {
		got, err := zoneStates(t.Context(), c)
		if err != nil {
			return false, err.Error()
		}
		diff := cmp.Diff(want, got)
		return diff == "", "(-want +got)\n" + diff
	})
}

// allRunning is want for waitStates: every zone of cfg running.
func allRunning(cfg *sledconfig.Config) map[string]string {
	want := map[string]string{}
	for _, name := range zoneNames(cfg) {
		want[name] = "running"
	}
	return want
}

func TestPutExampleConfigAllZonesRun(t *testing.T) {
	cfg := example(t)
	_, c := start(t, agent.Config{DataDir: t.TempDir(), UnderlayIP: exampleSled})

	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatalf("PUT /omicron-config: %v", err)
	}
	waitStates(t, c, allRunning(cfg))

	names, err := c.Zones(t.Context())
	if err != nil {
		t.Fatalf("GET /zones: %v", err)
	}
	if len(names) != 13 {
		t.Errorf("GET /zones listed %d zones, want 13", len(names))
	}
	if !slices.IsSorted(names) {
		t.Errorf("GET /zones is not sorted: %q", names)
	}
	if diff := cmp.Diff(zoneNames(cfg), names); diff != "" {
		t.Errorf("GET /zones (-want +got):\n%s", diff)
	}

	// Putting the same config again is a no-op success.
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Errorf("putting the same config again: %v", err)
	}
}

func TestRestartKeepsSledIDAndLedgeredConfig(t *testing.T) {
	cfg := example(t)
	dir := t.TempDir()

	first := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	stop := run(t, first)
	c := newClient(t, first)
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatalf("PUT /omicron-config: %v", err)
	}
	waitStates(t, c, allRunning(cfg))
	if err := stop(); err != nil {
		t.Fatalf("stopping the first agent: %v", err)
	}

	kept, err := os.ReadFile(filepath.Join(dir, "sled-id"))
	if err != nil {
		t.Fatalf("sled id not kept: %v", err)
	}
	if got := strings.TrimSpace(string(kept)); got != first.SledID() {
		t.Errorf("kept sled id %q, agent reported %q", got, first.SledID())
	}

	second := newAgent(t, agent.Config{DataDir: dir, UnderlayIP: exampleSled})
	if second.SledID() != first.SledID() {
		t.Errorf("sled id after restart = %s, want %s", second.SledID(), first.SledID())
	}
	// The ledgered config is loaded by New, before anything is put.
	if cur := second.Store().Current(); cur == nil || cur.Generation != 351 {
		t.Fatalf("config loaded at start = %v, want generation 351", cur)
	}
	run(t, second)
	c = newClient(t, second)
	inv, err := c.Inventory(t.Context())
	if err != nil {
		t.Fatalf("GET /inventory: %v", err)
	}
	if inv.SledID != first.SledID() {
		t.Errorf("inventory sled_id = %s, want %s", inv.SledID, first.SledID())
	}
	if inv.LedgeredSledConfig == nil || inv.LedgeredSledConfig.Generation != 351 {
		t.Errorf("inventory ledgered_sled_config = %v, want generation 351", inv.LedgeredSledConfig)
	}
	ours, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatalf("GET /agent/inventory: %v", err)
	}
	if ours.Ledger.Problem != "" {
		t.Errorf("inventory ledger problem = %q, want none", ours.Ledger.Problem)
	}
	for _, cp := range ours.Ledger.Copies {
		if cp.State != "ok" || cp.Generation != 351 {
			t.Errorf("ledger copy %s: %s generation %d, want ok generation 351", cp.Path, cp.State, cp.Generation)
		}
	}
	// The new agent realises the ledgered config on its own.
	waitStates(t, c, allRunning(cfg))
}

func TestConfiguredSledIDIsKept(t *testing.T) {
	dir := t.TempDir()
	const given = "9f8e7d6c-aaaa-4bbb-8ccc-ddddeeeeffff"
	a, c := start(t, agent.Config{DataDir: dir, SledID: strings.ToUpper(given)})
	if a.SledID() != given {
		t.Errorf("SledID() = %s, want %s", a.SledID(), given)
	}
	inv, err := c.Inventory(t.Context())
	if err != nil {
		t.Fatalf("GET /inventory: %v", err)
	}
	if inv.SledID != given {
		t.Errorf("inventory sled_id = %s, want %s", inv.SledID, given)
	}
	kept, err := os.ReadFile(filepath.Join(dir, "sled-id"))
	if err != nil || strings.TrimSpace(string(kept)) != given {
		t.Fatalf("kept sled id %q (%v), want %s", kept, err, given)
	}
}

func ptr[T any](v T) *T { return &v }

func TestNewRefusesBadIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  agent.Config
		// keptID, if non-nil, is written to DataDir/sled-id first.
		keptID *string
		want   []string
	}{
		{name: "sled-id not a uuid", cfg: agent.Config{SledID: "sled-7"}, want: []string{"sled-id", "sled-7"}},
		{name: "sled-id without dashes", cfg: agent.Config{SledID: "9f8e7d6caaaa4bbb8cccddddeeeeffff"}, want: []string{"sled-id"}},
		{name: "role", cfg: agent.Config{Role: "switch"}, want: []string{"role", "switch"}},
		{name: "underlay-ip not an address", cfg: agent.Config{UnderlayIP: "sled7"}, want: []string{"underlay-ip", "sled7"}},
		{name: "underlay-ip ipv4", cfg: agent.Config{UnderlayIP: "10.1.2.3"}, want: []string{"underlay-ip"}},
		{name: "underlay-ip ipv4-mapped", cfg: agent.Config{UnderlayIP: "::ffff:10.1.2.3"}, want: []string{"underlay-ip"}},
		{name: "rack-id not a uuid", cfg: agent.Config{RackID: "rack-1"}, want: []string{"rack-id", "rack-1"}},
		{name: "baseboard-part padded", cfg: agent.Config{BaseboardPart: " 913-0000019"}, want: []string{"baseboard-part"}},
		{name: "vmm-qemu-ids holding root", cfg: agent.Config{VMMQEMUIDs: "0:100"}, want: []string{"vmm-qemu-ids", "0:100", "root"}},
		{name: "vmm-qemu-ids not a range", cfg: agent.Config{VMMQEMUIDs: "qemu"}, want: []string{"vmm-qemu-ids", "FIRST:COUNT"}},
		{name: "kept sled-id corrupt", keptID: ptr("\x00\x17garbage\n"), want: []string{"sled-id", "fix or remove it"}},
		{name: "kept sled-id empty", keptID: ptr(""), want: []string{"sled-id", "fix or remove it"}},
		{name: "kept sled-id not canonical", keptID: ptr("{9f8e7d6c-aaaa-4bbb-8ccc-ddddeeeeffff}"), want: []string{"sled-id", "fix or remove it"}},
		{name: "sled-id differs from the kept one", cfg: agent.Config{SledID: "9f8e7d6c-aaaa-4bbb-8ccc-ddddeeeeffff"},
			keptID: ptr("0b2c3d4e-1111-4222-8333-444455556666\n"), want: []string{"9f8e7d6c-aaaa-4bbb-8ccc-ddddeeeeffff", "0b2c3d4e-1111-4222-8333-444455556666", "identity does not change"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			tc.cfg.Listen = "127.0.0.1:0"
			if tc.keptID != nil {
				if err := os.WriteFile(filepath.Join(tc.cfg.DataDir, "sled-id"), []byte(*tc.keptID), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			a, err := agent.New(tc.cfg, testLogger(t))
			if err == nil {
				run(t, a) // release its listener
				t.Fatalf("New accepted %+v", tc.cfg)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %q does not mention %q", err, w)
				}
			}
		})
	}
}

// relists returns how many successful runtime listings the agent's
// reconciler has made, from its metrics.
func relists(ctx context.Context, a *agent.Agent) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.Addr()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), `sled_agent_relists_total{result="ok"} `)
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		return int(n), err
	}
	return 0, nil
}

func TestCorruptLedgerLeavesZonesAlone(t *testing.T) {
	cfg := example(t)
	dir := t.TempDir()
	for _, d := range []string{"ledger-a", "ledger-b"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, d, agent.LedgerFile), []byte("\x00garbage, not a ledger"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	a := newAgent(t, agent.Config{DataDir: dir, RelistPeriod: 50 * time.Millisecond, UnderlayIP: exampleSled})
	if cur := a.Store().Current(); cur != nil {
		t.Fatalf("a corrupt ledger loaded generation %d", cur.Generation)
	}
	// A zone of the (lost) config is running from before the restart.
	survivor := cfg.Zones[slices.Sorted(maps.Keys(cfg.Zones))[0]]
	if err := a.Sim().Ensure(t.Context(), zone.SpecFor(&survivor)); err != nil {
		t.Fatalf("injecting a running zone: %v", err)
	}
	run(t, a)
	c := newClient(t, a)

	// Once the reconciler has seen the zone and relisted a few more times,
	// it must still be there, left alone.
	waitStates(t, c, map[string]string{survivor.Name(): "unmanaged"})
	first, err := relists(t.Context(), a)
	if err != nil {
		t.Fatalf("reading metrics: %v", err)
	}
	waitFor(t, "three more relists", func() (bool, string) {
		n, err := relists(t.Context(), a)
		if err != nil {
			return false, err.Error()
		}
		return n >= first+3, fmt.Sprintf("%d relists, want %d", n, first+3)
	})
	listed, err := a.Sim().List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []zone.Observed{{Name: survivor.Name(), ID: survivor.ID, Hash: survivor.Hash(), Running: true}}; !cmp.Equal(want, listed) {
		t.Errorf("sim zones after relists (-want +got):\n%s", cmp.Diff(want, listed))
	}

	raw, err := c.InventoryRaw(t.Context())
	if err != nil {
		t.Fatalf("GET /inventory: %v", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatalf("inventory is not a JSON object: %v", err)
	}
	if got := string(fields["ledgered_sled_config"]); got != "null" {
		t.Errorf("inventory ledgered_sled_config = %s, want null", got)
	}
	var inv api.Inventory
	if err := json.Unmarshal(raw, &inv); err != nil {
		t.Fatal(err)
	}
	ours, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatalf("GET /agent/inventory: %v", err)
	}
	if ours.Ledger.Problem == "" {
		t.Errorf("inventory ledger.problem is empty for a corrupt ledger")
	}
	if inv.ReconcilerStatus.Status != "not_yet_run" {
		t.Errorf("reconciler status = %q, want not_yet_run", inv.ReconcilerStatus.Status)
	}
	if inv.LastReconciliation != nil {
		t.Errorf("last_reconciliation = %+v, want null", inv.LastReconciliation)
	}
	for _, cp := range ours.Ledger.Copies {
		if cp.State != "corrupt" {
			t.Errorf("ledger copy %s state %q, want corrupt", cp.Path, cp.State)
		}
	}

	// A fresh config is taken as usual: the survivor is adopted, the rest
	// start, and the ledger is whole again.
	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatalf("PUT /omicron-config after a corrupt ledger: %v", err)
	}
	waitStates(t, c, allRunning(cfg))
	inv2, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatalf("GET /agent/inventory: %v", err)
	}
	if inv2.Ledger.Problem != "" {
		t.Errorf("ledger problem after a successful PUT = %q, want none", inv2.Ledger.Problem)
	}
	if inv2.LedgeredConfig == nil || inv2.LedgeredConfig.Generation != 351 {
		t.Errorf("ledgered config after PUT = %v, want generation 351", inv2.LedgeredConfig)
	}
	for _, cp := range inv2.Ledger.Copies {
		if cp.State != "ok" || cp.Generation != 351 {
			t.Errorf("ledger copy %s after PUT: %s generation %d, want ok generation 351", cp.Path, cp.State, cp.Generation)
		}
	}
	sz, err := c.Zone(t.Context(), survivor.ID)
	if err != nil {
		t.Fatalf("GET /agent/zones/%s: %v", survivor.ID, err)
	}
	if sz.Attempts != 0 || sz.Incidents != 0 {
		t.Errorf("survivor was restarted: %d attempts, %d incidents; history %+v", sz.Attempts, sz.Incidents, sz.History)
	}
	for _, e := range sz.History {
		if e.Event == "start" || e.Event == "stop" {
			t.Errorf("survivor history has %q at %s; it should have been adopted as it was", e.Event, e.At)
		}
	}
}

func TestHangingZoneStartDoesNotBlockOthers(t *testing.T) {
	cfg := example(t)
	names := zoneNames(cfg)
	var stuck sledconfig.Zone
	for _, z := range cfg.Zones {
		if z.Name() == names[0] {
			stuck = z
		}
	}
	faults := filepath.Join(t.TempDir(), "faults.json")
	doc := fmt.Sprintf(`{"zones": {%q: {"start": "hang"}}}`, stuck.ID)
	if err := os.WriteFile(faults, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	_, c := start(t, agent.Config{DataDir: t.TempDir(), SimFaults: faults, UnderlayIP: exampleSled})

	if err := c.PutConfig(t.Context(), sledconfig.Example()); err != nil {
		t.Fatalf("PUT /omicron-config: %v", err)
	}
	want := allRunning(cfg)
	want[stuck.Name()] = "starting"
	waitStates(t, c, want)

	// The agent still answers, within the client's deadline, while the
	// start hangs: a newer generation is ledgered and reported.
	if err := c.PutConfig(t.Context(), withGeneration(t, sledconfig.Example(), 352)); err != nil {
		t.Fatalf("PUT of generation 352 beside a hanging start: %v", err)
	}
	inv, err := c.Inventory(t.Context())
	if err != nil {
		t.Fatalf("GET /inventory beside a hanging start: %v", err)
	}
	if inv.LedgeredSledConfig == nil || inv.LedgeredSledConfig.Generation != 352 {
		t.Errorf("ledgered config = %v, want generation 352", inv.LedgeredSledConfig)
	}
	if inv.ReconcilerStatus.Status != "running" {
		t.Errorf("reconciler status = %q, want running (a start is in flight)", inv.ReconcilerStatus.Status)
	}
	ours, err := c.AgentInventory(t.Context())
	if err != nil {
		t.Fatalf("GET /agent/inventory beside a hanging start: %v", err)
	}
	got := map[string]string{}
	for _, z := range ours.ZoneStates {
		got[z.Name] = z.State
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("inventory zone states (-want +got):\n%s", diff)
	}
	running, err := c.Zones(t.Context())
	if err != nil {
		t.Fatalf("GET /zones: %v", err)
	}
	if diff := cmp.Diff(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == stuck.Name() }), running); diff != "" {
		t.Errorf("GET /zones (-want +got):\n%s", diff)
	}
}

// The outside check of a fresh last reconciliation: with one zone's start
// hanging, a PUT that also adds a zone is reflected in
// last_reconciliation within 5 s: the new generation, every other zone ok,
// the hung one err saying what it is doing.
func TestLastReconciliationIsFreshBesideAHungStart(t *testing.T) {
	zones := sledconfigtest.Crucibles(3)
	faults := filepath.Join(t.TempDir(), "faults.json")
	if err := os.WriteFile(faults, fmt.Appendf(nil, `{"zones": {%q: {"start": "hang"}}}`, zones[0].ID), 0o600); err != nil {
		t.Fatal(err)
	}
	_, c := start(t, agent.Config{DataDir: t.TempDir(), SimFaults: faults})
	putZones(t, c, 1, zones[:2]...)
	waitStates(t, c, map[string]string{zones[0].Name(): "starting", zones[1].Name(): "running"})
	putZones(t, c, 2, zones...)
	t0 := time.Now()
	var last string
	for time.Since(t0) < 5*time.Second {
		inv, err := c.Inventory(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		lr := inv.LastReconciliation
		if lr != nil && lr.LastReconciledConfig.Generation == 2 && lr.Zones[zones[1].ID].Result == "ok" && lr.Zones[zones[2].ID].Result == "ok" {
			hung := lr.Zones[zones[0].ID]
			if hung.Result != "err" || !strings.HasPrefix(hung.Message, "starting for ") || !strings.Contains(hung.Message, "(deadline 2m0s)") {
				t.Fatalf("hung zone's result %+v", hung)
			}
			if inv.ReconcilerStatus.Status != "running" {
				t.Errorf("reconciler status %q while a start hangs", inv.ReconcilerStatus.Status)
			}
			t.Logf("generation 2 reconciled %s after its PUT; hung zone: %s", time.Since(t0).Round(time.Millisecond), hung.Message)
			return
		}
		last = fmt.Sprintf("%+v", lr)
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("last reconciliation 5 s after the PUT: %s", last)
}
