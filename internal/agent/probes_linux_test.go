package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
)

// A probe told with PUT /probes is a zone whose NIC's host end is its
// port's link: the port attaches, with upstream's one rule; a stand-in
// guest of the VPC on the sled reaches it and is answered (no firewall
// rule of the VPC lets it in: the probe's own does); the zone
// outlives the agent and a restarted agent keeps it (the same link); the
// empty set removes the zone, namespace and link.
func TestLinuxProbeIsAZoneWithAPort(t *testing.T) { probeIsAZoneWithAPort(t, "linux") }

// The same with the sim runtime, whose data path runs in the agent: the
// probe's zone is a namespace all the same, as a stand-in guest's is.
func TestSimProbeIsAZoneWithAPort(t *testing.T) { probeIsAZoneWithAPort(t, "sim") }

func probeIsAZoneWithAPort(t *testing.T, runtime string) {
	tag, prefix, dir, runDir := linuxEnv(t)
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: runtime, ZoneTag: tag, NetnsPrefix: prefix,
		VMMStandIn: true, VPCDataPath: true, UnderlayIP: "fd00:1122:3344:1de::1"}
	if runtime == "linux" {
		cfg.VdevDir = vdevDir(dir)
	}
	tearDownAtEnd(t, cfg)
	a := newAgent(t, cfg)
	stop := run(t, a)
	const id = "e0000000-0000-4000-8000-0000000000e1"
	body := `{"probes":[{"id":"` + id + `","interface":{"id":"e0000000-0000-4000-8000-0000000000c1","kind":{"type":"probe","id":"` + id + `"},"name":"probe0","ip_config":{"type":"v4","value":{"ip":"172.30.0.9","subnet":"172.30.0.0/22","transit_ips":[]}},"mac":"A8:40:25:F0:00:09","vni":7777,"primary":true,"slot":0},"external_ips":[]}]}`
	if code, b := call(t, a, http.MethodPut, "/probes", body); code != http.StatusNoContent {
		t.Fatalf("PUT /probes: %d %s", code, b)
	}
	sock := agent.VPCSocket(cfg)
	port := "probe-e0000000-0000-4000-8000-0000000000c1"
	waitFor(t, "the probe's port attached", func() (bool, string) {
		st, err := vpcd.NewClient(sock).State(t.Context())
		for _, p := range st.Ports {
			if p.Name == port {
				return p.Status == "attached" && len(p.Spec.Firewall) == 1 && p.Spec.Firewall[0].Priority == 100, fmt.Sprintf("%s %+v", p.Status, p.Spec.Firewall)
			}
		}
		return false, fmt.Sprintf("%+v %v", st.Ports, err)
	})
	// A stand-in guest of the same VPC on the sled reaches the probe, and
	// the probe answers it.
	g := &standInGuest{vmm: "a0000000-0000-4000-8000-0000000000a1", nic: "a0000000-0000-4000-8000-0000000000c1", mac: "a8:40:25:f0:00:01", ip: "172.30.0.5", addr: "[fd00:1122:3344:1de::10]:12400"}
	gbody := ensurebody.Body(ensurebody.Instance{InstanceID: "a0000000-0000-4000-8000-000000000001", PropolisAddr: g.addr, Hostname: "inst",
		NICID: g.nic, MAC: g.mac, NICIP: g.ip, NICSubnet: "172.30.0.0/22", VNI: 7777,
		ProjectID: "960e0000-0000-4000-8000-000000000001", SiloID: "5170e000-0000-4000-8000-000000000001"},
		ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: g.nic, ImageBlob: []byte{0, 0, 0, 0}}), nil)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPut, "/vmms/" + g.vmm, string(gbody)},
		{http.MethodPut, "/vmms/" + g.vmm + "/state", `{"state":{"type":"running"}}`},
		{http.MethodPut, "/vpc-routes", `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}}]},{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.5","virtual_mac":"A8:40:25:F0:00:01","physical_host_ip":"fd00:1122:3344:1de::1","vni":7777}`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.9","virtual_mac":"A8:40:25:F0:00:09","physical_host_ip":"fd00:1122:3344:1de::1","vni":7777}`},
	} {
		if code, b := call(t, a, c.method, c.path, c.body); code != http.StatusOK && code != http.StatusNoContent {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, b)
		}
	}
	g.netns = guestNetns(t, serviceAddr(t, a, g.vmm))
	vpctest.ConfigureGuest(t, g.netns, g.ip)
	probeNetns, _ := probes.Namespaces{Prefix: prefix, Tag: tag}.Where(id)
	server := vpctest.ListenUDP(t, probeNetns, "172.30.0.9:5000")
	vpctest.Echo(server, "probe: ")
	client := vpctest.ListenUDP(t, g.netns, "172.30.0.5:40000")
	waitFor(t, "the probe's answer to the guest", func() (bool, string) {
		client.WriteToUDPAddrPort([]byte("hello"), netip.MustParseAddrPort("172.30.0.9:5000"))
		client.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		buf := make([]byte, 2048)
		n, _, err := client.ReadFromUDPAddrPort(buf)
		return err == nil && string(buf[:n]) == "probe: hello", fmt.Sprint(err)
	})

	link := probes.Link(tag, id)
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	a = newAgent(t, cfg)
	run(t, a)
	waitFor(t, "the restarted agent's probe zone ready", func() (bool, string) {
		code, b := call(t, a, http.MethodGet, "/agent/inventory", "")
		return code == http.StatusOK && strings.Contains(string(b), `"state":"ready"`) && strings.Contains(string(b), `"adopted":true`), string(b)
	})
	if again, err := netlink.LinkByName(link); err != nil || again.Attrs().Index != l.Attrs().Index {
		t.Errorf("the restarted agent made the probe's zone again: %v", err)
	}
	if code, b := call(t, a, http.MethodPut, "/probes", `{"probes":[]}`); code != http.StatusNoContent {
		t.Fatalf("PUT /probes: %d %s", code, b)
	}
	waitFor(t, "the probe's zone gone", func() (bool, string) {
		_, err := netlink.LinkByName(link)
		return err != nil && !zonenet.NetnsExists(prefix+probes.ZoneName(id)), fmt.Sprint(err)
	})
}

// serviceAddr is where the agent reaches VMM id's service: its
// propolis_addr with the linux runtime, a loopback port in the agent
// with the sim runtime.
func serviceAddr(t *testing.T, a *agent.Agent, id string) string {
	t.Helper()
	addr := ""
	waitFor(t, "VMM "+id+"'s service", func() (bool, string) {
		code, b := call(t, a, http.MethodGet, "/agent/vmms", "")
		var page struct {
			Items []struct {
				ID          string `json:"propolis_id"`
				ServiceAddr string `json:"service_addr"`
			} `json:"items"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &page) != nil {
			return false, fmt.Sprintf("%d %s", code, b)
		}
		for _, v := range page.Items {
			if v.ID == id {
				addr = v.ServiceAddr
			}
		}
		return addr != "", string(b)
	})
	return addr
}
