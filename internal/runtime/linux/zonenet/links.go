package zonenet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// maxCallTime bounds every netlink reply when the context has no earlier
// deadline (Inspect and List have no context at all).
const maxCallTime = 10 * time.Second

// session holds netlink handles on the host's namespace and, if the zone's
// namespace exists, on that too.
type session struct {
	host *netlink.Handle
	zone *netlink.Handle // nil if the namespace does not exist
	ns   netns.NsHandle  // the zone's namespace, or netns.None()
	view *hostView       // if set, the host's links, addresses and routes as seen earlier
	// fresh: the zone's namespace was made by this session's Ensure, so
	// it holds no link but its loopback, and a pair made in it needs no
	// look inside first.
	fresh bool
}

func openSession(ctx context.Context, netnsName string) (*session, error) {
	timeout := maxCallTime
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	s := &session{ns: netns.None()}
	var err error
	if s.host, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	if err := s.host.SetSocketTimeout(timeout); err != nil {
		s.close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	if s.ns, err = openNetns(netnsName); err != nil {
		s.close()
		return nil, err
	}
	if !s.ns.IsOpen() {
		return s, nil
	}
	if s.zone, err = handleIn(s.ns); err != nil {
		s.close()
		return nil, fmt.Errorf("netlink in namespace %s: %w", netnsName, err)
	}
	if err := s.zone.SetSocketTimeout(timeout); err != nil {
		s.close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return s, nil
}

func (s *session) close() {
	if s.zone != nil {
		s.zone.Close()
	}
	if s.ns.IsOpen() {
		s.ns.Close()
	}
	if s.host != nil {
		s.host.Close()
	}
}

// pair describes one veth pair of a zone.
type pair struct {
	host, zone string // link names: host end, and zone end in the namespace
	alias      string // the host end's ownership mark
}

func pairs(tag, zoneID string) (underlay, nic pair) {
	u, n := LinkNames(tag, zoneID)
	return pair{u, UnderlayIfName, alias(tag, zoneID, RoleUnderlay)},
		pair{n, NICIfName, alias(tag, zoneID, RoleNIC)}
}

// look returns the host end and zone end of p; either is nil if absent.
func (s *session) look(p pair) (hl, zl netlink.Link, err error) {
	if s.view != nil {
		hl = s.view.links[p.host]
	} else if hl, err = linkByName(s.host, p.host); err != nil {
		return nil, nil, err
	}
	if s.zone != nil {
		if zl, err = linkByName(s.zone, p.zone); err != nil {
			return nil, nil, err
		}
	}
	return hl, zl, nil
}

func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up link %s: %w", name, err)
	}
	return l, nil
}

// paired reports whether hl and zl are the two ends of one veth, zl in the
// zone's namespace.
func (s *session) paired(hl, zl netlink.Link) (bool, error) {
	if hl == nil || zl == nil || s.zone == nil {
		return false, nil
	}
	_, hv := hl.(*netlink.Veth)
	_, zv := zl.(*netlink.Veth)
	if !hv || !zv || hl.Attrs().ParentIndex != zl.Attrs().Index || zl.Attrs().ParentIndex != hl.Attrs().Index {
		return false, nil
	}
	nsid, err := s.host.GetNetNsIdByFd(int(s.ns))
	if err != nil {
		return false, fmt.Errorf("looking up the namespace's id: %w", err)
	}
	return nsid >= 0 && hl.Attrs().NetNsID == nsid, nil
}

// owns reports whether the host end hl is ours: it carries p's mark, or it
// carries no mark at all and is paired with p's zone end in the zone's own
// namespace. The second case is the window between creating a pair and
// setting its alias (the kernel ignores an alias given at creation); the
// link's name, a hash of (tag, zone), and its peer's place prove it ours.
func (s *session) owns(hl, zl netlink.Link, p pair) (bool, error) {
	switch hl.Attrs().Alias {
	case p.alias:
		return true, nil
	case "":
		return s.paired(hl, zl)
	}
	return false, nil
}

