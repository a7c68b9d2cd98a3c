package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/service"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

const (
	propolisID = "4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01"
	nicID      = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"
	testMAC    = "a8:40:25:f0:00:07"
)

var props = propolisapi.Properties{
	ID:          propolisID,
	Name:        "vm0",
	Description: "a simulated guest",
	Metadata: propolisapi.Metadata{
		ProjectID:    "0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c",
		SiloID:       "6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f",
		SledID:       "9e0a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b",
		SledSerial:   "BRM42220001",
		SledRevision: 6,
		SledModel:    "913-0000019",
	},
}

// testSpec is a spec as the agent sends one: a NIC whose backend is named
// after its MAC, and com1.
func testSpec(t *testing.T) json.RawMessage {
	t.Helper()
	mac, _ := net.ParseMAC(testMAC)
	comp := func(typ string, c map[string]any) map[string]any { return map[string]any{"type": typ, "component": c} }
	b, err := json.Marshal(map[string]any{
		"board": map[string]any{"cpus": 1, "memory_mb": 256, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": map[string]any{
			"net0":         comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": nicID, "pci_path": map[string]any{"bus": 0, "device": 8, "function": 0}}),
			"net0-backend": comp("virtio_network_backend", map[string]any{"vnic_name": spec.VNICName(mac)}),
			"com1":         comp("serial_port", map[string]any{"num": "com1"}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// env is the service with a simulated guest on loopback, and a client of
// it through a proxy that checks every exchange against upstream's
// document.
type env struct {
	addr   string // the service's own host:port
	proxy  *openapitest.Proxy
	client *propolisapi.Client
	stop   func() error // ends ctx and returns what Serve returned
}

func start(t *testing.T) *env {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	guest := simguest.New(simguest.Options{
		BootTime:   100 * time.Millisecond,
		StopTime:   50 * time.Millisecond,
		RebootTime: 100 * time.Millisecond,
		Sled:       spec.Sled{Threads: 2},
	})
	t.Cleanup(guest.Close)
	health, err := service.Health(propolisID)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- service.Serve(ctx, ln, guest, health, log) }()
	var served error
	stopped := false
	stop := func() error {
		if !stopped {
			cancel()
			served, stopped = <-errc, true
		}
		return served
	}
	t.Cleanup(func() { stop() })
	proxy := openapitest.Load(t, openapitest.Propolis).Proxy(t, "http://"+ln.Addr().String())
	return &env{
		addr:   ln.Addr().String(),
		proxy:  proxy,
		client: propolisapi.NewClient(strings.TrimPrefix(proxy.URL, "http://")),
		stop:   stop,
	}
}

// follow long-polls the state monitor from after gen until the guest is
// in state, and returns every status it saw on the way.
func (e *env) follow(t *testing.T, gen uint64, state propolisapi.InstanceState) []propolisapi.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var seen []propolisapi.Status
	for {
		st, err := e.client.StateMonitor(ctx, gen+1)
		if err != nil {
			t.Fatalf("StateMonitor(%d), waiting for %s: %v (seen %+v)", gen+1, state, err, seen)
		}
		if st.Gen <= gen {
			continue
		}
		seen = append(seen, st)
		if st.State == state {
			return seen
		}
		gen = st.Gen
	}
}

func states(ss []propolisapi.Status) []propolisapi.InstanceState {
	var out []propolisapi.InstanceState
	for _, s := range ss {
		out = append(out, s.State)
	}
	return out
}

// readUntil reads the console's output until it holds want, and returns
// it.
func readUntil(t *testing.T, c *propolisapi.SerialConn, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []byte
	for !bytes.Contains(got, []byte(want)) {
		p, err := c.ReadOutput(ctx)
		if err != nil {
			t.Fatalf("waiting for %q on the console: %v (got %q)", want, err, got)
		}
		got = append(got, p...)
	}
	return string(got)
}

// A VMM's whole life through the client, as the agent drives it: ensure,
// run, the state monitor, the serial console and its history, reboot,
// stop until Destroyed; every exchange as upstream's document has it.
func TestServiceLifecycle(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	c := e.client
	if _, err := c.Get(ctx); !errors.Is(err, propolisapi.ErrNoInstance) {
		t.Fatalf("Get before Ensure: %v", err)
	}
	raw := testSpec(t)
	for range 2 {
		if err := c.Ensure(ctx, props, raw); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
	}
	other := props
	other.Name = "vm1"
	if err := c.Ensure(ctx, other, raw); !errors.Is(err, propolisapi.ErrConflict) {
		t.Errorf("Ensure with other properties: %v", err)
	}
	st, err := c.StateMonitor(ctx, 0)
	if err != nil || st.Gen != 1 || st.State != propolisapi.StateCreating || st.Detail == "" {
		t.Fatalf("StateMonitor(0) = %+v, %v", st, err)
	}
	got, err := c.Spec(ctx)
	if err != nil || got.Properties != props || got.State != propolisapi.StateCreating {
		t.Errorf("Spec = %+v, %v", got, err)
	}
	if err := c.PutState(ctx, propolisapi.RequestReboot); !errors.Is(err, propolisapi.ErrInvalidTransition) {
		t.Errorf("Reboot before a run: %v", err)
	}

	console, err := c.SerialConnect(ctx, propolisapi.SerialFromStart(0))
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	if err := c.PutState(ctx, propolisapi.RequestRun); err != nil {
		t.Fatal(err)
	}
	seen := e.follow(t, 1, propolisapi.StateRunning)
	if want := []propolisapi.InstanceState{propolisapi.StateStarting, propolisapi.StateRunning}; !slices.Equal(states(seen), want) {
		t.Errorf("states to Running: %v, want %v", states(seen), want)
	}
	ready := simguest.ReadyPrefix + testMAC + "\r\n"
	readUntil(t, console, ready)
	history, end, err := c.SerialHistory(ctx, propolisapi.SerialFromStart(0), 0)
	if err != nil || !strings.HasSuffix(string(history), ready) || end != uint64(len(history)) {
		t.Errorf("serial history: %q, end %d, %v", history, end, err)
	}
	if err := console.WriteInput(ctx, []byte("ping\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, console, "ping\r\n")

	if err := c.PutState(ctx, propolisapi.RequestReboot); err != nil {
		t.Fatal(err)
	}
	gen := seen[len(seen)-1].Gen
	seen = e.follow(t, gen, propolisapi.StateRunning)
	if want := []propolisapi.InstanceState{propolisapi.StateRebooting, propolisapi.StateRunning}; !slices.Equal(states(seen), want) {
		t.Errorf("states of a reboot: %v, want %v", states(seen), want)
	}
	readUntil(t, console, ready)

	if err := c.NMI(ctx); err != nil {
		t.Errorf("NMI: %v", err)
	}
	if err := c.PutState(ctx, propolisapi.RequestStop); err != nil {
		t.Fatal(err)
	}
	gen = seen[len(seen)-1].Gen
	seen = e.follow(t, gen, propolisapi.StateDestroyed)
	if s := states(seen); s[0] != propolisapi.StateStopping || seen[len(seen)-1].Gen != gen+3 {
		// Stopped (gen+2) and Destroyed come at once: the monitor may
		// skip the first.
		t.Errorf("statuses of a stop: %+v", seen)
	}
	readUntil(t, console, "reboot: Power down\r\n")
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		if _, err := console.ReadOutput(rctx); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Errorf("the console of a destroyed guest ended with %v, want a normal close", err)
			}
			break
		}
	}
	if inst, err := c.Get(ctx); err != nil || inst.State != propolisapi.StateDestroyed {
		t.Errorf("Get after a stop: %+v, %v", inst, err)
	}
	if err := c.PutState(ctx, propolisapi.RequestRun); !errors.Is(err, propolisapi.ErrInvalidTransition) {
		t.Errorf("Run after a stop: %v", err)
	}
	if err := c.PutState(ctx, propolisapi.RequestStop); err != nil {
		t.Errorf("Stop after a stop: %v", err)
	}
	history, _, err = c.SerialHistory(ctx, propolisapi.SerialFromStart(0), 1<<20)
	if err != nil || strings.Count(string(history), ready) != 2 {
		t.Errorf("serial history after a stop: %q, %v", history, err)
	}

	e.proxy.WantSeen("GET /instance 424", "PUT /instance 201", "PUT /instance 409",
		"GET /instance/state-monitor 200", "GET /instance/spec 200", "PUT /instance/state 204",
		"PUT /instance/state 403", "GET /instance/serial 101", "GET /instance/serial/history 200",
		"POST /instance/nmi 200", "GET /instance 200")
	if err := e.stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// GET /health answers the zone service's health report, which the Linux
// runtime's readiness check reads, without an api-version header; it
// takes no other method.
func TestHealth(t *testing.T) {
	e := start(t)
	h, err := zoneservice.Get(t.Context(), e.addr)
	if err != nil {
		t.Fatal(err)
	}
	if h.Zone != "oxz_propolis-server_"+propolisID || h.ID != propolisID || h.Kind != service.ZoneKind || h.PID != os.Getpid() ||
		time.Since(h.StartedAt) > time.Minute {
		t.Errorf("health: %+v", h)
	}
	resp, err := http.Get("http://" + e.addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	want := []string{"id", "kind", "pid", "started_at", "status", "zone"}
	var keys []string
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !slices.Equal(keys, want) || body["status"] != "ok" {
		t.Errorf("GET /health: %d %s %v", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp, err = http.Post("http://"+e.addr+"/health", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /health: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// The API still wants its version header.
	resp, err = http.Get("http://" + e.addr + "/instance")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /instance without api-version: %d", resp.StatusCode)
	}
}

func TestHealthRefusesBadID(t *testing.T) {
	for _, id := range []string{"", "vmm-1", "4f1a7d4e6a534d0c9d575d6e4f1b2c01", "urn:uuid:" + propolisID} {
		if _, err := service.Health(id); err == nil || !strings.Contains(err.Error(), "not a UUID") {
			t.Errorf("Health(%q): %v", id, err)
		}
	}
}

// When its context ends, the service answers a state monitor in flight
// and closes serial consoles at once, stops listening, and returns nil
// well within its shutdown bound.
func TestShutdown(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	if err := e.client.Ensure(ctx, props, testSpec(t)); err != nil {
		t.Fatal(err)
	}
	console, err := e.client.SerialConnect(ctx, propolisapi.SerialOffset{})
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	monitored := make(chan error, 1)
	go func() {
		_, err := e.client.StateMonitor(ctx, 5)
		monitored <- err
	}()
	time.Sleep(100 * time.Millisecond) // the monitor waits
	start := time.Now()
	if err := e.stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("shutdown took %s", took)
	}
	select {
	case err := <-monitored:
		if err != nil {
			t.Errorf("the state monitor in flight: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the state monitor in flight did not answer")
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := console.ReadOutput(rctx); err == nil || rctx.Err() != nil {
		t.Errorf("the console after shutdown: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", e.addr, time.Second); err == nil {
		conn.Close()
		t.Error("the service still listens")
	}
}
