package nexus_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/nexus"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
)

const (
	sledID = "3fd34366-7974-45bd-8aa8-503d2ca9e709"
	vmmID  = "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01"
)

func startNexus(t *testing.T) *nexussim.Server {
	t.Helper()
	n := nexussim.New(nexussim.Config{})
	if err := n.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return a
}

func info() nexus.SledAgentInfo {
	return nexus.SledAgentInfo{
		SAAddress: "[fd00:1122:3344:101::1]:12345", Role: "gimlet",
		Baseboard: nexus.Baseboard{Serial: "vm", Part: "i86pc"}, CPUFamily: "unknown",
		UsableHardwareThreads: 2, UsablePhysicalRAM: 24 << 30, ReservoirSize: 14 << 30, Generation: 1,
	}
}

// Every address found is tried in turn; the one that answered is tried
// first next time; every request and answer is upstream's.
func TestClientTriesEveryAddressAndSpeaksUpstreamsAPI(t *testing.T) {
	n := startNexus(t)
	proxy := openapitest.Load(t, openapitest.Nexus).Proxy(t, n.URL())
	live := netip.MustParseAddrPort(strings.TrimPrefix(proxy.URL, "http://"))
	c := nexus.NewClient(nexus.Static{deadAddr(t), live}, time.Second)
	ctx := context.Background()
	if _, err := c.GetSled(ctx, sledID); !errors.Is(err, nexus.ErrNotFound) || nexus.Permanent(err) != true {
		t.Fatalf("GET of a sled Nexus has no record of: %v", err)
	}
	if c.Last() != live {
		t.Fatalf("last answered %v, want %v", c.Last(), live)
	}
	if err := c.PutSled(ctx, sledID, info()); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSled(ctx, sledID)
	if err != nil || got != info() {
		t.Fatalf("GET after POST: %+v, %v", got, err)
	}
	// Not newer: upstream refuses it with a bare 500, which is transient.
	if err := c.PutSled(ctx, sledID, info()); err == nil || nexus.Permanent(err) {
		t.Fatalf("POST of the same generation: %v", err)
	}
	st := nexus.SledVmmState{VmmState: nexus.VmmRuntimeState{Gen: 3, State: "running", TimeUpdated: time.Now().UTC()}}
	if err := c.PutVMM(ctx, vmmID, st); err != nil {
		t.Fatal(err)
	}
	if latest, ok := n.LatestVMM(vmmID); !ok || latest.VmmState.Gen != 3 || latest.VmmState.State != "running" {
		t.Fatalf("Nexus holds %+v", latest)
	}
	proxy.WantSeen("GET /sled-agents/{sled_id} 404", "GET /sled-agents/{sled_id} 200", "POST /sled-agents/{sled_id} 204", "POST /sled-agents/{sled_id} 500", "PUT /vmms/{propolis_id} 204")
}

// No address answering, or none found, is ErrUnreachable, transient.
func TestClientWithNoNexusIsUnreachable(t *testing.T) {
	for name, f := range map[string]nexus.Finder{
		"none found": nexus.Static{},
		"none up":    nexus.Static{deadAddr(t), deadAddr(t)},
	} {
		_, err := nexus.NewClient(f, time.Second).GetSled(context.Background(), sledID)
		if !errors.Is(err, nexus.ErrUnreachable) || nexus.Permanent(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A Nexus that hangs costs one request deadline.
func TestAHangingNexusCostsOneDeadline(t *testing.T) {
	n := startNexus(t)
	if err := n.SetFault(nexussim.FaultHang); err != nil {
		t.Fatal(err)
	}
	c := nexus.NewClient(nexus.Static{netip.MustParseAddrPort(n.Addr())}, 200*time.Millisecond)
	err := c.PutVMM(context.Background(), vmmID, nexus.SledVmmState{VmmState: nexus.VmmRuntimeState{Gen: 1, State: "starting", TimeUpdated: time.Now()}})
	if !errors.Is(err, nexus.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PUT to a hanging Nexus: %v", err)
	}
}

// An answer that is not a SledAgentInfo is never trusted.
func TestGarbageIsNotTrusted(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":         `<html>hello</html>`,
		"missing members":  `{"sa_address":"[::1]:1","generation":4}`,
		"wrong type":       `{"baseboard":{"serial":"a","part":"b","revision":0},"cpu_family":"unknown","decommissioned":"no","generation":4,"repo_depot_port":0,"reservoir_size":1,"role":"gimlet","sa_address":"[::1]:1","usable_hardware_threads":1,"usable_physical_ram":2}`,
		"generation below": `{"baseboard":{"serial":"a","part":"b","revision":0},"cpu_family":"unknown","decommissioned":false,"generation":-1,"repo_depot_port":0,"reservoir_size":1,"role":"gimlet","sa_address":"[::1]:1","usable_hardware_threads":1,"usable_physical_ram":2}`,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(body))
		}))
		c := nexus.NewClient(nexus.Static{netip.MustParseAddrPort(srv.Listener.Addr().String())}, time.Second)
		if got, err := c.GetSled(context.Background(), sledID); err == nil || nexus.Permanent(err) {
			t.Errorf("%s: %+v, %v", name, got, err)
		}
		srv.Close()
	}
}
