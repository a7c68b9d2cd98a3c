package ddm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
)

// MaxVNI is the largest Geneve VNI (24 bits).
const MaxVNI = 1<<24 - 1

// TunnelOrigin is a tunnel endpoint as a router originates it: traffic for
// OverlayPrefix in VNI is to be encapsulated to BoundaryAddr (upstream's
// switches originate their boundary services this way, VNI 99). For one
// overlay prefix, origins of Metric above zero are preferred to those of
// zero (ddmd's effective set).
//
// DDM keys origins by every field, with the prefix's host bits kept: the
// same prefix at two metrics is two origins, and withdrawing one leaves the
// other.
type TunnelOrigin struct {
	OverlayPrefix netip.Prefix `json:"overlay_prefix"`
	BoundaryAddr  netip.Addr   `json:"boundary_addr"`
	VNI           uint32       `json:"vni"`
	Metric        uint64       `json:"metric"`
}

// TunnelRoute is an origin as DDM learned it: Nexthop is the peer it came
// through (a link-local address; it names the peer, not where traffic
// goes).
type TunnelRoute struct {
	Nexthop netip.Addr   `json:"nexthop"`
	Origin  TunnelOrigin `json:"origin"`
}

// check says what is wrong with o, if anything: what DDM's API or a Geneve
// header cannot carry.
func (o TunnelOrigin) check() error {
	switch {
	case !o.OverlayPrefix.IsValid():
		return errors.New("no overlay_prefix")
	case !o.BoundaryAddr.Is6() || o.BoundaryAddr.Zone() != "":
		return fmt.Errorf("boundary_addr %q is not an IPv6 address", o.BoundaryAddr)
	case o.VNI > MaxVNI:
		return fmt.Errorf("vni %d is over 24 bits", o.VNI)
	}
	return nil
}

// CompareTunnelOrigins orders origins by overlay prefix (address, then
// width), boundary address, VNI and metric.
func CompareTunnelOrigins(a, b TunnelOrigin) int {
	if c := a.OverlayPrefix.Addr().Compare(b.OverlayPrefix.Addr()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.OverlayPrefix.Bits(), b.OverlayPrefix.Bits()); c != 0 {
		return c
	}
	if c := a.BoundaryAddr.Compare(b.BoundaryAddr); c != 0 {
		return c
	}
	if c := cmp.Compare(a.VNI, b.VNI); c != 0 {
		return c
	}
	return cmp.Compare(a.Metric, b.Metric)
}

// CompareTunnelRoutes orders routes by origin, then next hop.
func CompareTunnelRoutes(a, b TunnelRoute) int {
	if c := CompareTunnelOrigins(a.Origin, b.Origin); c != 0 {
		return c
	}
	return a.Nexthop.Compare(b.Nexthop)
}

// TunnelEndpoints returns the tunnel routes DDM learned from its peers,
// sorted (CompareTunnelRoutes): every route, as DDM reports them, not only
// the effective ones. An entry that is not a valid route (an address not
// IPv6, a VNI over 24 bits) fails the call, naming it.
func (c *Client) TunnelEndpoints(ctx context.Context) ([]TunnelRoute, error) {
	var out []TunnelRoute
	if err := c.do(ctx, http.MethodGet, "/tunnel_endpoints", nil, &out); err != nil {
		return nil, err
	}
	for _, r := range out {
		err := r.Origin.check()
		if err == nil && (!r.Nexthop.Is6() || r.Nexthop.Zone() != "") {
			err = fmt.Errorf("nexthop %q is not an IPv6 address", r.Nexthop)
		}
		if err != nil {
			return nil, fmt.Errorf("ddm GET /tunnel_endpoints: route %+v: %w", r, err)
		}
	}
	slices.SortFunc(out, CompareTunnelRoutes)
	return nonNil(out), nil
}

// OriginatedTunnelEndpoints returns the tunnel endpoints this DDM
// originates, sorted (CompareTunnelOrigins). An entry that is not a valid
// origin fails the call, naming it.
func (c *Client) OriginatedTunnelEndpoints(ctx context.Context) ([]TunnelOrigin, error) {
	var out []TunnelOrigin
	if err := c.do(ctx, http.MethodGet, "/originated_tunnel_endpoints", nil, &out); err != nil {
		return nil, err
	}
	for _, o := range out {
		if err := o.check(); err != nil {
			return nil, fmt.Errorf("ddm GET /originated_tunnel_endpoints: origin %+v: %w", o, err)
		}
	}
	slices.SortFunc(out, CompareTunnelOrigins)
	return nonNil(out), nil
}

// AdvertiseTunnelEndpoints asks DDM to originate origins. It is idempotent.
// An origin DDM's API or a Geneve header cannot carry fails the call before
// anything is sent; an empty slice sends nothing.
func (c *Client) AdvertiseTunnelEndpoints(ctx context.Context, origins []TunnelOrigin) error {
	return c.tunnelCall(ctx, http.MethodPut, origins)
}

// WithdrawTunnelEndpoints asks DDM to stop originating origins, matched on
// every field. It is idempotent: withdrawing an origin DDM does not
// originate succeeds.
func (c *Client) WithdrawTunnelEndpoints(ctx context.Context, origins []TunnelOrigin) error {
	return c.tunnelCall(ctx, http.MethodDelete, origins)
}

func (c *Client) tunnelCall(ctx context.Context, method string, origins []TunnelOrigin) error {
	if len(origins) == 0 {
		return nil
	}
	// The body is a set: each origin once.
	set := make([]TunnelOrigin, 0, len(origins))
	seen := make(map[TunnelOrigin]bool, len(origins))
	for _, o := range origins {
		if err := o.check(); err != nil {
			return fmt.Errorf("ddm %s /tunnel_endpoint: origin %+v: %w", method, o, err)
		}
		if !seen[o] {
			seen[o] = true
			set = append(set, o)
		}
	}
	return c.do(ctx, method, "/tunnel_endpoint", set, nil)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
