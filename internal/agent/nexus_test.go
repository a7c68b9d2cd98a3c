package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// startNexus starts a simulated Nexus on loopback.
func startNexus(t *testing.T) *nexussim.Server {
	t.Helper()
	n := nexussim.New(nexussim.Config{})
	if err := n.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// nexusBetween puts a proxy validating every exchange against upstream's
// nexus-internal document between the agent and n, and returns its
// address for --nexus.
func nexusBetween(t *testing.T, n *nexussim.Server) (string, *openapitest.Proxy) {
	t.Helper()
	p := openapitest.Load(t, openapitest.Nexus).Proxy(t, n.URL())
	return strings.TrimPrefix(p.URL, "http://"), p
}

// agentInventory reads the agent's own view.
func agentInventory(t *testing.T, a *agent.Agent) api.AgentInventory {
	t.Helper()
	code, b := callWithin(t, a, http.MethodGet, "/agent/inventory", "")
	var inv api.AgentInventory
	if code != http.StatusOK || json.Unmarshal(b, &inv) != nil {
		t.Fatalf("GET /agent/inventory: %d %s", code, b)
	}
	return inv
}

// callWithin is call with a hang detector: every answer of the agent's API
// comes at once whatever Nexus does.
func callWithin(t *testing.T, a *agent.Agent, method, path, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return callCtx(t, ctx, a, method, path, body)
}

// The sled, finding Nexus through internal DNS as upstream's does,
// registers itself with every field true to the host.
func TestSledRegistersWithNexusFoundInDNS(t *testing.T) {
	n := startNexus(t)
	server := dns.NewServer(nil)
	if err := server.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	if err := server.SetRecords(dns.ServiceRecords("nexus", netip.MustParseAddrPort(n.Addr()))); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), DNSServers: []string{server.Addr().String()}})
	var held nexussim.SledAgentInfo
	waitFor(t, "Nexus to know the sled", func() (bool, string) {
		var ok bool
		held, ok = n.Sled(a.SledID())
		return ok, "no record"
	})
	t.Logf("Nexus knew the sled %s after the agent was started", time.Since(started).Round(time.Millisecond))
	id := a.Identity()
	hw := id.Hardware
	code, b := callWithin(t, a, http.MethodGet, "/inventory", "")
	var inv struct {
		ReservoirSize uint64 `json:"reservoir_size"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &inv) != nil || inv.ReservoirSize == 0 {
		t.Fatalf("GET /inventory: %d %.300s", code, b)
	}
	want := nexussim.SledAgentInfo{
		SAAddress:             netip.MustParseAddrPort(id.Address),
		Role:                  nexussim.SledRole(id.Role),
		Baseboard:             nexussim.Baseboard{Part: hw.Baseboard.Part, Revision: hw.Baseboard.Revision, Serial: hw.Baseboard.Serial},
		UsableHardwareThreads: hw.HardwareThreads,
		UsablePhysicalRAM:     nexussim.ByteCount(hw.PhysicalRAM),
		ReservoirSize:         nexussim.ByteCount(inv.ReservoirSize),
		CPUFamily:             nexussim.SledCpuFamily(hw.CPUFamily),
		Generation:            1,
	}
	if held != want {
		t.Fatalf("Nexus holds\n%+v\nwant\n%+v", held, want)
	}
	waitFor(t, "our view to say so", func() (bool, string) {
		st := agentInventory(t, a).Nexus
		return st != nil && st.FoundBy == "dns" && st.Registration.State == "registered" && st.Registration.Known != nil && st.Registration.Known.Generation == 1, "not yet"
	})
}

// A Nexus that is down at start is registered with once it is up, within
// a retry; meanwhile our view says why it is not.
func TestNexusDownAtStartIsRegisteredWithOnceUp(t *testing.T) {
	n := startNexus(t)
	if err := n.SetFault(nexussim.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), Nexus: []string{n.Addr()}})
	waitFor(t, "the failure shown", func() (bool, string) {
		st := agentInventory(t, a).Nexus
		return st != nil && st.Registration.State == "retrying" && st.Registration.LastError != "", "not yet"
	})
	if _, ok := n.Sled(a.SledID()); ok {
		t.Fatal("registered with a Nexus that refuses connections")
	}
	if err := n.SetFault(nexussim.FaultNone); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	waitFor(t, "Nexus to know the sled", func() (bool, string) {
		_, ok := n.Sled(a.SledID())
		return ok, "no record"
	})
	t.Logf("registered %s after Nexus came up", time.Since(up).Round(time.Millisecond))
}

// Every VMM state change reaches Nexus in order, newest last, and every
// request the agent sends is upstream's.
func TestVMMStatesReachNexusInOrder(t *testing.T) {
	n := startNexus(t)
	addr, proxy := nexusBetween(t, n)
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), Nexus: []string{addr}})
	callWithin(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:5]:12400"))
	for _, step := range []struct{ request, then string }{{"running", "running"}, {"reboot", "running"}, {"stopped", "destroyed"}} {
		if code, b := callWithin(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"`+step.request+`"}}`); code != http.StatusOK {
			t.Fatalf("PUT state %s: %d %s", step.request, code, b)
		}
		waitVMM(t, a, step.then)
	}
	final := vmmState(t, a)
	waitFor(t, "Nexus to hold the final state", func() (bool, string) {
		got, ok := n.LatestVMM(testVMM)
		return ok && uint64(got.VmmState.Gen) == final.VmmState.Gen, "latest " + string(got.VmmState.State)
	})
	received := n.VMMStates(testVMM)
	seen := map[nexussim.VmmState]bool{}
	for i, st := range received {
		seen[st.VmmState.State] = true
		if i > 0 && st.VmmState.Gen <= received[i-1].VmmState.Gen {
			t.Fatalf("update %d (gen %d) is not newer than the one before (gen %d): %+v", i, st.VmmState.Gen, received[i-1].VmmState.Gen, received)
		}
	}
	// What Nexus was told is the agent's history of states, in order:
	// all of it when no state came while one was being sent (they are
	// coalesced into the newest).
	code, b := callWithin(t, a, http.MethodGet, "/agent/vmms", "")
	var page api.VMMPage
	if code != http.StatusOK || json.Unmarshal(b, &page) != nil || len(page.Items) != 1 {
		t.Fatalf("GET /agent/vmms: %d %s", code, b)
	}
	vmms := page.Items
	var history []vmm.RuntimeState
	for _, l := range vmms[0].History {
		if l.State != nil {
			history = append(history, *l.State)
		}
	}
	next := 0
	for _, st := range received {
		for next < len(history) && uint64(st.VmmState.Gen) != history[next].Gen {
			next++
		}
		if next == len(history) || string(st.VmmState.State) != history[next].State || !st.VmmState.TimeUpdated.Equal(history[next].TimeUpdated) {
			t.Fatalf("Nexus was told %+v, which is not in the agent's history after what it was told before:\nhistory %+v\nNexus %+v", st.VmmState, history, received)
		}
	}
	t.Logf("Nexus was told %d of the agent's %d states", len(received), len(history))
	last := received[len(received)-1].VmmState
	if last.State != "destroyed" || !last.TimeUpdated.Equal(final.VmmState.TimeUpdated) {
		t.Fatalf("Nexus's last update %+v; the agent says %+v", last, final.VmmState)
	}
	for _, s := range []nexussim.VmmState{"running", "destroyed"} {
		if !seen[s] {
			t.Errorf("Nexus never told %s: %+v", s, received)
		}
	}
	proxy.WantSeen("GET /sled-agents/{sled_id} 404", "POST /sled-agents/{sled_id} 204", "PUT /vmms/{propolis_id} 204")
}

