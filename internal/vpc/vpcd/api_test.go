package vpcd

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet/zonenettest"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// The local API over its unix socket: ports made, changed and removed,
// mappings set and cleared, the boundary table replaced, the state read
// back; bad bodies refused with 400, naming the problem, and nothing
// changed. (No root: the sled's Geneve socket is on ::1, the port's link
// is not there and it waits for it.)
func TestAPI(t *testing.T) {
	d := lonelyDataPath(t)
	c := serveAPI(t, d)

	subnet := netip.MustParsePrefix("172.30.0.0/22")
	spec := PortSpec{Link: Link{Name: "vnNotThere"}, VNI: 7777, MAC: rules.MustMAC("a8:40:25:f0:00:01"),
		IPv4:   &IPSpec{Private: netip.MustParseAddr("172.30.0.5"), Subnet: subnet},
		System: []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}}}
	if err := c.EnsurePort(t.Context(), "p1", spec); err != nil {
		t.Fatal(err)
	}
	m := V2P{VirtualIP: netip.MustParseAddr("172.30.0.6"), VirtualMAC: rules.MustMAC("A8:40:25:F0:00:02"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:102::1"), VNI: 7777}
	if err := c.SetV2P(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	tep := mappings.TEP{Addr: netip.MustParseAddr("fd00:99::1"), VNI: 99}
	if err := c.SetV2B(t.Context(), []mappings.Boundary{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), TEPs: []mappings.TEP{tep}}}); err != nil {
		t.Fatal(err)
	}
	st, err := c.State(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Ports) != 1 || st.Ports[0].Name != "p1" || len(st.Ports[0].Routes) != 1 || !strings.HasPrefix(st.Ports[0].Status, "waiting for its link") && st.Ports[0].Status != "attaching" {
		t.Errorf("ports %+v", st.Ports)
	}
	if len(st.V2P) != 1 || st.V2P[0] != m || len(st.V2B) != 1 {
		t.Errorf("v2p %+v, v2b %+v", st.V2P, st.V2B)
	}

	// Refusals.
	var apiErr *APIError
	bad := spec
	bad.Link = Link{}
	if err := c.EnsurePort(t.Context(), "p2", bad); !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "no link") {
		t.Errorf("a port without a link: %v", err)
	}
	if err := c.SetV2P(t.Context(), V2P{VirtualIP: m.VirtualIP, PhysicalHostIP: netip.MustParseAddr("10.0.0.1"), VNI: 7777}); !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "want IPv6") {
		t.Errorf("a v4 sled: %v", err)
	}
	if err := c.do(t.Context(), "PUT", "/v2p", map[string]any{"virtual_ip": "172.30.0.7", "vni": 7777, "color": "blue"}, nil); !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "color") {
		t.Errorf("an unknown member: %v", err)
	}

	// Rules and routes changed in place; an unknown port is 404.
	rs := []rules.FirewallRule{{Status: rules.Enabled, Direction: rules.Inbound, Action: rules.RuleAllow, Priority: 100,
		Protocols: []rules.ProtocolFilter{{Proto: rules.ProtoTCP}}}}
	if err := c.SetFirewall(t.Context(), "p1", rs); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParsePrefix("10.0.0.0/8")
	if err := c.ApplyRoutes(t.Context(), "p1", RouteChange{Class: "custom", Add: []rules.Route{{Dest: other, Target: rules.DropTarget()}}}); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State(t.Context()); len(st.Ports) != 1 || len(st.Ports[0].Inbound) != 1 || len(st.Ports[0].Routes) != 2 || len(st.Ports[0].Spec.Custom) != 1 {
		t.Errorf("after rules and routes: %+v", st.Ports)
	}
	if err := c.SetFirewall(t.Context(), "nope", rs); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("rules of no port: %v", err)
	}
	if err := c.ApplyRoutes(t.Context(), "p1", RouteChange{Class: "both"}); !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "want system or custom") {
		t.Errorf("a bad class: %v", err)
	}

	// Changed, then removed, twice.
	spec.System = nil
	if err := c.EnsurePort(t.Context(), "p1", spec); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State(t.Context()); len(st.Ports) != 1 || len(st.Ports[0].Routes) != 0 {
		t.Errorf("after the change: %+v", st.Ports)
	}
	for range 2 {
		if err := c.DeletePort(t.Context(), "p1"); err != nil {
			t.Fatal(err)
		}
		if err := c.ClearV2P(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := c.State(t.Context()); len(st.Ports) != 0 || len(st.V2P) != 0 {
		t.Errorf("after removal: %+v", st)
	}
}

// serveAPI serves d's local API on a socket of the test's own until the
// test ends, and returns a client of it once it answers.
func serveAPI(t *testing.T, d *Daemon) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vpcd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, sock) }()
	t.Cleanup(func() { cancel(); <-served })
	c := NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.State(t.Context()); err == nil || time.Now().After(deadline) {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lonelyDataPath starts a data path with no neighbour: its Geneve socket on
// [::1]:6081 of a network namespace of the test's own when it may make one
// (so that tests running at once do not meet), else of this process's.
func lonelyDataPath(t *testing.T) *Daemon {
	t.Helper()
	opts := Options{Underlay: netip.MustParseAddr("::1")}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("ip"); err == nil {
			ns := zonenettest.Netns(t, "zt")
			exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
			opts.Netns = "/run/netns/" + ns
		}
	}
	d, err := Start(opts)
	if err != nil {
		t.Skipf("no Geneve socket on [::1]:6081 here: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