// ensurePair makes p exist with its zone end in the zone's namespace and
// returns both ends. A host end of ours whose peer is anywhere else (still in
// the host namespace after a crash, or in an older namespace that something
// keeps alive) is deleted, with its peer, and the pair made again. created
// says the pair was made just now (so it has no routes yet).
func (s *session) ensurePair(p pair, mac net.HardwareAddr) (hl, zl netlink.Link, created bool, err error) {
	if hl, zl, err = s.lookBefore(p); err != nil {
		return nil, nil, false, err
	}
	if hl != nil {
		ok, err := s.owns(hl, zl, p)
		if err != nil {
			return nil, nil, false, err
		}
		if !ok {
			return nil, nil, false, fmt.Errorf("%s has alias %q, want %q: %w", p.host, hl.Attrs().Alias, p.alias, ErrNotOwned)
		}
		if ok, err := s.paired(hl, zl); err != nil {
			return nil, nil, false, err
		} else if ok {
			if hl.Attrs().Alias != p.alias {
				if err := s.host.LinkSetAlias(hl, p.alias); err != nil {
					return nil, nil, false, fmt.Errorf("marking %s: %w", p.host, err)
				}
			}
			return hl, zl, false, nil
		}
		if err := delLink(s.host, hl); err != nil {
			return nil, nil, false, err
		}
	}
	if zl != nil {
		// A zone end without our host end: the namespace is this zone's,
		// and so is whatever is in it.
		if err := delLink(s.zone, zl); err != nil {
			return nil, nil, false, err
		}
	}
	// The host end's MAC is chosen here, as the kernel would (random,
	// locally administered), so that the link made is known without
	// asking for it again: LinkAdd has looked up its index.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.host
	if attrs.HardwareAddr, err = randomMAC(); err != nil {
		return nil, nil, false, err
	}
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: p.zone, PeerNamespace: netlink.NsFd(s.ns), PeerHardwareAddr: mac}
	if err := s.host.LinkAdd(veth); err != nil {
		return nil, nil, false, fmt.Errorf("creating veth %s/%s: %w", p.host, p.zone, err)
	}
	if veth.Index == 0 {
		return nil, nil, false, fmt.Errorf("veth %s/%s vanished right after creation", p.host, p.zone)
	}
	if zl, err = linkByName(s.zone, p.zone); err != nil {
		return nil, nil, false, err
	}
	if zl == nil {
		return nil, nil, false, fmt.Errorf("veth %s/%s vanished right after creation", p.host, p.zone)
	}
	if err := s.host.LinkSetAlias(veth, p.alias); err != nil {
		return nil, nil, false, fmt.Errorf("marking %s: %w", p.host, err)
	}
	veth.Alias = p.alias
	return veth, zl, true, nil
}

// lookBefore is look, before a pair is made: in a fresh namespace there is
// no zone end to look for, and the host end is looked for where no lock is
// taken first (hostLinkMark), the full link only when it is there.
func (s *session) lookBefore(p pair) (hl, zl netlink.Link, err error) {
	if !s.fresh || s.view != nil {
		return s.look(p)
	}
	index, _, err := hostLinkMark(s.host, p.host)
	if err != nil || index == 0 {
		return nil, nil, err
	}
	if hl, err = linkByName(s.host, p.host); err != nil {
		return nil, nil, err
	}
	return hl, nil, nil
}

// randomMAC returns a random unicast, locally administered MAC, as the
// kernel gives a link made without one.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("choosing a MAC: %w", err)
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}

func delLink(h *netlink.Handle, l netlink.Link) error {
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting link %s: %w", l.Attrs().Name, err)
	}
	return nil
}

func isUp(l netlink.Link) bool { return l != nil && l.Attrs().Flags&net.FlagUp != 0 }

