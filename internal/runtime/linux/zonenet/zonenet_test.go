package zonenet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and links")
	}
}

// env is one test's private world: everything it creates carries its tag or
// its namespace prefix, and its cleanup removes all of that, pass or fail.
type env struct {
	tag, prefix string
	extraLinks  []string // links without the tag's mark that the test makes
}

// subnets hands each zone of the whole run its own underlay /64, so tests
// running in parallel never route to each other's addresses.
var subnets atomic.Uint32

func newEnv(t *testing.T) *env {
	t.Helper()
	needRoot(t)
	t.Parallel()
	b := make([]byte, 3)
	rand.Read(b)
	e := &env{tag: "zt" + hex.EncodeToString(b)}
	e.prefix = e.tag + "-"
	t.Cleanup(func() { e.cleanup(t) }) // before anything is created
	return e
}

func (e *env) cleanup(t *testing.T) {
	h, err := netlink.NewHandle()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer h.Close()
	namespaces, links, err := List(e.prefix, e.tag)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	names := e.extraLinks
	for _, l := range links {
		names = append(names, l.Name)
	}
	for _, name := range names {
		if l, err := h.LinkByName(name); err == nil {
			if err := h.LinkDel(l); err != nil {
				t.Errorf("cleanup: deleting %s: %v", name, err)
			}
		}
	}
	for _, ns := range namespaces {
		if err := removeNetns(ns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// config returns a zone config of this env with its own underlay /64 and, if
// nic, a NIC with a v4 and a v6 address and a fixed MAC.
func (e *env) config(nic bool) Config {
	id := uuid.NewString()
	n := subnets.Add(1)%250 + 1
	// fd00:1122:3344:3xx::/64 is this package's: tests of other packages
	// make zones at fd00:1122:3344:1xx:: at the same time, and two host
	// routes to one address replace each other.
	c := Config{
		Netns:    e.prefix + "oxz_test_" + id,
		Tag:      e.tag,
		ZoneID:   id,
		Underlay: netip.MustParseAddr(fmt.Sprintf("fd00:1122:3344:3%02x::%x", n, n+1)),
	}
	if nic {
		c.NIC = &NIC{
			Addrs: []netip.Prefix{netip.MustParsePrefix("172.30.2.9/24"), netip.MustParsePrefix("fd77:e9d2:9cd9:2::9/64")},
			MAC:   net.HardwareAddr{0x02, 0x08, 0x20, 0x01, 0x02, byte(n)},
		}
	}
	return c
}

func mustEnsure(t *testing.T, c Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, c); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
}

func wantComplete(t *testing.T, c Config) {
	t.Helper()
	p, err := Inspect(c)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !p.Complete() {
		t.Fatalf("Inspect: %v (%+v)", p, p)
	}
}

func hostLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if _, ok := errors.AsType[netlink.LinkNotFoundError](err); ok {
		return nil
	}
	if err != nil {
		t.Fatalf("LinkByName(%s): %v", name, err)
	}
	return l
}

// inNetns runs f on a thread that has entered the namespace and that dies
// afterwards: the goroutine locks it and never unlocks it.
func inNetns[T any](name string, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		ns, err := netns.GetFromPath(NetnsPath(name))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		v, err := f()
		ch <- result{v, err}
	}()
	r := <-ch
	if r.err != nil {
		return r.v, fmt.Errorf("in namespace %s: %w", name, r.err)
	}
	return r.v, nil
}

func TestLinkNames(t *testing.T) {
	id := "7f1ee3f6-0c9f-4d8e-9f3a-2b8f6a1c0d11"
	u, n := LinkNames("sled-agent", id)
	u2, n2 := LinkNames("sled-agent", "7F1EE3F6-0C9F-4D8E-9F3A-2B8F6A1C0D11")
	if len(u) > 15 || len(n) > 15 || u[:3] != "ozu" || n[:3] != "ozn" || u[3:] != n[3:] {
		t.Errorf("LinkNames = %q, %q", u, n)
	}
	if u != u2 || n != n2 {
		t.Errorf("LinkNames depends on the UUID's letter case: %q vs %q", u, u2)
	}
	if o, _ := LinkNames("other", id); o == u {
		t.Errorf("LinkNames ignores the tag")
	}
	if tag, zid, role, ok := parseAlias(alias("sled-agent", id, RoleNIC)); !ok || tag != "sled-agent" || zid != id || role != RoleNIC {
		t.Errorf("parseAlias(alias(...)) = %q %q %q %v", tag, zid, role, ok)
	}
	if got := trailingUUID("p-oxz_ntp_" + id); got != id {
		t.Errorf("trailingUUID = %q", got)
	}
}

