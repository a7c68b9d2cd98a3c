package zonenet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol is the rtnetlink protocol (rtm_protocol) of every route the
// runtime makes: its mark on routes, as the alias is on links, so that a
// route to a zone's address that something else made is never taken for
// ours (`ip -6 route show proto 84` lists ours). The kernel gives no meaning
// to values above RTPROT_STATIC (4); 84 is none of the kernel's named ones
// (linux/rtnetlink.h), nor one iproute2's rt_protos or a routing daemon
// (bird 12, babel 42, openr 99, FRR 186-198) uses.
const RouteProtocol netlink.RouteProtocol = 84

// ErrForeignRoute is wrapped when a route to a zone's underlay address
// exists that the runtime did not make: replacing it would take traffic
// meant for whatever it leads to into the zone. It is left alone, and
// Ensure cannot proceed.
var ErrForeignRoute = errors.New("a route to the zone's underlay address exists that this runtime did not make")

// ours reports whether r is a route the runtime made: it carries
// RouteProtocol, or it is what an earlier version, which did not mark its
// routes, made: a route through the zone's own host link (ourLink says
// whether a link index is that link, whose alias proves it ours) with
// netlink's default protocol, RTPROT_BOOT. Nothing else routes through a
// zone's host link, which the runtime makes, names and marks, and which
// goes with the zone.
func ours(r *netlink.Route, ourLink func(index int) bool) bool {
	if r.Protocol == RouteProtocol {
		return true
	}
	return r.Protocol == unix.RTPROT_BOOT && len(r.MultiPath) == 0 && r.LinkIndex != 0 && ourLink(r.LinkIndex)
}

// checkHostRoute fails with ErrForeignRoute, naming the route, if a route
// to exactly addr/128 exists that is not ours (p: the zone's underlay pair,
// whose host end may carry an earlier version's route). It runs before
// Ensure changes anything, so a refused zone leaves the host as it was.
func checkHostRoute(ctx context.Context, addr netip.Addr, p pair) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	timeout := maxCallTime
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	if err := h.SetSocketTimeout(timeout); err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	// Looked up only for an unmarked route: the common case, no route or
	// a marked one, costs no lookup.
	ourLink := func(index int) bool {
		l, err := h.LinkByIndex(index)
		return err == nil && l.Attrs().Name == p.host && l.Attrs().Alias == p.alias
	}
	r, err := foreignRoute(h, addr, ourLink)
	if err != nil || r == nil {
		return err
	}
	return fmt.Errorf("%s; left alone: %w", describeRoute(h, r), ErrForeignRoute)
}

// foreignRoute returns a route to exactly addr/128, in any table, that is
// not ours (ourLink as for ours), or nil if there is none.
//
// It asks the kernel which route it would use (RTM_F_FIB_MATCH: the route
// entry itself, one request, not a dump of a table that holds a route per
// zone): a /128 to addr would be that one, unless another /128 to addr
// wins over it, which is then the one that matters. When the route found
// refuses traffic (unreachable, blackhole, prohibit) the kernel answers
// with its error instead, and every table is looked through.
func foreignRoute(h *netlink.Handle, addr netip.Addr, ourLink func(index int) bool) (*netlink.Route, error) {
	rs, err := h.RouteGetWithOptions(addr.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
	switch {
	case errors.Is(err, unix.ENETUNREACH):
		return nil, nil // no route at all
	case err != nil:
		if rs, err = dump(func() ([]netlink.Route, error) {
			return h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		}); err != nil {
			return nil, fmt.Errorf("listing routes: %w", err)
		}
	}
	want := netip.PrefixFrom(addr, 128)
	for i := range rs {
		if r := &rs[i]; r.Dst != nil && toPrefix(r.Dst) == want && !ours(r, ourLink) {
			return r, nil
		}
	}
	return nil, nil
}

// describeRoute names r for people, as `ip -6 route` would show it.
func describeRoute(h *netlink.Handle, r *netlink.Route) string {
	s := fmt.Sprintf("route to %s", toPrefix(r.Dst))
	if r.Type != 0 && r.Type != unix.RTN_UNICAST {
		s = fmt.Sprintf("%s route to %s", routeType(r.Type), toPrefix(r.Dst))
	}
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	if r.LinkIndex != 0 {
		dev := fmt.Sprintf("index %d", r.LinkIndex)
		if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		s += " dev " + dev
	}
	if len(r.MultiPath) > 0 {
		s += fmt.Sprintf(" (%d next hops)", len(r.MultiPath))
	}
	return fmt.Sprintf("%s proto %d table %d", s, r.Protocol, r.Table)
}

func routeType(t int) string {
	switch t {
	case unix.RTN_LOCAL:
		return "local"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	case unix.RTN_ANYCAST:
		return "anycast"
	}
	return fmt.Sprintf("type-%d", t)
}
