package agent_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
)

// standInGuest is a stand-in VMM of VPC1 (VPC.md §4.2) registered and run
// through the API, with its guest configured as OPTE's DHCP would leave it.
type standInGuest struct {
	vmm, nic, mac, ip, addr string
	netns                   string // the guest's namespace
}

// start registers the guest's VMM on a as Nexus does (its NIC in VNI 7777,
// 172.30.0.0/22), and runs it.
func (g *standInGuest) start(t *testing.T, a *agent.Agent) {
	t.Helper()
	body := ensurebody.Body(ensurebody.Instance{InstanceID: strings.Replace(g.vmm, "a1", "01", 1), PropolisAddr: g.addr, Hostname: "inst",
		NICID: g.nic, MAC: g.mac, NICIP: g.ip, NICSubnet: "172.30.0.0/22", VNI: 7777,
		ProjectID: "960e0000-0000-4000-8000-000000000001", SiloID: "5170e000-0000-4000-8000-000000000001"},
		ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: g.nic, ImageBlob: []byte{0, 0, 0, 0}}), nil)
	if code, b := call(t, a, http.MethodPut, "/vmms/"+g.vmm, string(body)); code != http.StatusOK {
		t.Fatalf("register %s: %d %s", g.vmm, code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+g.vmm+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
		t.Fatalf("run %s: %d %s", g.vmm, code, b)
	}
}

// target is the guest's NIC as a firewall rule's target.
func (g *standInGuest) target() string {
	return `{"id":"` + g.nic + `","kind":{"type":"instance","id":"` + strings.Replace(g.vmm, "a1", "01", 1) + `"},"name":"net0","ip_config":{"type":"v4","value":{"ip":"` + g.ip + `","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"` + strings.ToUpper(g.mac) + `","vni":7777,"primary":true,"slot":0}`
}

