package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
)

// Attached subnets on the data path, driven as Nexus drives them (each
// operation checked against upstream's document): guest A's VPC subnet
// 10.1.0.0/24 attached, B reaches A's address 10.1.0.7 in it through the
// route Nexus gives B's port (the subnet to A's address), and A's answer
// from it reaches B; what A sends from 10.2.0.7, outside it, is dropped as
// spoofed. The data path killed, the agent gives it the subnet again.
// Detached, B's datagrams to 10.1.0.7 are dropped at A's port as spoofed.
func TestLinuxVPCAttachedSubnet(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	const underlay = "fd00:1122:3344:1de::1"
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VMMStandIn: true, VPCDataPath: true, UnderlayIP: underlay}
	tearDownAtEnd(t, cfg)
	a := newAgent(t, cfg)
	run(t, a)
	dp := waitDataPath(t, cfg)
	guests := []*standInGuest{
		{vmm: "a0000000-0000-4000-8000-0000000000a1", nic: "a0000000-0000-4000-8000-0000000000c1", mac: "a8:40:25:f0:01:01", ip: "172.30.0.5", addr: "[fd00:1122:3344:1de::10]:12400"},
		{vmm: "b0000000-0000-4000-8000-0000000000a1", nic: "b0000000-0000-4000-8000-0000000000c1", mac: "a8:40:25:f0:01:02", ip: "172.30.0.6", addr: "[fd00:1122:3344:1de::11]:12400"},
	}
	for _, g := range guests {
		g.start(t, a)
	}
	w := newWire(t, a)
	// The system router's routes hold the attached subnet's, to A (RFD 599).
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPut, "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":[{"status":"enabled","direction":"inbound","targets":[` + guests[0].target() + `,` + guests[1].target() + `],"filter_hosts":[{"type":"vpc","value":7777}],"filter_ports":null,"filter_protocols":null,"action":"allow","priority":65534}]}`},
		{http.MethodPut, "/vpc-routes", `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}},{"dest":"10.1.0.0/24","target":{"type":"ip","value":"172.30.0.5"}}]},{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.5","virtual_mac":"A8:40:25:F0:01:01","physical_host_ip":"` + underlay + `","vni":7777}`},
		{http.MethodPut, "/v2p", `{"virtual_ip":"172.30.0.6","virtual_mac":"A8:40:25:F0:01:02","physical_host_ip":"` + underlay + `","vni":7777}`},
	} {
		w.do(c.method, c.path, []byte(c.body), http.StatusNoContent)
	}
	for _, g := range guests {
		g.netns = guestNetns(t, g.addr)
		vpctest.ConfigureGuest(t, g.netns, g.ip)
	}
	// A's kernel holds an address of the subnet and one outside it.
	for _, addr := range []string{"10.1.0.7/32", "10.2.0.7/32"} {
		if out, err := exec.Command("nsenter", "--net="+guests[0].netns, "ip", "addr", "add", addr, "dev", "eth0").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s in A: %v %s", addr, err, out)
		}
	}
	server := vpctest.ListenUDP(t, guests[0].netns, "10.1.0.7:5000")
	vpctest.Echo(server, "echo: ")
	client := vpctest.ListenUDP(t, guests[1].netns, "172.30.0.6:40000")
	portA := "instance-" + guests[0].nic
	dropped := func(why string) uint64 {
		st, err := dp.State(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Ports {
			if p.Name == portA {
				return p.Stats.Dropped[why]
			}
		}
		return 0
	}
	echo := func(what string) {
		t.Helper()
		buf := make([]byte, 2048)
		deadline := time.Now().Add(30 * time.Second)
		for {
			client.WriteToUDPAddrPort([]byte("hello"), netip.MustParseAddrPort("10.1.0.7:5000"))
			client.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, from, err := client.ReadFromUDPAddrPort(buf)
			if err == nil && string(buf[:n]) == "echo: hello" && from.Addr() == netip.MustParseAddr("10.1.0.7") {
				return
			}
			if time.Now().After(deadline) {
				st, _ := dp.State(context.Background())
				t.Fatalf("%s: no echo from 10.1.0.7: %v; the data path: %+v", what, err, st)
			}
		}
	}

	// Not attached: B's datagram is dropped at A's port, not for A.
	before := dropped("spoofed")
	waitFor(t, "B's datagram to 10.1.0.7 dropped at A before the attach", func() (bool, string) {
		client.WriteToUDPAddrPort([]byte("hello"), netip.MustParseAddrPort("10.1.0.7:5000"))
		n := dropped("spoofed")
		return n > before, fmt.Sprint(n)
	})

	w.do(http.MethodPut, "/vmms/"+guests[0].vmm+"/attached-subnets", []byte(`{"subnets":[{"subnet":"10.1.0.0/24","kind":"vpc"}]}`), http.StatusNoContent)
	w.do(http.MethodPost, "/vmms/"+guests[0].vmm+"/attached-subnets", []byte(`{"subnet":"10.1.0.0/24","kind":"vpc"}`), http.StatusConflict)
	echo("attached")

	// From outside the subnet: spoofed.
	before = dropped("spoofed")
	out := vpctest.ListenUDP(t, guests[0].netns, "10.2.0.7:5001")
	waitFor(t, "A's datagram from 10.2.0.7 dropped as spoofed", func() (bool, string) {
		out.WriteToUDPAddrPort([]byte("spoof"), netip.MustParseAddrPort("172.30.0.6:40000"))
		n := dropped("spoofed")
		return n > before, fmt.Sprint(n)
	})

	// The data path killed: the agent gives it the port with its subnet.
	svc, err := supervise.Status(filepath.Join(runDir, tag+"-vpcd"))
	if err != nil || !svc.Up {
		t.Fatalf("the data path's service: %+v %v", svc, err)
	}
	syscall.Kill(svc.PID, syscall.SIGKILL)
	echo("after the data path was killed")

	w.do(http.MethodDelete, "/vmms/"+guests[0].vmm+"/attached-subnets", nil, http.StatusNoContent)
	before = dropped("spoofed")
	waitFor(t, "B's datagram to 10.1.0.7 dropped at A after the detach", func() (bool, string) {
		client.WriteToUDPAddrPort([]byte("hello"), netip.MustParseAddrPort("10.1.0.7:5000"))
		n := dropped("spoofed")
		return n > before, fmt.Sprint(n)
	})
}