func setUp(h *netlink.Handle, l netlink.Link) error {
	if isUp(l) {
		return nil
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// dump retries a netlink dump that a concurrent change interrupted.
func dump[T any](f func() ([]T, error)) ([]T, error) {
	for i := 0; ; i++ {
		v, err := f()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 5 {
			continue
		}
		return v, err
	}
}

// addrs returns the addresses on l, split into those of global scope and the
// rest (link-local ones, which the kernel also adds by itself).
func addrs(h *netlink.Handle, l netlink.Link) (global, local []netip.Prefix, err error) {
	list, err := dump(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
	}
	global, local = splitAddrs(list)
	return global, local, nil
}

// splitAddrs sorts addresses into global and link-local (or narrower) ones.
func splitAddrs(list []netlink.Addr) (global, local []netip.Prefix) {
	for _, a := range list {
		p := toPrefix(a.IPNet)
		if a.Scope == unix.RT_SCOPE_UNIVERSE {
			global = append(global, p)
		} else {
			local = append(local, p)
		}
	}
	return global, local
}

// hostAddrs is addrs of a host link, from the view if the session has one.
func (s *session) hostAddrs(l netlink.Link) (global, local []netip.Prefix, err error) {
	if s.view == nil {
		return addrs(s.host, l)
	}
	global, local = splitAddrs(s.view.addrs[l.Attrs().Index])
	return global, local, nil
}

// hostRoutes is routes of a host link, from the view if the session has
// one.
func (s *session) hostRoutes(l netlink.Link) ([]netlink.Route, error) {
	if s.view == nil {
		return routes(s.host, l)
	}
	return s.view.routes[l.Attrs().Index], nil
}

func toPrefix(n *net.IPNet) netip.Prefix {
	ip, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones)
}

func addAddr(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // usable at once: no duplicate detection on a private link
	}
	if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %v to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// syncAddrs makes the global-scope addresses of l exactly want: it adds the
// missing ones before it deletes the others.
func syncAddrs(h *netlink.Handle, l netlink.Link, want []netip.Prefix) error {
	have, _, err := addrs(h, l)
	if err != nil {
		return err
	}
	for _, p := range want {
		if !slices.Contains(have, p) {
			if err := addAddr(h, l, p); err != nil {
				return err
			}
		}
	}
	for _, p := range have {
		if slices.Contains(want, p) {
			continue
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if err := h.AddrDel(l, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("deleting %v from %s: %w", p, l.Attrs().Name, err)
		}
	}
	return nil
}

// sameSet reports whether a and b hold the same prefixes.
func sameSet(a, b []netip.Prefix) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(p netip.Prefix) bool { return !slices.Contains(b, p) })
}

// routes returns the IPv6 routes of the main table through l.
func routes(h *netlink.Handle, l netlink.Link) ([]netlink.Route, error) {
	rs, err := dump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return nil, fmt.Errorf("listing routes through %s: %w", l.Attrs().Name, err)
	}
	return rs, nil
}

// setNeigh makes ip's neighbour entry on l permanent, with MAC mac.
func setNeigh(h *netlink.Handle, l netlink.Link, ip netip.Addr, mac net.HardwareAddr) error {
	n := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := h.NeighSet(n); err != nil {
		return fmt.Errorf("setting the neighbour entry of %s on %s: %w", ip, l.Attrs().Name, err)
	}
	return nil
}

// neighbours lists the IPv6 neighbour entries on l.
func neighbours(h *netlink.Handle, l netlink.Link) ([]netlink.Neigh, error) {
	ns, err := dump(func() ([]netlink.Neigh, error) { return h.NeighList(l.Attrs().Index, netlink.FAMILY_V6) })
	if err != nil {
		return nil, fmt.Errorf("listing neighbours on %s: %w", l.Attrs().Name, err)
	}
	return ns, nil
}

// hostNeighbours is neighbours of a host link, from the view if the session
// has one.
func (s *session) hostNeighbours(l netlink.Link) ([]netlink.Neigh, error) {
	if s.view == nil {
		return neighbours(s.host, l)
	}
	return s.view.neighs[l.Attrs().Index], nil
}

