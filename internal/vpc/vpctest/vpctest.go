// Package vpctest gives tests of the VPC data path stand-in guests: network
// namespaces set up as a guest that took OPTE's DHCP answer would be.
package vpctest

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
)

// Gateway is the VPC subnet gateway the stand-in guests route through
// (172.30.0.0/22's first address, as upstream gives it).
const Gateway = "172.30.0.1"

// ConfigureGuest gives the stand-in guest in the network namespace at path
// what OPTE's DHCP would: its address addr as a /32 on eth0, a route to
// Gateway and a default route through it (the gateway's MAC it finds by
// ARP, which the data path answers); and turns eth0's offloads off, as a
// QEMU tap's frames are whole.
func ConfigureGuest(t testing.TB, path, addr string) {
	t.Helper()
	gw := net.ParseIP(Gateway)
	OnLink(t, path, "eth0", func(h *netlink.Handle, eth0 netlink.Link) error {
		return errors.Join(
			h.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(addr), Mask: net.CIDRMask(32, 32)}}),
			h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}),
			h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw}),
			netio.DisableOffloads(path, "eth0"))
	})
}

// OnLink runs f on the link called name in the network namespace at path,
// with a netlink handle in that namespace; the test fails if the link is
// not there or f fails.
func OnLink(t testing.TB, path, name string, f func(h *netlink.Handle, l netlink.Link) error) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err == nil {
		err = f(h, l)
	}
	if err != nil {
		t.Fatalf("link %s in %s: %v", name, path, err)
	}
}

// ListenUDP is a UDP socket on addr (ip:port) inside the network namespace
// at path, closed when the test ends.
func ListenUDP(t testing.TB, path, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := zonenet.RunInPath(path, func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Answer answers every datagram c receives with what answer makes of it,
// until c is closed: an echo server inside a guest's namespace.
func Answer(c *net.UDPConn, answer func(from netip.AddrPort, got []byte) []byte) {
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(answer(from, buf[:n]), from)
		}
	}()
}

// Echo answers every datagram c receives with prefix and the datagram.
func Echo(c *net.UDPConn, prefix string) {
	Answer(c, func(_ netip.AddrPort, got []byte) []byte { return append([]byte(prefix), got...) })
}
