package ddm_test

import (
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
)

var netipEq = cmp.Options{
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
}

func origin(prefix, boundary string, vni uint32, metric uint64) ddm.TunnelOrigin {
	return ddm.TunnelOrigin{OverlayPrefix: netip.MustParsePrefix(prefix), BoundaryAddr: netip.MustParseAddr(boundary), VNI: vni, Metric: metric}
}

// An answer as ddmd gives it (a set: any order; metric up to 2^64-1;
// fields it may add later) is decoded into typed routes, sorted.
func TestTunnelEndpointsDecodeARealAnswer(t *testing.T) {
	f, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[
			{"nexthop":"fe80::aa:2","origin":{"overlay_prefix":"::/0","boundary_addr":"fd00:99::2","vni":99,"metric":18446744073709551615}},
			{"origin":{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":0,"later":1},"nexthop":"fe80::aa:1"},
			{"nexthop":"fe80::aa:2","origin":{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":0}}]`)
	})
	got, err := c.TunnelEndpoints(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []ddm.TunnelRoute{
		{Nexthop: netip.MustParseAddr("fe80::aa:1"), Origin: origin("0.0.0.0/0", "fd00:99::1", 99, 0)},
		{Nexthop: netip.MustParseAddr("fe80::aa:2"), Origin: origin("0.0.0.0/0", "fd00:99::1", 99, 0)},
		{Nexthop: netip.MustParseAddr("fe80::aa:2"), Origin: origin("::/0", "fd00:99::2", 99, 1<<64-1)},
	}
	if diff := cmp.Diff(want, got, netipEq); diff != "" {
		t.Errorf("TunnelEndpoints (-want +got):\n%s", diff)
	}
	if r := f.requests(); len(r) != 1 || r[0] != (seen{"GET", "/tunnel_endpoints", "2.0.0", "", ""}) {
		t.Errorf("requests %v", r)
	}
}

func TestTunnelEndpointsRejectBadEntries(t *testing.T) {
	const o = `"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1"`
	for _, tt := range []struct{ name, route, says string }{
		{"nexthop IPv4", `{"nexthop":"192.0.2.1","origin":{` + o + `,"vni":99}}`, "nexthop"},
		{"no nexthop", `{"origin":{` + o + `,"vni":99}}`, "nexthop"},
		{"nexthop with zone", `{"nexthop":"fe80::1%eth0","origin":{` + o + `,"vni":99}}`, "nexthop"},
		{"no boundary", `{"nexthop":"fe80::1","origin":{"overlay_prefix":"0.0.0.0/0","vni":99}}`, "boundary_addr"},
		{"boundary IPv4", `{"nexthop":"fe80::1","origin":{"overlay_prefix":"0.0.0.0/0","boundary_addr":"192.0.2.1","vni":99}}`, "boundary_addr"},
		{"no overlay", `{"nexthop":"fe80::1","origin":{"boundary_addr":"fd00:99::1","vni":99}}`, "overlay_prefix"},
		{"bad overlay", `{"nexthop":"fe80::1","origin":{"overlay_prefix":"nope","boundary_addr":"fd00:99::1","vni":99}}`, "nope"},
		{"vni over 24 bits", `{"nexthop":"fe80::1","origin":{` + o + `,"vni":16777216}}`, "24 bits"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `[{"nexthop":"fe80::1","origin":{`+o+`,"vni":99}},`+tt.route+`]`)
			})
			if got, err := c.TunnelEndpoints(t.Context()); err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("TunnelEndpoints = %v, %v; want an error naming %q", got, err, tt.says)
			}
		})
	}
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `[{`+o+`,"vni":99},{"overlay_prefix":"10.0.0.0/8","boundary_addr":"10.0.0.1","vni":99}]`)
	})
	if got, err := c.OriginatedTunnelEndpoints(t.Context()); err == nil || !strings.Contains(err.Error(), "boundary_addr") {
		t.Errorf("OriginatedTunnelEndpoints = %v, %v; want an error naming boundary_addr", got, err)
	}
}

