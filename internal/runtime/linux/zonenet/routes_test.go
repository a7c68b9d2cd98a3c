package zonenet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostNetns makes a namespace that stands for the host in a test: routes
// and links made in it touch no one else's, and go with it. Removed when
// the test ends (env's cleanup also finds it by its prefix).
func (e *env) hostNetns(t *testing.T) string {
	t.Helper()
	name := e.prefix + "host"
	if _, err := createNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNetns(name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return name
}

// inHost runs f with a netlink handle in the test's host namespace, on a
// thread in it (so that zonenet's own handles are made there too).
func inHost(t *testing.T, host string, f func(h *netlink.Handle) error) {
	t.Helper()
	if _, err := inNetns(host, func() (struct{}, error) {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return struct{}{}, err
		}
		defer h.Close()
		return struct{}{}, f(h)
	}); err != nil {
		t.Fatal(err)
	}
}

// ensureIn is Ensure on a thread in the host namespace.
func ensureIn(host string, c Config) error {
	_, err := inNetns(host, func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return struct{}{}, Ensure(ctx, c)
	})
	return err
}

// addLink makes an up link called name in h's namespace: a veth, whose
// peer (name+"p") stays beside it (the kernel may lack the dummy driver).
func addLink(h *netlink.Handle, name string) (netlink.Link, error) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := h.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("adding %s: %w", name, err)
	}
	for _, n := range []string{name + "p", name} {
		l, err := h.LinkByName(n)
		if err != nil {
			return nil, err
		}
		if err := h.LinkSetUp(l); err != nil {
			return nil, err
		}
	}
	return h.LinkByName(name)
}

// routesTo lists the routes of every table to exactly a/128.
func routesTo(h *netlink.Handle, a netip.Addr) ([]netlink.Route, error) {
	all, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var rs []netlink.Route
	for _, r := range all {
		if r.Dst != nil && toPrefix(r.Dst) == netip.PrefixFrom(a, 128) {
			rs = append(rs, r)
		}
	}
	return rs, nil
}

func host128(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)}
}

// A route to the zone's address that the runtime did not make leads
// somewhere else: Ensure refuses the zone, naming the route, and changes
// nothing, the route least of all.
func TestEnsureLeavesAForeignRouteAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		// add makes the foreign route to a through d, a link of the host.
		add  func(h *netlink.Handle, d netlink.Link, a netip.Addr) error
		says string
	}{
		{"through another link", func(h *netlink.Handle, d netlink.Link, a netip.Addr) error {
			return h.RouteAdd(&netlink.Route{LinkIndex: d.Attrs().Index, Dst: host128(a)}) // proto boot, as `ip route add`
		}, "route to %s/128 dev %s proto 3 table 254"},
		{"of a routing daemon, with a gateway", func(h *netlink.Handle, d netlink.Link, a netip.Addr) error {
			return h.RouteAdd(&netlink.Route{LinkIndex: d.Attrs().Index, Dst: host128(a), Gw: net.ParseIP("fe80::99"), Protocol: 186})
		}, "route to %s/128 via fe80::99 dev %s proto 186"},
		{"a host's own address", func(h *netlink.Handle, d netlink.Link, a netip.Addr) error {
			return h.AddrAdd(d, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
		}, "local route to %s/128 dev %s"},
		{"unreachable", func(h *netlink.Handle, _ netlink.Link, a netip.Addr) error {
			return h.RouteAdd(&netlink.Route{Dst: host128(a), Type: unix.RTN_UNREACHABLE})
		}, "unreachable route to %s/128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			host := e.hostNetns(t)
			c := e.config(false)
			dummy := e.tag + "d"
			var before []netlink.Route
			inHost(t, host, func(h *netlink.Handle) error {
				d, err := addLink(h, dummy)
				if err != nil {
					return err
				}
				if err := tc.add(h, d, c.Underlay); err != nil {
					return err
				}
				// The kernel adds a local route in work of its own.
				for deadline := time.Now().Add(5 * time.Second); len(before) == 0; time.Sleep(10 * time.Millisecond) {
					if before, err = routesTo(h, c.Underlay); err != nil {
						return err
					}
					if time.Now().After(deadline) {
						return errors.New("no route to the zone's address was made")
					}
				}
				return nil
			})

			err := ensureIn(host, c)
			if !errors.Is(err, ErrForeignRoute) {
				t.Fatalf("Ensure = %v, want ErrForeignRoute", err)
			}
			want := tc.says
			if strings.Count(want, "%s") == 2 {
				want = fmt.Sprintf(want, c.Underlay, dummy)
			} else {
				want = fmt.Sprintf(want, c.Underlay)
			}
			t.Logf("Ensure: %v", err)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Ensure = %v, want it to name the %s", err, want)
			}

			inHost(t, host, func(h *netlink.Handle) error {
				after, err := routesTo(h, c.Underlay)
				if err != nil {
					return err
				}
				if fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("routes to %s: %v, were %v", c.Underlay, after, before)
				}
				un, _ := LinkNames(c.Tag, c.ZoneID)
				if _, err := h.LinkByName(un); err == nil {
					t.Errorf("host link %s made for a refused zone", un)
				}
				return nil
			})
			if _, err := os.Stat(NetnsPath(c.Netns)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("namespace %s of a refused zone: %v", c.Netns, err)
			}
		})
	}
}

