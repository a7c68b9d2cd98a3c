package zonenet

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Parts says which parts of a zone's plumbing exist and are right.
type Parts struct {
	Netns        bool // the namespace is mounted at NetnsPath
	Loopback     bool // lo is up in it
	UnderlayLink bool // both underlay ends exist, paired, marked, up
	UnderlayAddr bool // underlay0 holds exactly <Underlay>/128; the host end fe80::1/64
	Route        bool // host route <Underlay>/128 and the zone's default via fe80::1
	Neighbours   bool // permanent neighbour entries: <Underlay> on the host end, fe80::1 on underlay0
	NICLink      bool // both NIC ends exist, paired, marked, up, MAC right; or, with no NIC, no NIC link
	NICAddrs     bool // opte0 holds exactly the NIC's addresses (true with no NIC)
}

// Complete reports whether every part is right.
func (p Parts) Complete() bool { return p == Parts{true, true, true, true, true, true, true, true} }

// String names the parts that are missing or wrong.
func (p Parts) String() string {
	if p.Complete() {
		return "complete"
	}
	var bad []string
	for _, f := range []struct {
		ok   bool
		name string
	}{{p.Netns, "netns"}, {p.Loopback, "loopback"}, {p.UnderlayLink, "underlay link"}, {p.UnderlayAddr, "underlay address"},
		{p.Route, "routes"}, {p.Neighbours, "neighbour entries"}, {p.NICLink, "NIC link"}, {p.NICAddrs, "NIC addresses"}} {
		if !f.ok {
			bad = append(bad, f.name)
		}
	}
	return "missing or wrong: " + strings.Join(bad, ", ")
}

// Inspect reports which parts of c's plumbing exist and are right. It changes
// nothing; an error means it could not look, not that something is missing.
func Inspect(c Config) (Parts, error) {
	if err := c.validate(); err != nil {
		return Parts{}, err
	}
	p, err := inspect(c, nil)
	if err != nil {
		return Parts{}, fmt.Errorf("zonenet: inspecting %s: %w", c.Netns, err)
	}
	return p, nil
}

// inspect is Inspect, with the host's side from view if it is not nil.
func inspect(c Config, view *hostView) (Parts, error) {
	var p Parts
	s, err := openSession(context.Background(), c.Netns)
	if err != nil {
		return p, err
	}
	defer s.close()
	s.view = view
	p.Netns = s.zone != nil
	if s.zone != nil {
		lo, err := linkByName(s.zone, "lo")
		if err != nil {
			return p, err
		}
		p.Loopback = isUp(lo)
	}
	if err := s.inspectUnderlay(c, &p); err != nil {
		return p, err
	}
	return p, s.inspectNIC(c, &p)
}

func (s *session) inspectUnderlay(c Config, p *Parts) error {
	up, _ := pairs(c.Tag, c.ZoneID)
	hl, zl, err := s.look(up)
	if err != nil {
		return err
	}
	if p.UnderlayLink, err = s.good(hl, zl, up); err != nil || !p.UnderlayLink {
		return err
	}
	zg, _, err := addrs(s.zone, zl)
	if err != nil {
		return err
	}
	_, hlocal, err := s.hostAddrs(hl)
	if err != nil {
		return err
	}
	p.UnderlayAddr = sameSet(zg, []netip.Prefix{underlayPrefix(c.Underlay)}) &&
		slices.Contains(hlocal, hostLinkLocal)
	hr, err := s.hostRoutes(hl)
	if err != nil {
		return err
	}
	zr, err := routes(s.zone, zl)
	if err != nil {
		return err
	}
	p.Route = hasRoute(hr, hostRouteTo(hl, c.Underlay)) && hasRoute(zr, defaultRoute(zl))
	hn, err := s.hostNeighbours(hl)
	if err != nil {
		return err
	}
	zn, err := neighbours(s.zone, zl)
	if err != nil {
		return err
	}
	p.Neighbours = hasNeigh(hn, c.Underlay, zl.Attrs().HardwareAddr) && hasNeigh(zn, hostLinkLocal.Addr(), hl.Attrs().HardwareAddr)
	return nil
}

func (s *session) inspectNIC(c Config, p *Parts) error {
	_, np := pairs(c.Tag, c.ZoneID)
	hl, zl, err := s.look(np)
	if err != nil {
		return err
	}
	if c.NIC == nil {
		p.NICLink, p.NICAddrs = hl == nil && zl == nil, true
		return nil
	}
	if p.NICLink, err = s.good(hl, zl, np); err != nil || !p.NICLink {
		return err
	}
	if mac := c.NIC.MAC; mac != nil {
		p.NICLink = zl.Attrs().HardwareAddr.String() == mac.String()
	}
	ng, _, err := addrs(s.zone, zl)
	if err != nil {
		return err
	}
	p.NICAddrs = sameSet(ng, c.NIC.Addrs)
	return nil
}

// good reports whether p's ends exist, are paired, marked as ours and up.
func (s *session) good(hl, zl netlink.Link, p pair) (bool, error) {
	if hl == nil || zl == nil || hl.Attrs().Alias != p.alias || !isUp(hl) || !isUp(zl) {
		return false, nil
	}
	return s.paired(hl, zl)
}

// List returns the namespaces in /run/netns whose names start with
// netnsPrefix ("" for all) and the host links whose alias marks them as
// tag's.
func List(netnsPrefix, tag string) (namespaces []string, links []Link, err error) {
	if err := validNetnsPrefix(netnsPrefix); err != nil {
		return nil, nil, err
	}
	if err := validTag(tag); err != nil {
		return nil, nil, err
	}
	if namespaces, err = listNetns(netnsPrefix); err != nil {
		return nil, nil, fmt.Errorf("zonenet: listing namespaces: %w", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, fmt.Errorf("zonenet: netlink: %w", err)
	}
	defer h.Close()
	if err := h.SetSocketTimeout(maxCallTime); err != nil {
		return nil, nil, fmt.Errorf("zonenet: netlink: %w", err)
	}
	all, err := dump(h.LinkList)
	if err != nil {
		return nil, nil, fmt.Errorf("zonenet: listing links: %w", err)
	}
	for _, l := range all {
		if t, id, role, ok := parseAlias(l.Attrs().Alias); ok && t == tag {
			links = append(links, Link{Name: l.Attrs().Name, ZoneID: id, Role: role})
		}
	}
	return namespaces, links, nil
}
