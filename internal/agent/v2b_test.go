package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
)

// The boundary table is what the routing daemon learned, as ddmd programs
// OPTE: per overlay prefix (host bits cleared) its endpoints, once each, in
// address order; where some have a metric above zero, only those.
func TestV2BFromTunnelRoutes(t *testing.T) {
	a, b := netip.MustParseAddr("fd00:99::1"), netip.MustParseAddr("fd00:99::2")
	route := func(p string, tep netip.Addr, metric uint64) ddm.TunnelRoute {
		return ddm.TunnelRoute{Nexthop: netip.MustParseAddr("fe80::1"), Origin: ddm.TunnelOrigin{OverlayPrefix: netip.MustParsePrefix(p), BoundaryAddr: tep, VNI: 99, Metric: metric}}
	}
	got := v2bFrom([]ddm.TunnelRoute{
		route("0.0.0.0/0", b, 0), route("0.0.0.0/0", a, 0), route("0.0.0.0/0", a, 0),
		route("198.51.100.7/24", a, 0), route("198.51.100.0/24", b, 5),
	})
	want := []mappings.Boundary{
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), TEPs: []mappings.TEP{{Addr: a, VNI: 99}, {Addr: b, VNI: 99}}},
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), TEPs: []mappings.TEP{{Addr: b, VNI: 99}}},
	}
	if !slices.EqualFunc(got, want, sameBoundary) {
		t.Errorf("v2b %+v, want %+v", got, want)
	}
}
