package zonenet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Ensure makes the zone's plumbing match c, creating whatever is missing and
// fixing whatever is wrong. It may be called again with the same c at any
// time, including after it failed or the process died part-way through.
func Ensure(ctx context.Context, c Config) error {
	p, err := EnsureStarted(ctx, c)
	if err != nil {
		return err
	}
	return p.Wait(ctx)
}

// EnsureStarted is Ensure up to the wait for the kernel to finish what it
// does in the background (see WaitLive): every part exists and is set up
// when it returns, and Pending.Wait waits for the underlay pair to carry
// traffic. A zone's service can be started in between, as a process
// started beside the wait is: its start then overlaps the kernel's work
// instead of following it.
func EnsureStarted(ctx context.Context, c Config) (*Pending, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	p, err := ensure(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("zonenet: ensuring %s: %w", c.Netns, err)
	}
	return p, nil
}

// Pending is a zone's plumbing that EnsureStarted made, until its underlay
// pair carries traffic. Wait or Close it, once.
type Pending struct {
	s        *session
	hl, zl   netlink.Link
	underlay netip.Addr
	netns    string
}

// Wait waits, until ctx ends, for the underlay pair to carry traffic, and
// releases what p holds. A zone without an underlay pair has nothing to
// wait for.
func (p *Pending) Wait(ctx context.Context) error {
	defer p.s.close()
	if p.hl == nil {
		return nil
	}
	if err := p.s.waitLive(ctx, p.hl, p.zl, p.underlay); err != nil {
		return fmt.Errorf("zonenet: ensuring %s: %w", p.netns, err)
	}
	return nil
}

// Close releases what p holds, without waiting.
func (p *Pending) Close() { p.s.close() }

func ensure(ctx context.Context, c Config) (_ *Pending, err error) {
	up, np := pairs(c.Tag, c.ZoneID)
	// Before anything is made: a route to the zone's address that is not
	// ours leads somewhere else (another host's address, a service's), and
	// the zone must not take its traffic.
	if c.Underlay.IsValid() {
		if err := checkHostRoute(ctx, c.Underlay, up); err != nil {
			return nil, err
		}
	}
	fresh, err := createNetns(c.Netns)
	if err != nil {
		return nil, err
	}
	s, err := openSession(ctx, c.Netns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.zone == nil {
		return nil, fmt.Errorf("namespace %s vanished while being set up", c.Netns)
	}
	s.fresh = fresh
	// Every namespace's loopback has index 1 (the kernel's
	// LOOPBACK_IFINDEX): set it up without looking it up. Setting up a link
	// that is up already changes nothing.
	if err := s.zone.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex, Name: "lo"}}); err != nil {
		return nil, fmt.Errorf("setting lo up: %w", err)
	}

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !c.Underlay.IsValid() {
		// Only a NIC (a probe's zone): no underlay pair to make or wait for.
		if err := s.ensureNIC(c, np); err != nil {
			return nil, err
		}
		return &Pending{s: s, netns: c.Netns}, nil
	}
	hl, zl, created, err := s.ensurePair(up, nil)
	if err != nil {
		return nil, err
	}
	zoneAddr := func() error { return syncAddrs(s.zone, zl, []netip.Prefix{underlayPrefix(c.Underlay)}) }
	hostRoute := func() error { return syncHostRoute(s.host, hl, hostRouteTo(hl, c.Underlay)) }
	zoneRoute := func() error { return ensureRoute(s.zone, zl, defaultRoute(zl)) }
	if created {
		// A pair made just now has no addresses or routes to check or
		// clean up: add what it needs without listing anything (the
		// host's routing table grows with every zone).
		zoneAddr = func() error { return addAddr(s.zone, zl, underlayPrefix(c.Underlay)) }
		hostRoute = func() error { return addHostRoute(s.host, hl, hostRouteTo(hl, c.Underlay)) }
		zoneRoute = func() error { return replaceRoute(s.zone, zl, defaultRoute(zl)) }
	}
	for _, step := range []func() error{
		func() error { return setUp(s.zone, zl) },
		zoneAddr,
		func() error { return setUp(s.host, hl) },
		func() error { return ForwardFrom(hl.Attrs().Name) },
		func() error { return addAddr(s.host, hl, hostLinkLocal) },
		func() error {
			if !c.GZ.IsValid() {
				return nil
			}
			return addAddr(s.host, hl, netip.PrefixFrom(c.GZ, 64))
		},
		hostRoute,
		zoneRoute,
		// Each end knows the other's MAC for good: nothing between the
		// host and its zones waits on neighbour discovery, and no
		// neighbour entry of a zone is ever collected (the host's table
		// holds one per zone, and collects above 512 by default).
		func() error { return setNeigh(s.host, hl, c.Underlay, zl.Attrs().HardwareAddr) },
		func() error { return setNeigh(s.zone, zl, hostLinkLocal.Addr(), hl.Attrs().HardwareAddr) },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.ensureNIC(c, np); err != nil {
		return nil, err
	}
	return &Pending{s: s, hl: hl, zl: zl, underlay: c.Underlay, netns: c.Netns}, nil
}