// Routes the runtime makes carry its mark; a zone made by an earlier
// version, whose routes lack it, is adopted; and a route through the zone's
// host link that the runtime did not make survives the zone's address
// changing, as its own old route does not.
func TestEnsureMarksItsRoutesAndAdoptsUnmarkedOnes(t *testing.T) {
	e := newEnv(t)
	host := e.hostNetns(t)
	c := e.config(false)
	if err := ensureIn(host, c); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	un, _ := LinkNames(c.Tag, c.ZoneID)
	other := c.Underlay.Next()
	inHost(t, host, func(h *netlink.Handle) error {
		rs, err := routesTo(h, c.Underlay)
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Protocol != RouteProtocol {
			t.Fatalf("routes to %s: %v, want one with protocol %d", c.Underlay, rs, RouteProtocol)
		}
		// As an earlier version left it: the same route, unmarked. And a
		// route through the link that someone else added.
		r := rs[0]
		r.Protocol = unix.RTPROT_BOOT
		if err := h.RouteReplace(&r); err != nil {
			return err
		}
		hl, err := h.LinkByName(un)
		if err != nil {
			return err
		}
		return h.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Dst: host128(other), Protocol: unix.RTPROT_STATIC})
	})
	if err := ensureIn(host, c); err != nil {
		t.Fatalf("Ensure of a zone with an unmarked route of its own: %v", err)
	}
	moved := c
	moved.Underlay = other.Next()
	if err := ensureIn(host, moved); err != nil {
		t.Fatalf("Ensure at a new address: %v", err)
	}
	inHost(t, host, func(h *netlink.Handle) error {
		if rs, err := routesTo(h, c.Underlay); err != nil || len(rs) != 0 {
			t.Errorf("routes to the old address %s: %v, %v; want none", c.Underlay, rs, err)
		}
		if rs, err := routesTo(h, other); err != nil || len(rs) != 1 || rs[0].Protocol != unix.RTPROT_STATIC {
			t.Errorf("routes to %s: %v, %v; want the static one left alone", other, rs, err)
		}
		if rs, err := routesTo(h, moved.Underlay); err != nil || len(rs) != 1 || rs[0].Protocol != RouteProtocol {
			t.Errorf("routes to %s: %v, %v; want one of ours", moved.Underlay, rs, err)
		}
		return nil
	})
}

// What the look for a foreign route adds to every Ensure: a netlink socket
// and one route lookup (read only: it changes nothing on the host).
func BenchmarkCheckHostRoute(b *testing.B) {
	p, _ := pairs("zb000000", "7f1ee3f6-0c9f-4d8e-9f3a-2b8f6a1c0d11")
	addr := netip.MustParseAddr("fd00:1122:3344:3ff::99")
	for b.Loop() {
		if err := checkHostRoute(context.Background(), addr, p); err != nil {
			b.Fatal(err)
		}
	}
}