// hasNeigh reports whether ns holds a permanent entry for ip with MAC mac.
func hasNeigh(ns []netlink.Neigh, ip netip.Addr, mac net.HardwareAddr) bool {
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == mac.String() {
			return true
		}
	}
	return false
}

// hostRoute is the route to the zone's underlay address through the host
// end, marked as ours.
func hostRouteTo(hl netlink.Link, underlay netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: hl.Attrs().Index, Dst: &net.IPNet{IP: underlay.AsSlice(), Mask: net.CIDRMask(128, 128)}, Protocol: RouteProtocol}
}

// defaultRoute is the zone's default route: via the host end's fe80::1,
// marked as ours.
func defaultRoute(zl netlink.Link) *netlink.Route {
	return &netlink.Route{LinkIndex: zl.Attrs().Index, Gw: hostLinkLocal.Addr().AsSlice(), Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Protocol: RouteProtocol}
}

// hasRoute reports whether rs holds a route to want's destination through
// want's link and gateway. (Of any protocol: a zone adopted from an earlier
// version keeps its unmarked routes, which ours recognises.)
func hasRoute(rs []netlink.Route, want *netlink.Route) bool {
	wdst := toPrefix(want.Dst)
	return slices.ContainsFunc(rs, func(r netlink.Route) bool {
		dst := netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		if r.Dst != nil {
			dst = toPrefix(r.Dst)
		}
		return dst == wdst && r.LinkIndex == want.LinkIndex && r.Gw.Equal(want.Gw)
	})
}

func ensureRoute(h *netlink.Handle, l netlink.Link, want *netlink.Route) error {
	rs, err := routes(h, l)
	if err != nil || hasRoute(rs, want) {
		return err
	}
	return replaceRoute(h, l, want)
}

func replaceRoute(h *netlink.Handle, l netlink.Link, want *netlink.Route) error {
	if err := h.RouteReplace(want); err != nil {
		return fmt.Errorf("adding route to %v via %s: %w", want.Dst, l.Attrs().Name, err)
	}
	return nil
}

// syncHostRoute makes want the only /128 route of ours through the host end
// hl: a zone whose underlay address changed leaves no route to its old
// one. A route through hl that is not ours is left alone.
func syncHostRoute(h *netlink.Handle, hl netlink.Link, want *netlink.Route) error {
	rs, err := routes(h, hl)
	if err != nil {
		return err
	}
	if !hasRoute(rs, want) {
		if err := addHostRoute(h, hl, want); err != nil {
			return err
		}
	}
	ourLink := func(index int) bool { return index == hl.Attrs().Index }
	for _, r := range rs {
		if r.Dst == nil || toPrefix(r.Dst).Bits() != 128 || hasRoute([]netlink.Route{r}, want) || !ours(&r, ourLink) {
			continue
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("deleting stale route to %v via %s: %w", r.Dst, hl.Attrs().Name, err)
		}
	}
	return nil
}

// addHostRoute adds want, the route to a zone's underlay address through
// its host end hl. A route to that address already there is replaced if it
// is ours (a zone that held the address before, or this zone's own from an
// earlier version), and otherwise refused with ErrForeignRoute: one may
// have appeared since checkHostRoute looked.
func addHostRoute(h *netlink.Handle, hl netlink.Link, want *netlink.Route) error {
	err := h.RouteAdd(want) // NLM_F_EXCL: never replaces
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding route to %v via %s: %w", want.Dst, hl.Attrs().Name, err)
	}
	r, err := foreignRoute(h, toPrefix(want.Dst).Addr(), func(index int) bool { return index == hl.Attrs().Index })
	if err != nil {
		return err
	}
	if r != nil {
		return fmt.Errorf("%s; left alone: %w", describeRoute(h, r), ErrForeignRoute)
	}
	return replaceRoute(h, hl, want)
}
