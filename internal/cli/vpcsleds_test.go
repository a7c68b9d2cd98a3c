package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
)

// vpcSled is one sled of the two: its namespace, agent and guest.
type vpcSled struct {
	tag, ns, dataDir, runDir, underlay string
	hc                                 *http.Client
	vmm, nic, mac, ip, addr            string
	// rack is the rack's namespace (a path), where the bridge br0 joins
	// the sleds' underlay links.
	rack string
}

func (s *vpcSled) flags() []string {
	return []string{"--runtime", "linux", "--netns", s.ns, "--zone-tag", s.tag, "--netns-prefix", s.tag + "-",
		"--data-dir", s.dataDir, "--run-dir", s.runDir, "--vdev-dir", filepath.Join(s.dataDir, "vdev")}
}

// call sends a request to the sled's agent, inside its namespace.
func (s *vpcSled) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://[::1]:12345"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("api-version", "48.0.0")
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// twoSleds starts two agents, each run as a sled in a network namespace of
// its own (--netns) with its data path (--vpc-data-path), their underlay
// links (MTU 9000, the underlay's /48 routed on them) joined by the rack's
// bridge, and waits for both data paths. extra are more `run` flags for
// both (--vmm-stand-in for stand-in guests). Each sled's guest (vmm, nic,
// mac, ip) is filled in but not registered. Everything is torn down when
// the test ends.
func twoSleds(t *testing.T, extra ...string) (a, b *vpcSled) {
	t.Helper()
	a, b, _ = rackOfSleds(t, false, extra...)
	return a, b
}