// tearDownAtEnd tears the sled of cfg down when the test ends. Registered
// before the agent starts, it runs after the agent stops: the data path's
// service outlives the agent.
func tearDownAtEnd(t *testing.T, cfg agent.Config) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := agent.Teardown(ctx, cfg, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// waitDataPath waits for the data path's service the agent of cfg starts,
// and returns a client of it.
func waitDataPath(t *testing.T, cfg agent.Config) *vpcd.Client {
	t.Helper()
	dp := vpcd.NewClient(agent.VPCSocket(cfg))
	waitFor(t, "the data path's service", func() (bool, string) {
		_, err := dp.Boot(t.Context())
		return err == nil, fmt.Sprint(err)
	})
	return dp
}

// The outside check of the data path driven as Nexus drives it, on one
// sled: two stand-in VMMs of one VPC registered and run, the services'
// firewall rules, the system router's routes and the v2p mappings pushed
// through upstream's operations; the agent makes the data path's ports on
// the VMMs' taps, and a UDP datagram from one guest reaches the other and
// is answered. sled-agent vpc's state shows both ports attached. The data
// path is a service of its own (VPC.md S8): with the agent stopped the
// guests still talk; a restarted agent finds it as it was; the data path
// killed, runit restarts it and the agent gives it everything again.
func TestLinuxVPCDataPathCarriesGuestsTraffic(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	const underlay = "fd00:1122:3344:1da::1"
	// The routing daemon knows the switches' boundary services: the data
	// path's boundary table gets them.
	ddmSim := ddmsim.New(nil)
	if err := ddmSim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ddmSim.Close() })
	dc, err := ddm.NewClient(ddmSim.URL())
	if err != nil {
		t.Fatal(err)
	}
	tep := netip.MustParseAddr("fd00:1122:3344:1::1")
	if err := dc.AdvertiseTunnelEndpoints(t.Context(), []ddm.TunnelOrigin{{OverlayPrefix: netip.MustParsePrefix("0.0.0.0/0"), BoundaryAddr: tep, VNI: 99}}); err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VMMStandIn: true, VPCDataPath: true, UnderlayIP: underlay, DDMURL: ddmSim.URL()}
	// After the agents: the data path's service, which outlives them.
	tearDownAtEnd(t, cfg)
	a := newAgent(t, cfg)
	stop := run(t, a)
	// The data path is a service the agent starts: Nexus's pushes before
	// it answers are 500s (Nexus pushes again).
	waitDataPath(t, cfg)
	guests := []*standInGuest{
		{vmm: "a0000000-0000-4000-8000-0000000000a1", nic: "a0000000-0000-4000-8000-0000000000c1", mac: "a8:40:25:f0:00:01", ip: "172.30.0.5", addr: "[fd00:1122:3344:1da::10]:12400"},
		{vmm: "b0000000-0000-4000-8000-0000000000a1", nic: "b0000000-0000-4000-8000-0000000000c1", mac: "a8:40:25:f0:00:02", ip: "172.30.0.6", addr: "[fd00:1122:3344:1da::11]:12400"},
	}
	for _, g := range guests {
		g.start(t, a)
	}
	// Nexus's pushes: the VPC's rules (allow inside the VPC), its system
	// router's routes, the mappings of both guests.
	rulesBody := `{"vni":7777,"rules":[{"status":"enabled","direction":"inbound","targets":[` + guests[0].target() + `,` + guests[1].target() + `],"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534}]}`
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPut, "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", rulesBody},
		{http.MethodPut, "/vpc-routes", `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}}]},{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.5","virtual_mac":"A8:40:25:F0:00:01","physical_host_ip":"` + underlay + `","vni":7777}`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.6","virtual_mac":"A8:40:25:F0:00:02","physical_host_ip":"` + underlay + `","vni":7777}`},
	} {
		if code, b := call(t, a, c.method, c.path, c.body); code != http.StatusNoContent {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, b)
		}
	}
	for _, g := range guests {
		g.netns = guestNetns(t, g.addr)
		vpctest.ConfigureGuest(t, g.netns, g.ip)
	}

	server := vpctest.ListenUDP(t, guests[1].netns, "172.30.0.6:5000")
	client := vpctest.ListenUDP(t, guests[0].netns, "172.30.0.5:40000")
	vpctest.Echo(server, "echo: ")
	echo := func(what string) {
		t.Helper()
		buf := make([]byte, 2048)
		deadline := time.Now().Add(30 * time.Second)
		for {
			client.WriteToUDPAddrPort([]byte("hello"), netip.MustParseAddrPort("172.30.0.6:5000"))
			client.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, _, err := client.ReadFromUDPAddrPort(buf)
			if err == nil && string(buf[:n]) == "echo: hello" {
				return
			}
			if time.Now().After(deadline) {
				st, _ := vpcd.NewClient(agent.VPCSocket(cfg)).State(context.Background())
				t.Fatalf("%s: no echo between the guests: %v; the data path: %+v", what, err, st)
			}
		}
	}
	echo("first")
	st, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	attached := 0
	for _, p := range st.Ports {
		if p.Status == "attached" {
			attached++
		}
		// The gateway's DHCP hands out the registration's hostname.
		if p.Spec.DHCP == nil || p.Spec.DHCP.Hostname != "inst" {
			t.Errorf("port %s's DHCP options: %+v, want the hostname inst", p.Name, p.Spec.DHCP)
		}
	}
	if attached != 2 || len(st.V2P) != 2 {
		t.Errorf("the data path's ports %+v, v2p %+v: want two attached, two mappings", st.Ports, st.V2P)
	}

	waitFor(t, "the switches' tunnel endpoints in the data path", func() (bool, string) {
		st, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context())
		return err == nil && len(st.V2B) == 1 && len(st.V2B[0].TEPs) == 1 && st.V2B[0].TEPs[0].Addr == tep && st.V2B[0].TEPs[0].VNI == 99, fmt.Sprintf("%+v %v", st.V2B, err)
	})

	// An ephemeral address attached as Nexus attaches it reaches the data
	// path's port.
	if code, b := call(t, a, http.MethodPut, "/vmms/"+guests[0].vmm+"/external-ip", `{"type":"ephemeral","value":"192.0.2.10"}`); code != http.StatusNoContent {
		t.Fatalf("attach an ephemeral address: %d %s", code, b)
	}
	if st, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context()); err != nil || !hasEphemeral(st, "192.0.2.10") {
		t.Errorf("the data path's ports after the attach: %+v (%v)", st.Ports, err)
	}

	// The agent stopped: the guests still talk.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	echo("with the agent stopped")
	a = newAgent(t, cfg)
	run(t, a)
	echo("after the agent's restart")
	if again, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context()); err != nil || again.Boot != st.Boot {
		t.Errorf("the restarted agent restarted the data path: boot %s, was %s (%v)", again.Boot, st.Boot, err)
	}

	// The data path killed: runit restarts it, and the agent gives it
	// everything again.
	svc, err := supervise.Status(filepath.Join(runDir, tag+"-vpcd"))
	if err != nil || !svc.Up {
		t.Fatalf("the data path's service: %+v %v", svc, err)
	}
	syscall.Kill(svc.PID, syscall.SIGKILL)
	echo("after the data path was killed")
	if again, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context()); err != nil || again.Boot == st.Boot || len(again.Ports) != 2 || !hasEphemeral(again, "192.0.2.10") {
		t.Errorf("after the kill: boot %s (was %s), %d ports, the ephemeral address given again %v (%v)", again.Boot, st.Boot, len(again.Ports), hasEphemeral(again, "192.0.2.10"), err)
	}
	waitFor(t, "the switches' tunnel endpoints in the restarted data path", func() (bool, string) {
		st, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context())
		return err == nil && len(st.V2B) == 1 && len(st.V2B[0].TEPs) == 1 && st.V2B[0].TEPs[0].Addr == tep, fmt.Sprintf("%+v %v", st.V2B, err)
	})
}

