package vpcd

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
)

const nics = `[
 {"id":"a0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"a0000000-0000-4000-8000-000000000001"},"name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.5","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"A8:40:25:F0:00:01","vni":7777,"primary":true,"slot":0},
 {"id":"b0000000-0000-4000-8000-0000000000c1","kind":{"type":"instance","id":"b0000000-0000-4000-8000-000000000001"},"name":"net0","ip_config":{"type":"v4","value":{"ip":"172.30.0.6","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"A8:40:25:F0:00:02","vni":7777,"primary":true,"slot":0}]`

func defaultRules(t testing.TB) []rules.FirewallRule {
	var rs []rules.FirewallRule
	if err := json.Unmarshal([]byte(`[
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},
 {"status":"enabled","direction":"inbound","targets":`+nics+`,"filter_protocols":[{"type":"icmp","value":null}],"action":"allow","priority":65534}]`), &rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

type guest struct {
	ns   string // path
	mac  string
	ip   string
	link string // the host end, in the sled's namespace
}

// twoSleds makes VPC.md §4.1's two sleds in namespaces of the test's own
// (underlay fd00:1122:3344:101::1 and 102::1 on a veth pair) and a stand-in
// guest on each: a namespace whose eth0, with the guest's MAC, holds its
// address /32 with a route to the gateway 172.30.0.1 and a default route
// through it, as OPTE's DHCP leaves a guest (it finds the gateway's MAC by
// ARP, which the data path answers); the host end, vnA or vnB, is in the
// sled's namespace.
func twoSleds(t testing.TB) (sledA, sledB string, a, b guest) {
	t.Helper()
	ns := namespaces(t)
	sa, sb, ga, gb := ns("sledA"), ns("sledB"), ns("gA"), ns("gB")
	run(t, "ip", "link", "add", "ul0", "netns", sa, "type", "veth", "peer", "name", "ul0", "netns", sb)
	for _, c := range [][]string{
		{"-n", sa, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", sb, "link", "set", "ul0", "mtu", "9000", "up"},
		{"-n", sa, "addr", "add", "fd00:1122:3344:101::1/64", "dev", "ul0", "nodad"},
		{"-n", sb, "addr", "add", "fd00:1122:3344:102::1/64", "dev", "ul0", "nodad"},
		{"-n", sa, "route", "add", "fd00:1122:3344::/48", "dev", "ul0"},
		{"-n", sb, "route", "add", "fd00:1122:3344::/48", "dev", "ul0"},
	} {
		run(t, "ip", c...)
	}
	return "/run/netns/" + sa, "/run/netns/" + sb,
		standInGuest(t, sa, ga, "vnA", "a8:40:25:f0:00:01", "172.30.0.5"), standInGuest(t, sb, gb, "vnB", "a8:40:25:f0:00:02", "172.30.0.6")
}

// namespaces skips the test unless it can make network namespaces, and
// gives a maker of them: each named by the test's own tag and n, with lo
// up, removed when the test ends. It returns the name.
func namespaces(t testing.TB) func(n string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces and links")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	r := make([]byte, 3)
	rand.Read(r)
	tag := "zt" + hex.EncodeToString(r)
	return func(n string) string {
		name := tag + "-" + n
		run(t, "ip", "netns", "add", name)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
		run(t, "ip", "-n", name, "link", "set", "lo", "up")
		return name
	}
}

// standInGuest joins the guest namespace gns to the sled namespace sled by
// a veth pair (link on the sled's side, eth0 with mac on the guest's) and
// gives eth0 ip/32, a route to the gateway 172.30.0.1 and a default route
// through it, with offloads off.
func standInGuest(t testing.TB, sled, gns, link, mac, ip string) guest {
	t.Helper()
	run(t, "ip", "link", "add", link, "netns", sled, "type", "veth", "peer", "name", "eth0", "netns", gns)
	for _, c := range [][]string{
		{"netns", "exec", sled, "sysctl", "-qw", "net.ipv6.conf." + link + ".disable_ipv6=1"},
		{"-n", sled, "link", "set", link, "up"},
		{"-n", gns, "link", "set", "eth0", "address", mac, "up"},
		{"-n", gns, "addr", "add", ip + "/32", "dev", "eth0"},
		{"-n", gns, "route", "add", "172.30.0.1", "dev", "eth0"},
		{"-n", gns, "route", "add", "default", "via", "172.30.0.1"},
	} {
		run(t, "ip", c...)
	}
	if err := netio.DisableOffloads("/run/netns/"+gns, "eth0"); err != nil {
		t.Fatal(err)
	}
	return guest{ns: "/run/netns/" + gns, mac: mac, ip: ip, link: link}
}

func portSpec(t testing.TB, g guest) PortSpec {
	subnet := netip.MustParsePrefix("172.30.0.0/22")
	return PortSpec{Link: Link{Name: g.link}, VNI: 7777, MAC: rules.MustMAC(g.mac),
		IPv4:     &IPSpec{Private: netip.MustParseAddr(g.ip), Subnet: subnet},
		Firewall: defaultRules(t),
		System:   []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}}}
}

// VPC.md S3 through the data path as a process would run it: two sleds'
// daemons, a port each on a stand-in guest's link, routes and v2p as Nexus
// gives them; a UDP datagram from A's guest reaches B's and B's answer
// comes back, through Geneve on the underlay. A port whose link is not
// there yet waits for it and says so.
func TestTwoSledsCarryUDP(t *testing.T) {
	sa, sb, ga, gb := twoSleds(t)
	da, err := Start(Options{Underlay: netip.MustParseAddr("fd00:1122:3344:101::1"), Netns: sa})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := Start(Options{Underlay: netip.MustParseAddr("fd00:1122:3344:102::1"), Netns: sb})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// A port whose link is not there: waiting.
	if err := da.EnsurePort("early", PortSpec{Link: Link{Name: "vnX"}, VNI: 7777, MAC: rules.MustMAC("a8:40:25:f0:00:09"),
		IPv4: &IPSpec{Private: netip.MustParseAddr("172.30.0.9"), Subnet: netip.MustParsePrefix("172.30.0.0/22")}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		d *Daemon
		g guest
	}{{da, ga}, {db, gb}} {
		if err := s.d.EnsurePort(s.g.link, portSpec(t, s.g)); err != nil {
			t.Fatal(err)
		}
		for _, m := range []V2P{
			{VirtualIP: netip.MustParseAddr("172.30.0.5"), VirtualMAC: rules.MustMAC("A8:40:25:F0:00:01"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:101::1"), VNI: 7777},
			{VirtualIP: netip.MustParseAddr("172.30.0.6"), VirtualMAC: rules.MustMAC("A8:40:25:F0:00:02"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:102::1"), VNI: 7777},
		} {
			if err := s.d.SetV2P(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	server := vpctest.ListenUDP(t, gb.ns, "172.30.0.6:5000")
	client := vpctest.ListenUDP(t, ga.ns, "172.30.0.5:40000")
	vpctest.Echo(server, "echo: ")
	buf := make([]byte, 2048)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := client.WriteToUDPAddrPort([]byte("hello B"), netip.MustParseAddrPort("172.30.0.6:5000")); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, from, err := client.ReadFromUDPAddrPort(buf)
		if err == nil {
			if string(buf[:n]) != "echo: hello B" || from != netip.MustParseAddrPort("172.30.0.6:5000") {
				t.Fatalf("A got %q from %s", buf[:n], from)
			}
			break
		}
		if time.Now().After(deadline) {
			sa, _ := json.MarshalIndent(da.State(), "", " ")
			sb, _ := json.MarshalIndent(db.State(), "", " ")
			t.Fatalf("no echo from B: %v\nsled A: %s\nsled B: %s", err, sa, sb)
		}
	}
	st := da.State()
	var early, portA *PortState
	for i := range st.Ports {
		switch st.Ports[i].Name {
		case "early":
			early = &st.Ports[i]
		case "vnA":
			portA = &st.Ports[i]
		}
	}
	if early == nil || !strings.HasPrefix(early.Status, "waiting for its link") {
		t.Errorf("a port without its link: %+v", early)
	}
	if portA == nil || portA.Status != "attached" || len(portA.Flows) == 0 || portA.Stats.OutPackets == 0 {
		t.Errorf("A's port: %+v", portA)
	}
	t.Logf("A's port: %s; flows %v; stats %+v", portA.Status, portA.Flows, portA.Stats)
}

// BenchmarkTCPStream is one TCP stream from A's stand-in guest to B's
// through both sleds' data paths: MB/s is the stream's throughput.
func BenchmarkTCPStream(b *testing.B) {
	t := b
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	sa, sb, ga, gb := twoSleds(t)
	da, err := Start(Options{Underlay: netip.MustParseAddr("fd00:1122:3344:101::1"), Netns: sa})
	if err != nil {
		b.Fatal(err)
	}
	defer da.Close()
	db, err := Start(Options{Underlay: netip.MustParseAddr("fd00:1122:3344:102::1"), Netns: sb})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for _, s := range []struct {
		d *Daemon
		g guest
	}{{da, ga}, {db, gb}} {
		s.d.EnsurePort(s.g.link, portSpec(t, s.g))
		s.d.SetV2P(V2P{VirtualIP: netip.MustParseAddr("172.30.0.5"), VirtualMAC: rules.MustMAC("A8:40:25:F0:00:01"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:101::1"), VNI: 7777})
		s.d.SetV2P(V2P{VirtualIP: netip.MustParseAddr("172.30.0.6"), VirtualMAC: rules.MustMAC("A8:40:25:F0:00:02"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:102::1"), VNI: 7777})
	}
	var ln net.Listener
	zonenet.RunInPath(gb.ns, func() error { ln, err = net.Listen("tcp4", "172.30.0.6:5001"); return err })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		buf := make([]byte, 1<<16)
		var n int64
		for {
			m, err := c.Read(buf)
			n += int64(m)
			if err != nil {
				got <- n
				return
			}
		}
	}()
	var c net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		zonenet.RunInPath(ga.ns, func() error {
			d := net.Dialer{Timeout: time.Second}
			c, err = d.Dial("tcp4", "172.30.0.6:5001")
			return err
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<16)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	<-got
}

// A port's reads take a jumbo frame on any link, and a longer link's whole
// frames with a VLAN tag.
func TestFrameRoom(t *testing.T) {
	for mtu, want := range map[int]int{0: 9216, 1500: 9216, 9000: 9216, 9198: 9216, 9216: 9234, 65535: 65553} {
		if got := frameRoom(mtu); got != want {
			t.Errorf("MTU %d: %d, want %d", mtu, got, want)
		}
	}
}
