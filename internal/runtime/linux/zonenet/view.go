package zonenet

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Inspector inspects many zones at once, as a listing of every zone does.
// Looking at one zone's host side asks the kernel for the host's addresses,
// routes and neighbours, and the kernel answers with all of them: every zone
// adds to each answer, so inspecting N zones one by one grows as N². An
// Inspector takes the host's links, addresses, routes and neighbours once,
// and checks each zone's host side against that. A zone that looks incomplete is looked at again
// on its own, so what was made after the Inspector's look is never reported
// missing.
type Inspector struct {
	view hostView
}

// hostView is the host's links, and their addresses, IPv6 routes and IPv6
// neighbours, at one moment.
type hostView struct {
	links  map[string]netlink.Link
	addrs  map[int][]netlink.Addr
	routes map[int][]netlink.Route
	neighs map[int][]netlink.Neigh
}

// NewInspector takes its look at the host.
func NewInspector() (*Inspector, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("zonenet: netlink: %w", err)
	}
	defer h.Close()
	if err := h.SetSocketTimeout(maxCallTime); err != nil {
		return nil, fmt.Errorf("zonenet: netlink: %w", err)
	}
	v := hostView{links: map[string]netlink.Link{}, addrs: map[int][]netlink.Addr{}, routes: map[int][]netlink.Route{}, neighs: map[int][]netlink.Neigh{}}
	links, err := dump(h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("zonenet: listing links: %w", err)
	}
	for _, l := range links {
		v.links[l.Attrs().Name] = l
	}
	addrs, err := dump(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("zonenet: listing addresses: %w", err)
	}
	for _, a := range addrs {
		v.addrs[a.LinkIndex] = append(v.addrs[a.LinkIndex], a)
	}
	routes, err := dump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V6) })
	if err != nil {
		return nil, fmt.Errorf("zonenet: listing routes: %w", err)
	}
	for _, r := range routes {
		v.routes[r.LinkIndex] = append(v.routes[r.LinkIndex], r)
	}
	neighs, err := dump(func() ([]netlink.Neigh, error) { return h.NeighList(0, netlink.FAMILY_V6) })
	if err != nil {
		return nil, fmt.Errorf("zonenet: listing neighbours: %w", err)
	}
	for _, n := range neighs {
		v.neighs[n.LinkIndex] = append(v.neighs[n.LinkIndex], n)
	}
	return &Inspector{view: v}, nil
}

// Inspect is Inspect(c), with the host's side as the Inspector saw it.
func (in *Inspector) Inspect(c Config) (Parts, error) {
	if err := c.validate(); err != nil {
		return Parts{}, err
	}
	p, err := inspect(c, &in.view)
	if err == nil && p.Complete() {
		return p, nil
	}
	return Inspect(c)
}