// ensureNIC makes the zone's NIC pair match c.NIC, or removes it if c has
// none.
func (s *session) ensureNIC(c Config, np pair) error {
	if c.NIC == nil {
		// A NIC pair is there only if its host end is (a veth's ends go
		// together): look for that without the RTNL lock first.
		if index, _, err := hostLinkMark(s.host, np.host); err != nil || index == 0 {
			return err
		}
		return s.removePair(np)
	}
	hl, zl, _, err := s.ensurePair(np, c.NIC.MAC)
	if err != nil {
		return err
	}
	if mac := c.NIC.MAC; mac != nil && zl.Attrs().HardwareAddr.String() != mac.String() {
		if err := s.zone.LinkSetDown(zl); err != nil {
			return fmt.Errorf("setting %s down to change its MAC: %w", np.zone, err)
		}
		if err := s.zone.LinkSetHardwareAddr(zl, mac); err != nil {
			return fmt.Errorf("setting the MAC of %s: %w", np.zone, err)
		}
		zl.Attrs().Flags &^= net.FlagUp // so that setUp below sets it up again
	}
	if err := setUp(s.zone, zl); err != nil {
		return err
	}
	if err := syncAddrs(s.zone, zl, c.NIC.Addrs); err != nil {
		return err
	}
	if gw := c.NIC.Gateway; gw.IsValid() {
		if err := s.gatewayRoutes(zl, gw); err != nil {
			return err
		}
	}
	return setUp(s.host, hl)
}

// gatewayRoutes gives the zone's NIC zl OPTE's routes: the gateway on the
// link, the default IPv4 route through it; and turns its transmit offloads
// off (DisableOffloads).
func (s *session) gatewayRoutes(zl netlink.Link, gw netip.Addr) error {
	on := &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(32, 32)}
	for _, r := range []*netlink.Route{
		{LinkIndex: zl.Attrs().Index, Dst: on, Scope: netlink.SCOPE_LINK},
		{LinkIndex: zl.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw.AsSlice()},
	} {
		if err := s.zone.RouteReplace(r); err != nil {
			return fmt.Errorf("route %v via %v on %s: %w", r.Dst, r.Gw, zl.Attrs().Name, err)
		}
	}
	errc := make(chan error, 1)
	go inNamespace(func() error {
		if err := netns.Set(s.ns); err != nil {
			return err
		}
		return DisableOffloads("", zl.Attrs().Name)
	}, errc)
	return <-errc
}

