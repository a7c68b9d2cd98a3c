package agent_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sim/boundary"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// VPC.md S7, the service zone's half: a boundary NTP zone of a sled with
// its data path reaches an NTP server outside the rack through its source
// NAT: its port sends to the switch's tunnel endpoint (learned from the
// routing daemon), the switch (its boundary services, simulated) routes the
// packet out, and the server sees it from the zone's SNAT address and a port
// of its range; its answer comes back through the switch, by the zone's NAT
// entry, which the agent put there in the services VPC's VNI, and the data
// path hands it to the zone.
func TestLinuxBoundaryNTPReachesOutsideThroughSNAT(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	if _, err := chrony.Find(); err != nil {
		t.Skipf("needs chronyd (scripts/setup installs it): %v", err)
	}
	const underlay = "fd00:1122:3344:1e4::1"
	tep := netip.MustParseAddr("fd00:1122:3344:1e5::1")
	b := make([]byte, 3)
	rand.Read(b)
	nt := "zt" + hex.EncodeToString(b)
	sw, inet, hostEnd := nt+"-sw", nt+"-inet", nt+"u"
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{sw, inet} {
		sh("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh("-n", ns, "link", "set", "lo", "up")
	}
	// The sled's underlay to the switch: a link of the test's own on the
	// host holding the sled's address; the switch's external side to the
	// internet.
	sh("link", "add", hostEnd, "type", "veth", "peer", "name", "ul0", "netns", sw)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostEnd).Run() })
	for _, c := range [][]string{
		{"link", "set", hostEnd, "up"},
		{"-n", sw, "link", "set", "ul0", "up"},
		{"addr", "add", underlay + "/128", "dev", hostEnd, "nodad"},
		{"route", "add", tep.String() + "/128", "dev", hostEnd},
		{"-n", sw, "addr", "add", tep.String() + "/128", "dev", "ul0", "nodad"},
		{"-n", sw, "route", "add", underlay + "/128", "dev", "ul0"},
		{"link", "add", "ext0", "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", inet},
		{"-n", sw, "link", "set", "ext0", "up"},
		{"-n", inet, "link", "set", "eth0", "up"},
		{"-n", sw, "addr", "add", "198.51.100.254/24", "dev", "ext0"},
		{"-n", inet, "addr", "add", "198.51.100.1/24", "dev", "eth0"},
		{"-n", inet, "route", "add", "192.0.2.0/24", "via", "198.51.100.254"},
	} {
		sh(c...)
	}
	dpd := dpdsim.New(nil, 0)
	if err := dpd.Start("[::1]:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dpd.Close() })
	s, err := boundary.Start(boundary.Options{Netns: "/run/netns/" + sw, TEP: tep, External: "ext0", NAT: dpd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ddmSim := ddmsim.New(nil)
	if err := ddmSim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ddmSim.Close() })
	dc, err := ddm.NewClient(ddmSim.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := dc.AdvertiseTunnelEndpoints(t.Context(), []ddm.TunnelOrigin{{OverlayPrefix: netip.MustParsePrefix("0.0.0.0/0"), BoundaryAddr: tep, VNI: 99}}); err != nil {
		t.Fatal(err)
	}
	// The NTP server outside: who asks it.
	var server *net.UDPConn
	if err := zonenet.RunInPath("/run/netns/"+inet, func() (err error) {
		server, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.51.100.1:123")))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })

	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VPCDataPath: true, UnderlayIP: underlay, DDMURL: ddmSim.URL(), Switches: []string{dpd.Addr()}, NATPeriod: natPeriod}
	tearDownAtEnd(t, cfg)
	a := newAgent(t, cfg)
	run(t, a)
	zones := sledconfigtest.OwnPools(tag, sledconfigtest.BoundaryNTP(7, "[fd00:1122:3344:1e4::5]:123", "198.51.100.1"))
	if err := newClient(t, a).PutConfig(t.Context(), linuxDoc(t, dir, tag, 1, zones...)); err != nil {
		t.Fatal(err)
	}

	buf := make([]byte, 2048)
	server.SetReadDeadline(time.Now().Add(waitDeadline + 30*time.Second))
	_, from, err := server.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("the NTP server outside heard nothing: %v (switch %+v)", err, s.Stats())
	}
	if from.Addr() != netip.MustParseAddr("192.0.2.20") || from.Port() > 16383 {
		t.Errorf("the NTP server outside was asked from %s, want 192.0.2.20 and a port of 0-16383", from)
	}
	// The answer comes back by the zone's NAT entry on the switch, and the
	// data path gives it to the zone.
	port := "service-" + strings.ToLower(zones[0].ZoneType.NIC.ID)
	waitFor(t, "the answer delivered to the zone", func() (bool, string) {
		server.WriteToUDPAddrPort([]byte("an answer"), from)
		st, err := vpcd.NewClient(agent.VPCSocket(cfg)).State(t.Context())
		for _, p := range st.Ports {
			if p.Name == port {
				return p.Stats.InPackets > 0 && p.Stats.Dropped["firewall"] == 0 && p.Stats.Dropped["spoofed"] == 0, fmt.Sprintf("%+v switch %+v", p.Stats, s.Stats())
			}
		}
		return false, fmt.Sprint(err)
	})
	waitFor(t, "the zone's NAT entry on the switch, in VNI 100", func() (bool, string) {
		for _, e := range dpd.Entries() {
			if e.External == netip.MustParseAddr("192.0.2.20") && e.Target.VNI == 100 && e.Target.InternalIP == netip.MustParseAddr(underlay) {
				return true, ""
			}
		}
		return false, "none"
	})
}