func TestValidation(t *testing.T) {
	id := "7f1ee3f6-0c9f-4d8e-9f3a-2b8f6a1c0d11"
	good := Config{Netns: "oxz_ntp_" + id, Tag: "sled-agent", ZoneID: id, Underlay: netip.MustParseAddr("fd00:1122:3344:101::5")}
	if err := good.validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"netns empty":      func(c *Config) { c.Netns = "" },
		"netns dot":        func(c *Config) { c.Netns = ".." },
		"netns slash":      func(c *Config) { c.Netns = "a/b" },
		"netns long":       func(c *Config) { c.Netns = strings.Repeat("a", 129) },
		"tag upper":        func(c *Config) { c.Tag = "Sled" },
		"tag long":         func(c *Config) { c.Tag = "abcdefghijklmnopqrstu" },
		"tag colon":        func(c *Config) { c.Tag = "a:b" },
		"zone id":          func(c *Config) { c.ZoneID = "not-a-uuid" },
		"zone id no dash":  func(c *Config) { c.ZoneID = "7f1ee3f60c9f4d8e9f3a2b8f6a1c0d11" },
		"underlay missing": func(c *Config) { c.Underlay = netip.Addr{} },
		"gz without underlay": func(c *Config) {
			c.Underlay, c.GZ = netip.Addr{}, netip.MustParseAddr("fd00:1122:3344:101::2")
			c.NIC = &NIC{Addrs: []netip.Prefix{netip.MustParsePrefix("172.30.2.9/32")}}
		},
		"underlay v4":      func(c *Config) { c.Underlay = netip.MustParseAddr("10.0.0.1") },
		"underlay mapped":  func(c *Config) { c.Underlay = netip.MustParseAddr("::ffff:10.0.0.1") },
		"underlay ll":      func(c *Config) { c.Underlay = netip.MustParseAddr("fe80::5") },
		"nic no addrs":     func(c *Config) { c.NIC = &NIC{} },
		"gz v4":            func(c *Config) { c.GZ = netip.MustParseAddr("10.0.0.2") },
		"gz is the zone's": func(c *Config) { c.GZ = c.Underlay },
		"nic bad mac": func(c *Config) {
			c.NIC = &NIC{Addrs: []netip.Prefix{netip.MustParsePrefix("172.30.2.9/24")}, MAC: net.HardwareAddr{1, 2, 3, 4, 5, 6}}
		},
		"nic dup": func(c *Config) {
			p := netip.MustParsePrefix("172.30.2.9/24")
			c.NIC = &NIC{Addrs: []netip.Prefix{p, p}}
		},
	} {
		c := good
		mod(&c)
		if err := Ensure(t.Context(), c); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Ensure = %v, want ErrInvalid", name, err)
		}
	}
	if err := Remove(t.Context(), "../x", "t", id); !errors.Is(err, ErrInvalid) {
		t.Errorf("Remove with a bad name = %v, want ErrInvalid", err)
	}
}

func TestGlobalZoneAddressLivesWithTheLink(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	c.GZ = netip.PrefixFrom(c.Underlay, 64).Masked().Addr().Next().Next() // <zone /64>::2
	mustEnsure(t, c)
	un, _ := LinkNames(c.Tag, c.ZoneID)
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	have, _, err := addrs(h, hostLink(t, un))
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.PrefixFrom(c.GZ, 64); !slices.Contains(have, want) {
		t.Fatalf("host link %s addresses %v, want %v among them", un, have, want)
	}
	mustEnsure(t, c) // again: no error for an address already there
	if err := Remove(t.Context(), c.Netns, c.Tag, c.ZoneID); err != nil {
		t.Fatal(err)
	}
	all, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		if a.IP.Equal(c.GZ.AsSlice()) {
			t.Fatalf("%v still on the host after the zone was removed", c.GZ)
		}
	}
}