// removePair deletes p's host end (and so its zone end) if it is ours, and a
// zone end left without it.
func (s *session) removePair(p pair) error {
	hl, zl, err := s.look(p)
	if err != nil {
		return err
	}
	if hl == nil {
		if zl != nil {
			return delLink(s.zone, zl)
		}
		return nil
	}
	ok, err := s.owns(hl, zl, p)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s has alias %q, want %q; left alone: %w", p.host, hl.Attrs().Alias, p.alias, ErrNotOwned)
	}
	return delLink(s.host, hl)
}

// Remove deletes the zone's host links (each takes its peer with it) and its
// namespace (unmounted with MNT_DETACH, file deleted, as `ip netns delete`
// does). Missing parts are not errors. A link with the zone's name that is
// not provably ours is left alone and reported with ErrNotOwned.
func Remove(ctx context.Context, netnsName, tag, zoneID string) error {
	for _, err := range []error{validNetns(netnsName), validTag(tag), validZoneID(zoneID)} {
		if err != nil {
			return err
		}
	}
	var errs []error
	up, np := pairs(tag, zoneID)
	left, err := removeMarked(ctx, []pair{up, np})
	if err != nil {
		return fmt.Errorf("zonenet: removing %s: %w", netnsName, err)
	}
	if len(left) > 0 {
		// A link without our alias is ours only if its peer is the zone
		// end in this zone's namespace: that takes a look inside.
		s, err := openSession(ctx, netnsName)
		if err != nil {
			return fmt.Errorf("zonenet: removing %s: %w", netnsName, err)
		}
		for _, p := range left {
			if err := s.removePair(p); err != nil {
				errs = append(errs, err)
			}
		}
		s.close()
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	} else if err := removeNetns(netnsName); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("zonenet: removing %s: %w", netnsName, err)
	}
	return nil
}

// RemoveLinks deletes the zone's host links that carry its mark (each takes
// its peer with it) and touches no namespace: it is for links whose zone's
// namespace is not known by name. A link with the zone's name but without
// the mark is left alone, since only its peer's place in the zone's
// namespace could prove it ours. Missing links are not errors.
func RemoveLinks(ctx context.Context, tag, zoneID string) error {
	for _, err := range []error{validTag(tag), validZoneID(zoneID)} {
		if err != nil {
			return err
		}
	}
	up, np := pairs(tag, zoneID)
	if _, err := removeMarked(ctx, []pair{up, np}); err != nil {
		return fmt.Errorf("zonenet: removing the links of zone %s: %w", zoneID, err)
	}
	return nil
}

// removeMarked deletes the host links of pairs that carry their alias (the
// pair goes with them), using only the host's namespace; it returns the
// pairs whose host link exists without that alias, for the careful path.
func removeMarked(ctx context.Context, ps []pair) (left []pair, err error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	timeout := maxCallTime
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	if err := h.SetSocketTimeout(timeout); err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	for _, p := range ps {
		index, alias, err := hostLinkMark(h, p.host)
		switch {
		case err != nil:
			return nil, err
		case index == 0:
		case alias == p.alias:
			if err := delLink(h, &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index, Name: p.host}}); err != nil {
				return nil, err
			}
		default:
			left = append(left, p)
		}
	}
	return left, nil
}

// ForwardFrom lets the host forward IPv6 packets that arrive on its end of
// a zone's underlay pair (net.ipv6.conf.<link>.force_forwarding, Linux
// 6.17), so that zones on this host reach each other (an internal NTP zone
// its boundary NTP zone) without the host's own forwarding setting, which
// is left alone. On older kernels there is no such setting: zone-to-zone
// traffic then needs the host to forward IPv6.
//
// Turning it on for a new link takes the kernel's RTNL lock by trylock,
// restarting the write until it is free: while many zones are made at
// once, each write spins for as long as the lock is busy (about 0.5 ms
// of CPU per zone with 200 at once on two cores). It is part of what a
// zone costs, and the zone benchmark's floor pays it too.
func ForwardFrom(link string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+link+"/force_forwarding", []byte("1"), 0o644)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("forwarding from %s: %w", link, err)
	}
	return nil
}