// Origins are sent as a set, each once; one the API or a Geneve header
// cannot carry fails the call before anything is sent, and none sends
// nothing.
func TestAdvertiseWithdrawTunnelEndpointsSendASetOfValidOrigins(t *testing.T) {
	f, c := startFake(t, nil)
	ctx := t.Context()
	good := origin("0.0.0.0/0", "fd00:99::1", 99, 0)
	for _, bad := range []ddm.TunnelOrigin{
		{BoundaryAddr: netip.MustParseAddr("fd00:99::1"), VNI: 99},
		origin("0.0.0.0/0", "192.0.2.1", 99, 0),
		origin("0.0.0.0/0", "fe80::1%eth0", 99, 0),
		origin("0.0.0.0/0", "fd00:99::1", 1<<24, 0),
	} {
		if err := c.AdvertiseTunnelEndpoints(ctx, []ddm.TunnelOrigin{good, bad}); err == nil {
			t.Errorf("AdvertiseTunnelEndpoints(%+v) succeeded", bad)
		}
		if err := c.WithdrawTunnelEndpoints(ctx, []ddm.TunnelOrigin{good, bad}); err == nil {
			t.Errorf("WithdrawTunnelEndpoints(%+v) succeeded", bad)
		}
	}
	if err := c.AdvertiseTunnelEndpoints(ctx, nil); err != nil {
		t.Errorf("AdvertiseTunnelEndpoints(nil) = %v", err)
	}
	if got := f.requests(); len(got) != 0 {
		t.Fatalf("requests sent: %v, want none", got)
	}
	v6 := origin("fd00:1::/64", "fd00:99::1", 99, 7)
	if err := c.AdvertiseTunnelEndpoints(ctx, []ddm.TunnelOrigin{good, v6, good}); err != nil {
		t.Fatal(err)
	}
	if err := c.WithdrawTunnelEndpoints(ctx, []ddm.TunnelOrigin{v6}); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"PUT", "/tunnel_endpoint", "2.0.0", "application/json", `[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"fd00:99::1","vni":99,"metric":0},` +
			`{"overlay_prefix":"fd00:1::/64","boundary_addr":"fd00:99::1","vni":99,"metric":7}]`},
		{"DELETE", "/tunnel_endpoint", "2.0.0", "application/json", `[{"overlay_prefix":"fd00:1::/64","boundary_addr":"fd00:99::1","vni":99,"metric":7}]`},
	}
	if diff := cmp.Diff(want, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

// Two sleds sharing one simulator, and a switch's mgd originating its
// boundary services there: every sled learns them, through the
// simulator's peer, and a withdrawal is seen by all.
func TestSledsSharingTheSimulatorLearnTheSwitchsEndpoints(t *testing.T) {
	s, sw := startSim(t)
	ctx := t.Context()
	var sleds []*ddm.Client
	for range 2 {
		c, err := ddm.NewClient(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseIdleConnections)
		sleds = append(sleds, c)
	}
	v4, v6 := origin("0.0.0.0/0", "fd00:99::1", 99, 0), origin("::/0", "fd00:99::1", 99, 0)
	if err := sw.AdvertiseTunnelEndpoints(ctx, []ddm.TunnelOrigin{v6, v4}); err != nil {
		t.Fatal(err)
	}
	for i, c := range sleds {
		got, err := c.TunnelEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []ddm.TunnelRoute{{Nexthop: ddmsim.Peer, Origin: v4}, {Nexthop: ddmsim.Peer, Origin: v6}}
		if diff := cmp.Diff(want, got, netipEq); diff != "" {
			t.Errorf("sled %d learned (-want +got):\n%s", i, diff)
		}
	}
	if got, err := sw.OriginatedTunnelEndpoints(ctx); err != nil || !cmp.Equal([]ddm.TunnelOrigin{v4, v6}, got, netipEq) {
		t.Errorf("OriginatedTunnelEndpoints = %v, %v", got, err)
	}
	if err := sw.WithdrawTunnelEndpoints(ctx, []ddm.TunnelOrigin{v6}); err != nil {
		t.Fatal(err)
	}
	for i, c := range sleds {
		got, err := c.TunnelEndpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]ddm.TunnelRoute{{Nexthop: ddmsim.Peer, Origin: v4}}, got, netipEq); diff != "" {
			t.Errorf("sled %d after the withdrawal (-want +got):\n%s", i, diff)
		}
	}
}