func TestEnsureCreatesEverything(t *testing.T) {
	e := newEnv(t)
	c := e.config(true)
	mustEnsure(t, c)
	wantComplete(t, c)

	if !NetnsExists(c.Netns) || !isNetnsMount("/run/netns/"+c.Netns) {
		t.Errorf("namespace file %s is missing or not a namespace mount", NetnsPath(c.Netns))
	}
	un, nn := LinkNames(c.Tag, c.ZoneID)
	if len(un) > 15 || len(nn) > 15 {
		t.Errorf("link names %q %q longer than 15 bytes", un, nn)
	}
	namespaces, links, err := List(e.prefix, e.tag)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(namespaces, []string{c.Netns}) {
		t.Errorf("List namespaces = %v, want [%s]", namespaces, c.Netns)
	}
	slices.SortFunc(links, func(a, b Link) int { return -strings.Compare(a.Role, b.Role) })
	want := []Link{{un, c.ZoneID, RoleUnderlay}, {nn, c.ZoneID, RoleNIC}}
	if !slices.Equal(links, want) {
		t.Errorf("List links = %v, want %v", links, want)
	}

	// The zone side, seen from inside the namespace.
	type zoneView struct {
		nicMAC             string
		nicAddrs, underlay []netip.Prefix
	}
	v, err := inNetns(c.Netns, func() (zoneView, error) {
		var v zoneView
		h, err := netlink.NewHandle() // opened on this thread: inside the namespace
		if err != nil {
			return v, err
		}
		defer h.Close()
		opte, err := h.LinkByName(NICIfName)
		if err != nil {
			return v, err
		}
		v.nicMAC = opte.Attrs().HardwareAddr.String()
		if v.nicAddrs, _, err = addrs(h, opte); err != nil {
			return v, err
		}
		u, err := h.LinkByName(UnderlayIfName)
		if err != nil {
			return v, err
		}
		v.underlay, _, err = addrs(h, u)
		return v, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v.nicMAC != c.NIC.MAC.String() {
		t.Errorf("opte0 MAC = %s, want %s", v.nicMAC, c.NIC.MAC)
	}
	if !sameSet(v.nicAddrs, c.NIC.Addrs) {
		t.Errorf("opte0 addresses = %v, want %v", v.nicAddrs, c.NIC.Addrs)
	}
	if want := []netip.Prefix{netip.PrefixFrom(c.Underlay, 128)}; !slices.Equal(v.underlay, want) {
		t.Errorf("underlay0 addresses = %v, want %v", v.underlay, want)
	}

	// A second Ensure changes nothing: the same links, not new ones.
	before := [2]int{hostLink(t, un).Attrs().Index, hostLink(t, nn).Attrs().Index}
	mustEnsure(t, c)
	wantComplete(t, c)
	if after := [2]int{hostLink(t, un).Attrs().Index, hostLink(t, nn).Attrs().Index}; after != before {
		t.Errorf("second Ensure recreated links: indexes %v, then %v", before, after)
	}
}

func TestEnsureCompletesPartialState(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, c Config)
	}{
		{"namespace without links", func(t *testing.T, c Config) {
			if _, err := createNetns(c.Netns); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty namespace file, as after a crash before the mount", func(t *testing.T, c Config) {
			if err := prepareNetnsDir(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(NetnsPath(c.Netns), nil, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"host links deleted", func(t *testing.T, c Config) {
			mustEnsure(t, c)
			un, nn := LinkNames(c.Tag, c.ZoneID)
			for _, name := range []string{un, nn} {
				if err := netlink.LinkDel(hostLink(t, name)); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"host link alive but namespace file gone", func(t *testing.T, c Config) {
			mustEnsure(t, c)
			// Something still holds the old namespace, so its links live on.
			old, err := netns.GetFromPath(NetnsPath(c.Netns))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { old.Close() })
			if err := removeNetns(c.Netns); err != nil {
				t.Fatal(err)
			}
			un, _ := LinkNames(c.Tag, c.ZoneID)
			if hostLink(t, un) == nil {
				t.Fatal("host link went with the namespace file; the case is not set up")
			}
		}},
		{"stale pair with the zone end still in the host namespace", func(t *testing.T, c Config) {
			un, _ := LinkNames(c.Tag, c.ZoneID)
			peer := e.tag + "stale"
			e.extraLinks = append(e.extraLinks, peer)
			attrs := netlink.NewLinkAttrs()
			attrs.Name = un
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: peer}); err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetAlias(hostLink(t, un), alias(c.Tag, c.ZoneID, RoleUnderlay)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if hostLink(t, peer) != nil {
					t.Errorf("stale zone end %s still in the host namespace", peer)
				}
			})
		}},
		{"pair made but not yet marked, as after a crash before the alias", func(t *testing.T, c Config) {
			mustEnsure(t, c)
			un, _ := LinkNames(c.Tag, c.ZoneID)
			if err := netlink.LinkSetAlias(hostLink(t, un), ""); err != nil {
				t.Fatal(err)
			}
			if a := hostLink(t, un).Attrs().Alias; a != "" {
				t.Fatalf("alias not cleared: %q", a)
			}
			if p, _ := Inspect(c); p.UnderlayLink {
				t.Fatal("Inspect calls an unmarked link right")
			}
		}},
		{"neighbour entries removed", func(t *testing.T, c Config) {
			mustEnsure(t, c)
			un, _ := LinkNames(c.Tag, c.ZoneID)
			hl := hostLink(t, un)
			if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: hl.Attrs().Index, Family: netlink.FAMILY_V6, IP: c.Underlay.AsSlice()}); err != nil {
				t.Fatal(err)
			}
			if p, _ := Inspect(c); p.Neighbours {
				t.Fatal("Inspect misses the host's lost neighbour entry")
			}
			_, err := inNetns(c.Netns, func() (struct{}, error) {
				u, err := netlink.LinkByName(UnderlayIfName)
				if err != nil {
					return struct{}{}, err
				}
				return struct{}{}, netlink.NeighDel(&netlink.Neigh{LinkIndex: u.Attrs().Index, Family: netlink.FAMILY_V6, IP: hostLinkLocal.Addr().AsSlice()})
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"address, route and NIC removed inside the zone", func(t *testing.T, c Config) {
			mustEnsure(t, c)
			_, nn := LinkNames(c.Tag, c.ZoneID)
			if err := netlink.LinkDel(hostLink(t, nn)); err != nil {
				t.Fatal(err)
			}
			_, err := inNetns(c.Netns, func() (struct{}, error) {
				u, err := netlink.LinkByName(UnderlayIfName)
				if err != nil {
					return struct{}{}, err
				}
				a, _ := netlink.ParseAddr(netip.PrefixFrom(c.Underlay, 128).String())
				if err := netlink.AddrDel(u, a); err != nil {
					return struct{}{}, err
				}
				extra, _ := netlink.ParseAddr("fd00:1122:3344:1ff::99/64")
				return struct{}{}, netlink.AddrAdd(u, extra)
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.config(true)
			tc.break_(t, c)
			if p, err := Inspect(c); err != nil || p.Complete() {
				t.Fatalf("before Ensure: Inspect = %v, %v; want incomplete", p, err)
			}
			mustEnsure(t, c)
			wantComplete(t, c)
			mustEnsure(t, c)
			wantComplete(t, c)
		})
	}
}

// roundTrip connects from the calling thread's namespace to c's underlay
// address, where a listener inside the zone's namespace echoes one line, and
// returns the client address the zone saw.
func roundTrip(ctx context.Context, c Config) (netip.AddrPort, error) {
	var none netip.AddrPort
	l, err := inNetns(c.Netns, func() (net.Listener, error) {
		return net.Listen("tcp6", netip.AddrPortFrom(c.Underlay, 0).String())
	})
	if err != nil {
		return none, err
	}
	defer l.Close()
	seen := make(chan netip.AddrPort, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		seen <- conn.RemoteAddr().(*net.TCPAddr).AddrPort()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		n, _ := conn.Read(buf)
		conn.Write(buf[:n])
	}()
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp6", l.Addr().String())
	if err != nil {
		return none, fmt.Errorf("host → zone %s: %w", l.Addr(), err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		return none, err
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "ping\n" {
		return none, fmt.Errorf("echo = %q, %v", buf[:n], err)
	}
	return <-seen, nil
}

func TestHostToZoneTCP(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	mustEnsure(t, c)
	from, err := roundTrip(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("host → [%v]: the zone saw the connection come from %v", c.Underlay, from.Addr().WithZone(""))
}

// TestHostToZoneTCPWithoutHostGlobalAddress plays the host in a fresh network
// namespace that has no global IPv6 address at all (a locked thread that
// unshared its namespace and dies afterwards), to see which source address
// the host picks for the zone then, and whether the zone can answer it.
func TestHostToZoneTCPWithoutHostGlobalAddress(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	type result struct {
		from netip.AddrPort
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread and its namespace die with us
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		if lo, err := netlink.LinkByName("lo"); err != nil || netlink.LinkSetUp(lo) != nil {
			done <- result{err: fmt.Errorf("lo: %v", err)}
			return
		}
		if err := Ensure(t.Context(), c); err != nil {
			done <- result{err: err}
			return
		}
		if p, err := Inspect(c); err != nil || !p.Complete() {
			done <- result{err: fmt.Errorf("Inspect = %v, %v", p, err)}
			return
		}
		from, err := roundTrip(t.Context(), c)
		done <- result{from, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("host without a global address → [%v]: the zone saw the connection come from %v", c.Underlay, r.from.Addr().WithZone(""))
}

func TestEnsureFollowsChanges(t *testing.T) {
	e := newEnv(t)
	c := e.config(true)
	mustEnsure(t, c)
	un, nn := LinkNames(c.Tag, c.ZoneID)
	old := c.Underlay

	c.Underlay = c.Underlay.Next()
	c.NIC = &NIC{Addrs: []netip.Prefix{netip.MustParsePrefix("172.30.3.10/24")}, MAC: net.HardwareAddr{0x02, 0x08, 0x20, 0xaa, 0xbb, 0xcc}}
	mustEnsure(t, c)
	wantComplete(t, c)
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: hostLink(t, un).Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Dst != nil && toPrefix(r.Dst).Addr() == old {
			t.Errorf("route to the old underlay address %v remains", old)
		}
	}

	c.NIC = nil
	mustEnsure(t, c)
	wantComplete(t, c)
	if hostLink(t, nn) != nil {
		t.Errorf("NIC link %s remains after the NIC left the config", nn)
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t)
	for _, unmarked := range []bool{false, true} {
		t.Run(fmt.Sprintf("unmarked=%v", unmarked), func(t *testing.T) {
			c := e.config(true)
			mustEnsure(t, c)
			un, nn := LinkNames(c.Tag, c.ZoneID)
			if unmarked {
				// As after a crash between making the pair and marking
				// it: its peer in the zone's namespace proves it ours.
				if err := netlink.LinkSetAlias(hostLink(t, un), ""); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 2 { // the second time finds nothing to do
				if err := Remove(t.Context(), c.Netns, c.Tag, c.ZoneID); err != nil {
					t.Fatalf("Remove #%d: %v", i+1, err)
				}
				namespaces, links, err := List(e.prefix, e.tag)
				if err != nil || len(namespaces) != 0 || len(links) != 0 {
					t.Errorf("after Remove #%d: List = %v, %v, %v; want nothing", i+1, namespaces, links, err)
				}
				if hostLink(t, un) != nil || hostLink(t, nn) != nil {
					t.Errorf("after Remove #%d: host links remain", i+1)
				}
				if _, err := os.Lstat(NetnsPath(c.Netns)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("after Remove #%d: %s: %v", i+1, NetnsPath(c.Netns), err)
				}
				if NetnsExists(c.Netns) {
					t.Errorf("after Remove #%d: NetnsExists", i+1)
				}
				if p, err := Inspect(c); err != nil || p.Netns || p.UnderlayLink || p.NICLink {
					t.Errorf("after Remove #%d: Inspect = %+v, %v", i+1, p, err)
				}
			}
		})
	}
}

// A zone without an underlay address (a probe's) is its namespace and its
// NIC alone: OPTE's /32, the route to its gateway and the default route
// through it; Ensure again changes nothing; Remove leaves nothing.
func TestEnsureNICOnly(t *testing.T) {
	e := newEnv(t)
	c := e.config(false)
	c.Underlay = netip.Addr{}
	c.NIC = &NIC{Addrs: []netip.Prefix{netip.MustParsePrefix("172.30.0.9/32")}, MAC: net.HardwareAddr{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x09},
		Gateway: netip.MustParseAddr("172.30.0.1")}
	mustEnsure(t, c)
	un, nn := LinkNames(c.Tag, c.ZoneID)
	if hostLink(t, un) != nil {
		t.Errorf("an underlay host end %s for a zone without an underlay address", un)
	}
	hl := hostLink(t, nn)
	if hl == nil || hl.Attrs().Alias != alias(c.Tag, c.ZoneID, RoleNIC) {
		t.Fatalf("the NIC's host end %s: %+v", nn, hl)
	}
	type zoneView struct {
		links  []string
		addrs  []string
		routes []string
	}
	look := func() (zoneView, error) {
		return inNetns(c.Netns, func() (zoneView, error) {
			var v zoneView
			ls, err := netlink.LinkList()
			if err != nil {
				return v, err
			}
			for _, l := range ls {
				v.links = append(v.links, l.Attrs().Name)
			}
			l, err := netlink.LinkByName(NICIfName)
			if err != nil {
				return v, err
			}
			as, err := netlink.AddrList(l, netlink.FAMILY_V4)
			if err != nil {
				return v, err
			}
			for _, a := range as {
				v.addrs = append(v.addrs, a.IPNet.String())
			}
			rs, err := netlink.RouteList(l, netlink.FAMILY_V4)
			for _, r := range rs {
				v.routes = append(v.routes, fmt.Sprintf("%v via %v", r.Dst, r.Gw))
			}
			return v, err
		})
	}
	v, err := look()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(v.links)
	slices.Sort(v.routes)
	if !slices.Equal(v.links, []string{"lo", NICIfName}) || !slices.Equal(v.addrs, []string{"172.30.0.9/32"}) ||
		!slices.Equal(v.routes, []string{"0.0.0.0/0 via 172.30.0.1", "172.30.0.1/32 via <nil>"}) {
		t.Errorf("the zone: %+v; want lo and %s, 172.30.0.9/32, a route to 172.30.0.1 and the default through it", v, NICIfName)
	}
	mustEnsure(t, c)
	if again := hostLink(t, nn); again == nil || again.Attrs().Index != hl.Attrs().Index {
		t.Errorf("Ensure again made the NIC again: %+v, was index %d", again, hl.Attrs().Index)
	}
	if err := Remove(t.Context(), c.Netns, c.Tag, c.ZoneID); err != nil {
		t.Fatal(err)
	}
	if namespaces, links, err := List(e.prefix, e.tag); err != nil || len(namespaces) != 0 || len(links) != 0 {
		t.Errorf("after Remove: %v, %v, %v; want nothing", namespaces, links, err)
	}
}

func TestRemoveLeavesOthersAlone(t *testing.T) {
	e := newEnv(t)
	other := newEnvNoParallel(t)
	mine := e.config(false)
	theirs := other.config(false)
	theirs.ZoneID = mine.ZoneID // same zone, other owner: other names
	mustEnsure(t, mine)
	mustEnsure(t, theirs)
	if err := Remove(t.Context(), mine.Netns, mine.Tag, mine.ZoneID); err != nil {
		t.Fatal(err)
	}
	wantComplete(t, theirs)

	// A link with my zone's name but someone else's mark is not mine.
	un, _ := LinkNames(mine.Tag, mine.ZoneID)
	e.extraLinks = append(e.extraLinks, un)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = un
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: e.tag + "peer"}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetAlias(hostLink(t, un), "someone-else"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(t.Context(), mine.Netns, mine.Tag, mine.ZoneID); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Remove with a foreign link in the way = %v, want ErrNotOwned", err)
	}
	if err := Ensure(t.Context(), mine); !errors.Is(err, ErrNotOwned) {
		t.Errorf("Ensure with a foreign link in the way = %v, want ErrNotOwned", err)
	}
	if l := hostLink(t, un); l == nil || l.Attrs().Alias != "someone-else" {
		t.Errorf("the foreign link was touched: %v", l)
	}
}

// newEnvNoParallel is newEnv for a second env inside one test.
func newEnvNoParallel(t *testing.T) *env {
	b := make([]byte, 3)
	rand.Read(b)
	e := &env{tag: "zu" + hex.EncodeToString(b)}
	e.prefix = e.tag + "-"
	t.Cleanup(func() { e.cleanup(t) })
	return e
}

func TestWatch(t *testing.T) {
	e := newEnv(t)
	c := e.config(true)
	ctx, cancel := context.WithCancel(t.Context())
	events := make(chan Event, 100)
	var watchErr error
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		watchErr = Watch(ctx, e.prefix, e.tag, func(ev Event) { events <- ev })
	}()
	defer func() {
		cancel()
		<-watchDone
		if watchErr != nil {
			t.Errorf("Watch: %v", watchErr)
		}
	}()
	// await waits, with a generous deadline that only catches a hang, for
	// an event matching want, and returns how long it took since start.
	// The kernel destroys a namespace's links in a deferred work item,
	// which a machine busy with guests under emulation was seen to take
	// more than 5 s over: the deadline is 30 s.
	await := func(start time.Time, want Event) time.Duration {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev := <-events:
				if ev == want {
					return time.Since(start)
				}
			case <-watchDone:
				t.Fatalf("Watch ended early: %v", watchErr)
			case <-timeout:
				t.Fatalf("no %+v within 30 s", want)
			}
		}
	}
	// Watch is ready once it reports a file made for the purpose.
	probe := e.prefix + "probe"
	for deadline := time.Now().Add(5 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("Watch never became ready")
		}
		if err := os.WriteFile(NetnsPath(probe), nil, 0); err != nil {
			t.Fatal(err)
		}
		ready := false
		select {
		case ev := <-events:
			ready = ev == Event{Kind: EventNetnsCreated, Name: probe}
		case <-watchDone:
			t.Fatalf("Watch ended early: %v", watchErr)
		case <-time.After(50 * time.Millisecond):
		}
		os.Remove(NetnsPath(probe))
		if ready {
			break
		}
	}

	mustEnsure(t, c)
	_, nn := LinkNames(c.Tag, c.ZoneID)
	start := time.Now()
	if err := netlink.LinkDel(hostLink(t, nn)); err != nil {
		t.Fatal(err)
	}
	delTook := time.Since(start)
	linkLatency := await(start, Event{Kind: EventLinkDeleted, Name: nn, ZoneID: c.ZoneID})

	start = time.Now()
	if err := removeNetns(c.Netns); err != nil {
		t.Fatal(err)
	}
	nsLatency := await(start, Event{Kind: EventNetnsDeleted, Name: c.Netns, ZoneID: c.ZoneID})
	// The namespace's end takes its veth pairs, and so the host ends, with it.
	un, _ := LinkNames(c.Tag, c.ZoneID)
	pairLatency := await(start, Event{Kind: EventLinkDeleted, Name: un, ZoneID: c.ZoneID})
	t.Logf("Watch latency: link deleted %v (of which the delete call itself took %v); namespace deleted %v; its underlay link gone with it %v",
		linkLatency, delTook, nsLatency, pairLatency)
}