// rackOfSleds is twoSleds, and with withSwitch the rack's switch too
// (rackSwitch): the agents then read the switch's tunnel endpoint from
// their sled's routing daemon (simulated, in the sled's namespace).
func rackOfSleds(t *testing.T, withSwitch bool, extra ...string) (a, b *vpcSled, sw *rackSwitch) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs agents as sleds in network namespaces")
	}
	for _, bin := range []string{"runsv", "mkfs.btrfs", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (scripts/setup installs it)", bin)
		}
	}
	r := make([]byte, 3)
	rand.Read(r)
	base := "zt" + hex.EncodeToString(r)
	// MACs of this run's own: the stand-in guests are found by them among
	// every test's.
	mac := func(last byte) string { return fmt.Sprintf("a8:40:25:f1:%02x:%02x", r[0], last) }
	sleds := []*vpcSled{
		{tag: base + "a", underlay: "fd00:1122:3344:1db::1", vmm: "a0000000-0000-4000-8000-0000000000a1", nic: "a0000000-0000-4000-8000-0000000000c1", mac: mac(1), ip: "172.30.0.5", addr: "[fd00:1122:3344:1db::10]:12400"},
		{tag: base + "b", underlay: "fd00:1122:3344:1dc::1", vmm: "b0000000-0000-4000-8000-0000000000a1", nic: "b0000000-0000-4000-8000-0000000000c1", mac: mac(2), ip: "172.30.0.6", addr: "[fd00:1122:3344:1dc::10]:12400"},
	}
	for _, s := range sleds {
		s.ns, s.dataDir, s.runDir = s.tag+"-host", t.TempDir(), t.TempDir()
		ip(t, "netns", "add", s.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", s.ns).Run() })
		ip(t, "-n", s.ns, "link", "set", "lo", "up")
		s.hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: s.dialIn}}
	}
	a, b = sleds[0], sleds[1]
	rack := newRack(t, base)
	for _, s := range sleds {
		s.rack = "/run/netns/" + rack.ns
		rack.plug(t, s.ns, s.tag[len(base):])
		ip(t, "-n", s.ns, "addr", "add", s.underlay+"/64", "dev", "ul0", "nodad")
		ip(t, "-n", s.ns, "route", "add", "fd00:1122:3344::/48", "dev", "ul0")
	}
	ddmURL := ""
	if withSwitch {
		sw = rack.addSwitch(t, base, sleds)
		ddmURL = "http://" + sledDDM
	}
	// Registered first, run last: the agents are stopped by then.
	t.Cleanup(func() {
		for _, s := range sleds {
			if cmd, out := startBinary(t, append([]string{"teardown", "--yes"}, s.flags()...)...); cmd.Wait() != nil {
				t.Errorf("cleanup: teardown of %s: %s", s.tag, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := btrfs.ReleaseUnder(ctx, s.dataDir); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			cancel()
			if err := agent.RemoveHostLock(s.tag); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	for _, s := range sleds {
		startBinary(t, append(append([]string{"run", "--listen", "[::1]:12345", "--underlay-ip", s.underlay, "--ddm-url", ddmURL, "--skip-timesync",
			"--vpc-data-path"}, extra...), s.flags()...)...)
	}
	for _, s := range sleds {
		deadline := time.Now().Add(waitDeadline)
		for {
			if _, err := s.dataPath().Boot(t.Context()); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("sled %s: its data path did not come up: %v", s.tag, err)
			}
			time.Sleep(waitInterval)
		}
	}
	return a, b, sw
}

// dataPath is a client of the sled's vpcd.
func (s *vpcSled) dataPath() *vpcd.Client {
	return vpcd.NewClient(agent.VPCSocket(agent.Config{RunDir: s.runDir, ZoneTag: s.tag}))
}

// instanceID is the sled's guest's instance.
func (s *vpcSled) instanceID() string { return strings.Replace(s.vmm, "a1", "01", 1) }

// runGuest registers the sled's guest with spec, as Nexus does (its NIC in
// VNI 7777, 172.30.0.0/22), and runs it.
func (s *vpcSled) runGuest(t *testing.T, spec map[string]any) {
	t.Helper()
	body := ensurebody.Body(ensurebody.Instance{InstanceID: s.instanceID(), PropolisAddr: s.addr, Hostname: "inst",
		NICID: s.nic, MAC: s.mac, NICIP: s.ip, NICSubnet: "172.30.0.0/22", VNI: 7777,
		ProjectID: "960e0000-0000-4000-8000-000000000001", SiloID: "5170e000-0000-4000-8000-000000000001"},
		spec, nil)
	if code, out := s.call(t, http.MethodPut, "/vmms/"+s.vmm, string(body)); code != http.StatusOK {
		t.Fatalf("sled %s: register: %d %s", s.tag, code, out)
	}
	if code, out := s.call(t, http.MethodPut, "/vmms/"+s.vmm+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
		t.Fatalf("sled %s: run: %d %s", s.tag, code, out)
	}
}

// target is the sled's guest's NIC as a firewall rule's target.
func (s *vpcSled) target() string {
	return vpcNIC(s.nic, s.instanceID(), s.ip, "172.30.0.0/22", s.mac, 7777)
}

// pushVPC pushes to every sled what Nexus pushes for the guests' VPC (VNI
// 7777): its firewall rules (inbound allowed within the VPC), its system
// router's routes (the subnet) and every guest's v2p mapping.
func pushVPC(t *testing.T, sleds ...*vpcSled) {
	t.Helper()
	var targets []string
	for _, s := range sleds {
		targets = append(targets, s.target())
	}
	pushes := []struct{ method, path, body string }{
		{http.MethodPut, "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":[{"status":"enabled","direction":"inbound","targets":[` + strings.Join(targets, ",") + `],"filter_hosts":[{"type":"vpc","value":7777}],"action":"allow","priority":65534}]}`},
		{http.MethodPut, "/vpc-routes", `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}}]},{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`},
	}
	for _, s := range sleds {
		pushes = append(pushes, struct{ method, path, body string }{http.MethodPut, "/v2p", vpcV2P(s.ip, s.mac, s.underlay, 7777)})
	}
	for _, s := range sleds {
		for _, p := range pushes {
			if code, out := s.call(t, p.method, p.path, p.body); code != http.StatusNoContent {
				t.Fatalf("sled %s: %s %s: %d %s", s.tag, p.method, p.path, code, out)
			}
		}
	}
}

// VPC.md S3 between two sleds, each an agent run as a sled in a namespace
// of its own with its data path and stand-in guests: the VMMs registered
// and run, the VPC's firewall rules, routes and v2p mappings pushed to each
// sled as Nexus pushes them; a UDP datagram from the guest on one sled
// reaches the guest on the other through Geneve between the sleds' data
// paths, and is answered.
func TestTwoSledsCarryAVPC(t *testing.T) {
	a, bs := twoSleds(t, "--vmm-stand-in")
	sleds := []*vpcSled{a, bs}
	for _, s := range sleds {
		s.runGuest(t, ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: s.nic, ImageBlob: []byte{0, 0, 0, 0}}))
	}
	pushVPC(t, sleds...)
	guests := map[string]string{} // MAC → the stand-in guest's namespace
	deadline := time.Now().Add(waitDeadline)
	for guests[a.mac] == "" || guests[bs.mac] == "" {
		guests = standInGuests(t)
		if time.Now().After(deadline) {
			t.Fatalf("stand-in guests found: %v", guests)
		}
		time.Sleep(waitInterval)
	}
	for _, s := range sleds {
		vpctest.ConfigureGuest(t, guests[s.mac], s.ip)
	}
	server := vpctest.ListenUDP(t, guests[bs.mac], bs.ip+":5000")
	client := vpctest.ListenUDP(t, guests[a.mac], a.ip+":40000")
	vpctest.Echo(server, "echo: ")
	buf := make([]byte, 2048)
	deadline = time.Now().Add(30 * time.Second)
	for {
		client.WriteToUDPAddrPort([]byte("across"), netip.MustParseAddrPort(bs.ip+":5000"))
		client.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, _, err := client.ReadFromUDPAddrPort(buf)
		if err == nil && bytes.Equal(buf[:n], []byte("echo: across")) {
			break
		}
		if time.Now().After(deadline) {
			var states []string
			for _, s := range sleds {
				st, _ := s.dataPath().State(context.Background())
				states = append(states, fmt.Sprintf("%+v", st))
			}
			t.Fatalf("no echo across the sleds: %v\n%s", err, strings.Join(states, "\n"))
		}
	}
}

// standInGuests finds the stand-in guests' namespaces by their holders
// (sled-agent stand-in-guest, children of VMM services), by the MAC of
// their eth0, once it is up.
func standInGuests(t *testing.T) map[string]string {
	out := map[string]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.HasSuffix(string(cmd), "\x00"+standin.ChildArg+"\x00") {
			continue
		}
		path := "/proc/" + strconv.Itoa(pid) + "/ns/net"
		ns, err := netns.GetFromPath(path)
		if err != nil {
			continue
		}
		h, err := netlink.NewHandleAt(ns)
		if err == nil {
			// Found once the stand-in has set it up: a link just moved in
			// is down, and takes no route.
			if l, err := h.LinkByName("eth0"); err == nil && l.Attrs().Flags&net.FlagUp != 0 {
				out[l.Attrs().HardwareAddr.String()] = path
			}
			h.Close()
		}
		ns.Close()
	}
	return out
}