// A Nexus that hangs holds nothing back: the API answers, VMMs go through
// their lifecycle and zones start as if it were not there; once it
// recovers, it gets the newest state.
func TestAHangingNexusHoldsNothingBack(t *testing.T) {
	n := startNexus(t)
	if err := n.SetFault(nexussim.FaultHang); err != nil {
		t.Fatal(err)
	}
	a, c := start(t, agent.Config{DataDir: t.TempDir(), Nexus: []string{n.Addr()}, UnderlayIP: exampleSled})
	if err := c.PutConfig(t.Context(), withGeneration(t, agent.Example(), 2)); err != nil {
		t.Fatal(err)
	}
	callWithin(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:103::1:5]:12400"))
	callWithin(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	waitVMM(t, a, "running")
	callWithin(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"stopped"}}`)
	waitVMM(t, a, "destroyed")
	waitStates(t, c, allRunning(example(t)))
	if st := agentInventory(t, a).Nexus; st == nil || st.Registration.Outstanding == "" || len(st.VMMStates) != 1 || !st.VMMStates[0].Sending {
		t.Fatalf("our view with Nexus hanging: %+v", st)
	}
	final := vmmState(t, a)
	if err := n.SetFault(nexussim.FaultNone); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor(t, "Nexus to hold the final state", func() (bool, string) {
		got, ok := n.LatestVMM(testVMM)
		return ok && uint64(got.VmmState.Gen) == final.VmmState.Gen, "latest " + string(got.VmmState.State)
	})
	t.Logf("the final state reached Nexus %s after it recovered", time.Since(back).Round(time.Millisecond))
	waitFor(t, "Nexus to know the sled", func() (bool, string) {
		_, ok := n.Sled(a.SledID())
		return ok, "no record"
	})
}

// After an agent restart the adopted VMMs' states are sent; a sled Nexus
// decommissioned sends nothing more, and our view says so.
func TestRestartSendsAdoptedStatesAndDecommissionMeansSilence(t *testing.T) {
	n := startNexus(t)
	dir := t.TempDir()
	cfg := agent.Config{DataDir: dir, Nexus: []string{n.Addr()}}
	first := newAgent(t, cfg)
	stop := run(t, first)
	callWithin(t, first, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:5]:12400"))
	callWithin(t, first, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	before := waitVMM(t, first, "running")
	waitFor(t, "Nexus to know the sled", func() (bool, string) {
		_, ok := n.Sled(first.SledID())
		return ok, "no record"
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := n.Decommission(first.SledID()); err != nil {
		t.Fatal(err)
	}
	posts := n.Requests()["POST /sled-agents/{sled_id}"]

	second := newAgent(t, cfg)
	run(t, second)
	waitFor(t, "the adopted VMM's state at Nexus", func() (bool, string) {
		got, ok := n.LatestVMM(testVMM)
		return ok && uint64(got.VmmState.Gen) > before.VmmState.Gen && got.VmmState.State == "running", "latest " + string(got.VmmState.State)
	})
	waitFor(t, "our view to say the sled is decommissioned", func() (bool, string) {
		st := agentInventory(t, second).Nexus
		return st != nil && st.Registration.State == "decommissioned", "not yet"
	})
	if got := n.Requests()["POST /sled-agents/{sled_id}"]; got != posts {
		t.Fatalf("%d registrations sent to a Nexus that decommissioned the sled", got-posts)
	}
}

// A changed field (here the address: the agent restarted on another port)
// is sent again, with the generation past the one Nexus holds.
func TestAChangedAddressIsSentPastNexussGeneration(t *testing.T) {
	n := startNexus(t)
	dir := t.TempDir()
	first := newAgent(t, agent.Config{DataDir: dir, Nexus: []string{n.Addr()}})
	stop := run(t, first)
	waitFor(t, "Nexus to know the sled", func() (bool, string) {
		_, ok := n.Sled(first.SledID())
		return ok, "no record"
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Meanwhile Nexus took a newer record of the sled (another agent's,
	// say): the next one must go past it.
	rec, _ := n.Sled(first.SledID())
	rec.Generation = 5
	if err := n.SetSled(first.SledID(), rec); err != nil {
		t.Fatal(err)
	}
	second := newAgent(t, agent.Config{DataDir: dir, Nexus: []string{n.Addr()}})
	run(t, second)
	if second.Identity().Address == first.Identity().Address {
		t.Fatalf("the second agent listens at the first one's address %s", first.Identity().Address)
	}
	waitFor(t, "Nexus to hold the new address", func() (bool, string) {
		got, _ := n.Sled(second.SledID())
		return got.SAAddress.String() == second.Identity().Address && got.Generation == 6, fmt.Sprintf("%s at generation %d", got.SAAddress, got.Generation)
	})
}

// Fifty VMMs changing at once: every one's newest state reaches Nexus.
func TestFiftyVMMsStatesAllReachNexus(t *testing.T) {
	n := startNexus(t)
	a, _ := start(t, agent.Config{DataDir: t.TempDir(), Nexus: []string{n.Addr()}})
	small := vmmtest.Spec()
	small["board"].(map[string]any)["memory_mb"] = 16 // fifty fit any sled's reservoir
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("6a2a4a2e-57c3-4e3c-8c3b-%012x", i+1)
		body := string(vmmtest.Body(testInstance, fmt.Sprintf("[fd00:1122:3344:101::2:%x]:12400", i+1), small, nil))
		if code, b := callWithin(t, a, http.MethodPut, "/vmms/"+ids[i], body); code != http.StatusOK {
			t.Fatalf("PUT /vmms/%s: %d %s", ids[i], code, b)
		}
	}
	for _, id := range ids {
		if code, b := callWithin(t, a, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
			t.Fatalf("PUT /vmms/%s/state: %d %s", id, code, b)
		}
	}
	waitFor(t, "every VMM running, as Nexus holds it", func() (bool, string) {
		for _, id := range ids {
			code, b := callWithin(t, a, http.MethodGet, "/vmms/"+id+"/state", "")
			var st api.SledVmmState
			if code != http.StatusOK || json.Unmarshal(b, &st) != nil {
				return false, fmt.Sprintf("GET %s: %d %s", id, code, b)
			}
			got, _ := n.LatestVMM(id)
			if st.VmmState.State != "running" || uint64(got.VmmState.Gen) != st.VmmState.Gen {
				return false, fmt.Sprintf("VMM %s is %s (gen %d); Nexus holds %s (gen %d)", id, st.VmmState.State, st.VmmState.Gen, got.VmmState.State, got.VmmState.Gen)
			}
		}
		return true, ""
	})
}