// guestNetns is the namespace a stand-in VMM's console names.
func guestNetns(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		data, _, err := propolisapi.NewClient(addr).SerialHistory(ctx, propolisapi.SerialFromStart(0), 1<<20)
		cancel()
		if err == nil {
			for _, l := range strings.Split(string(data), "\n") {
				if p, ok := strings.CutPrefix(strings.TrimSpace(l), standin.NotePrefix); ok {
					return p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stand-in guest namespace on %s's console: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hasEphemeral reports whether a port of st has the ephemeral address ip.
func hasEphemeral(st vpcd.State, ip string) bool {
	for _, p := range st.Ports {
		if v4 := p.Spec.ExternalIPs.V4; v4 != nil && v4.EphemeralIP != nil && v4.EphemeralIP.String() == ip {
			return true
		}
	}
	return false
}

// A service zone's NIC is a port of the data path, as OPTE makes it: the
// zone holds its address alone (/32), with routes to its gateway and the
// default route through it; the zone finds the gateway by ARP, which the
// data path answers; and what it sends to the internet takes its external
// address to the switches (here none is known: the packet is dropped for
// want of a tunnel endpoint, and counted so).
func TestLinuxServiceZoneIsAPort(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VPCDataPath: true, UnderlayIP: "fd00:1122:3344:1df::1"}
	tearDownAtEnd(t, cfg)
	a := newAgent(t, cfg)
	run(t, a)
	zones := sledconfigtest.OwnPools(tag, sledconfigtest.Nexus(0x77, "[fd00:1122:3344:1df::7]:12221"))
	nexus := zones[0]
	if err := newClient(t, a).PutConfig(t.Context(), linuxDoc(t, dir, tag, 1, zones...)); err != nil {
		t.Fatal(err)
	}
	port := "service-" + strings.ToLower(nexus.ZoneType.NIC.ID)
	sock := agent.VPCSocket(cfg)
	waitFor(t, "the nexus zone's port attached", func() (bool, string) {
		st, err := vpcd.NewClient(sock).State(t.Context())
		for _, p := range st.Ports {
			if p.Name == port {
				return p.Status == "attached", p.Status
			}
		}
		return false, fmt.Sprintf("%+v %v", st.Ports, err)
	})
	ns := zonenet.NetnsPath(prefix + nexus.Name())
	// Something for the internet: the zone's kernel asks for its gateway.
	var c *net.UDPConn
	if err := zonenet.RunInPath(ns, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.1:123")))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gw := net.ParseIP("172.30.2.1")
	waitFor(t, "the zone's neighbour entry of its gateway", func() (bool, string) {
		c.Write([]byte("ntp?"))
		h, err := netlink.NewHandleAt(mustNetns(t, ns))
		if err != nil {
			return false, err.Error()
		}
		defer h.Close()
		neighs, err := h.NeighList(0, netlink.FAMILY_V4)
		for _, n := range neighs {
			if n.IP.Equal(gw) && n.HardwareAddr.String() == "a8:40:25:ff:77:77" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%v %v", neighs, err)
	})
	waitFor(t, "the zone's packet to the internet dropped for want of a tunnel endpoint", func() (bool, string) {
		c.Write([]byte("ntp?"))
		st, err := vpcd.NewClient(sock).State(t.Context())
		for _, p := range st.Ports {
			if p.Name == port {
				return p.Stats.Dropped["no boundary tunnel endpoint"] > 0, fmt.Sprint(p.Stats)
			}
		}
		return false, fmt.Sprint(err)
	})
	h, err := netlink.NewHandleAt(mustNetns(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("opte0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := h.AddrList(l, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "172.30.2.9/32" {
		t.Errorf("opte0's addresses %v, want 172.30.2.9/32", addrs)
	}
}

func mustNetns(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}
