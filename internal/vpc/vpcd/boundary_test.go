package vpcd

import (
	"encoding/json"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sim/boundary"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// natTable is a switch NAT table of fixed entries.
type natTable []dpd.NatEntry

func (t natTable) Lookup(ip netip.Addr, port uint16) (dpd.NatTarget, bool) {
	for _, e := range t {
		if e.External == ip && e.Low <= port && port <= e.High {
			return e.Target, true
		}
	}
	return dpd.NatTarget{}, false
}

// rackWithGuest makes VPC.md §4.1's external side in namespaces of the
// test's own: a switch (underlay link with the tunnel endpoint
// fd00:1122:3344:1::1, external link 198.51.100.254/24), sled A (underlay
// fd00:1122:3344:101::1) with a stand-in guest A as twoSleds makes it, and
// the internet (198.51.100.1/24, 192.0.2.0/24 via the switch). It returns
// the namespaces' paths.
func rackWithGuest(t *testing.T) (sw, sled, inet string, g guest) {
	t.Helper()
	ns := namespaces(t)
	swNS, sledNS, inetNS, gNS := ns("sw"), ns("sled"), ns("inet"), ns("gA")
	g = standInGuest(t, sledNS, gNS, "vnA", "a8:40:25:f0:00:01", "172.30.0.5")
	run(t, "ip", "-n", gNS, "neigh", "add", "172.30.0.1", "lladdr", "a8:40:25:ff:77:77", "dev", "eth0", "nud", "permanent")
	run(t, "ip", "link", "add", "ul0", "netns", swNS, "type", "veth", "peer", "name", "ul0", "netns", sledNS)
	run(t, "ip", "link", "add", "ext0", "netns", swNS, "type", "veth", "peer", "name", "eth0", "netns", inetNS)
	for _, c := range [][]string{
		{"-n", swNS, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", sledNS, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", swNS, "link", "set", "ext0", "up"},
		{"-n", inetNS, "link", "set", "eth0", "up"},
		{"-n", swNS, "addr", "add", "fd00:1122:3344:1::1/64", "dev", "ul0", "nodad"},
		{"-n", swNS, "route", "add", "fd00:1122:3344:101::/64", "dev", "ul0"},
		{"-n", swNS, "addr", "add", "198.51.100.254/24", "dev", "ext0"},
		{"-n", sledNS, "addr", "add", "fd00:1122:3344:101::1/64", "dev", "ul0", "nodad"},
		{"-n", sledNS, "route", "add", "fd00:1122:3344:1::/64", "dev", "ul0"},
		{"-n", inetNS, "addr", "add", "198.51.100.1/24", "dev", "eth0"},
		{"-n", inetNS, "route", "add", "192.0.2.0/24", "via", "198.51.100.254"},
	} {
		run(t, "ip", c...)
	}
	// Whole frames with their checksums both ways: the guest's (as
	// standInGuest leaves it), and the internet's, which the switch carries
	// as they are.
	if err := netio.DisableOffloads("/run/netns/"+inetNS, "eth0"); err != nil {
		t.Fatal(err)
	}
	return "/run/netns/" + swNS, "/run/netns/" + sledNS, "/run/netns/" + inetNS, g
}

// VPC.md S6 through the data path as a process and the switch simulator:
// UDP from guest A to the internet leaves from its SNAT address and a port
// of its range and the answer comes back; with an ephemeral address the
// internet reaches A on TCP 22 (allow-ssh, no VNI tag on what the switch
// sends), and A's new flows leave from it.
func TestGuestReachesTheInternet(t *testing.T) {
	swNS, sledNS, inetNS, g := rackWithGuest(t)
	sledAddr := netip.MustParseAddr("fd00:1122:3344:101::1")
	tep := netip.MustParseAddr("fd00:1122:3344:1::1")
	snatIP, ephIP, inetIP := netip.MustParseAddr("192.0.2.20"), netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("198.51.100.1")
	target := dpd.NatTarget{InternalIP: sledAddr, InnerMAC: dpd.MacAddr(wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}), VNI: 7777}
	sw, err := boundary.Start(boundary.Options{Netns: swNS, TEP: tep, External: "ext0", NAT: natTable{
		{External: snatIP, Low: 16384, High: 32767, Target: target},
		{External: ephIP, Low: 0, High: 65535, Target: target},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	d, err := Start(Options{Underlay: sledAddr, Netns: sledNS})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Engine().V2B().Set(netip.MustParsePrefix("0.0.0.0/0"), mappings.TEP{Addr: tep, VNI: wire.BoundaryServicesVNI}); err != nil {
		t.Fatal(err)
	}
	spec := portSpec(t, g)
	spec.System = append(spec.System, rules.Route{Dest: netip.MustParsePrefix("0.0.0.0/0"), Target: rules.SystemIGW()})
	spec.ExternalIPs = ExternalSpec{V4: &ExternalStack{SourceNAT: &SourceNAT{IP: snatIP, FirstPort: 16384, LastPort: 32767}, FloatingIPs: []netip.Addr{}}}
	if err := d.EnsurePort(g.link, spec); err != nil {
		t.Fatal(err)
	}
	debug := func() string {
		b, _ := json.MarshalIndent(d.State(), "", " ")
		return string(b) + "\nswitch: " + jsonString(sw.Stats())
	}

	// The internet's echo server says who it saw.
	echo := vpctest.ListenUDP(t, inetNS, "198.51.100.1:7")
	vpctest.Answer(echo, func(from netip.AddrPort, got []byte) []byte { return []byte(from.String() + " said " + string(got)) })
	ask := func(c *net.UDPConn, msg string) (string, netip.AddrPort) {
		t.Helper()
		buf := make([]byte, 2048)
		deadline := time.Now().Add(15 * time.Second)
		for {
			// The first may wait on neighbour discovery: sent again
			// until answered.
			if _, err := c.WriteToUDPAddrPort([]byte(msg), netip.AddrPortFrom(inetIP, 7)); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err == nil {
				return string(buf[:n]), from
			}
			if time.Now().After(deadline) {
				t.Fatalf("no answer from the internet: %v\n%s", err, debug())
			}
		}
	}

	// SNAT: the internet sees the SNAT address and the range's last port.
	client := vpctest.ListenUDP(t, g.ns, "172.30.0.5:40000")
	got, from := ask(client, "hello")
	if from != netip.AddrPortFrom(inetIP, 7) || got != "192.0.2.20:32767 said hello" {
		t.Fatalf("the guest got %q from %s, want the internet to see 192.0.2.20:32767", got, from)
	}

	// An ephemeral address, as the port manager sets it on the port.
	spec.ExternalIPs.V4.EphemeralIP = &ephIP
	if err := d.EnsurePort(g.link, spec); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := zonenet.RunInPath(g.ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", "172.30.0.5:22")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err.Error()
			return
		}
		defer c.Close()
		accepted <- c.RemoteAddr().String()
		c.Write([]byte("SSH-2.0-guest\r\n"))
	}()
	var conn net.Conn
	if err := zonenet.RunInPath(inetNS, func() error {
		var err error
		dl := net.Dialer{Timeout: 10 * time.Second}
		conn, err = dl.Dial("tcp4", "192.0.2.10:22")
		return err
	}); err != nil {
		t.Fatalf("the internet to the ephemeral address's port 22: %v\n%s", err, debug())
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	banner := make([]byte, 64)
	n, err := conn.Read(banner)
	if err != nil || string(banner[:n]) != "SSH-2.0-guest\r\n" {
		t.Fatalf("the guest's banner: %q, %v\n%s", banner[:n], err, debug())
	}
	if peer := <-accepted; netip.MustParseAddrPort(peer).Addr() != inetIP {
		t.Errorf("the guest saw the connection from %s, want the internet's address", peer)
	}
	// A new flow leaves from the ephemeral address (it beats SNAT).
	client2 := vpctest.ListenUDP(t, g.ns, "172.30.0.5:40001")
	if got, _ := ask(client2, "again"); got != "192.0.2.10:40001 said again" {
		t.Errorf("a new flow with an ephemeral address: the internet says %q", got)
	}
	st := d.State()
	if len(st.Ports) != 1 || len(st.Ports[0].NATFlows) < 3 {
		t.Errorf("NAT flows: %s", debug())
	}
	t.Logf("NAT flows %v; stats %+v; switch %+v", st.Ports[0].NATFlows, st.Ports[0].Stats, sw.Stats())
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
