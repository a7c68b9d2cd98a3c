package boundary

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

var (
	tep      = netip.MustParseAddr("fd00:1122:3344:1::1")
	sledAddr = netip.MustParseAddr("fd00:1122:3344:101::1")
	snatIP   = netip.MustParseAddr("192.0.2.20")
	inetIP   = netip.MustParseAddr("198.51.100.1")
	guestMAC = wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
)

// table is a NAT table of fixed entries.
type table []dpd.NatEntry

func (t table) Lookup(ip netip.Addr, port uint16) (dpd.NatTarget, bool) {
	for _, e := range t {
		if e.External == ip && e.Low <= port && port <= e.High {
			return e.Target, true
		}
	}
	return dpd.NatTarget{}, false
}

// rack makes VPC.md §4.1's switch side in namespaces of the test's own: a
// switch (underlay link holding the tunnel endpoint, external link
// 198.51.100.254/24), a sled (underlay fd00:1122:3344:101::1) and the
// internet (198.51.100.1/24, routing 192.0.2.0/24 via the switch). It
// returns their namespace paths.
func rack(t *testing.T) (sw, sled, inet string) {
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
	for _, ns := range []string{tag + "-sw", tag + "-sled", tag + "-inet"} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	swNS, sledNS, inetNS := tag+"-sw", tag+"-sled", tag+"-inet"
	run(t, "ip", "link", "add", "ul0", "netns", swNS, "type", "veth", "peer", "name", "ul0", "netns", sledNS)
	run(t, "ip", "link", "add", "ext0", "netns", swNS, "type", "veth", "peer", "name", "eth0", "netns", inetNS)
	for _, c := range [][]string{
		{"-n", swNS, "link", "set", "ul0", "up"},
		{"-n", swNS, "link", "set", "ext0", "up"},
		{"-n", sledNS, "link", "set", "ul0", "up"},
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
	return "/run/netns/" + swNS, "/run/netns/" + sledNS, "/run/netns/" + inetNS
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// udpIn opens a UDP socket on addr in the namespace at ns.
func udpIn(t *testing.T, ns string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := zonenet.RunInPath(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A guest's packet, sent by its sled to the tunnel endpoint as OPTE sends
// boundary traffic (VNI 99, inner destination A8:40:25:77:77:77, from the
// guest's SNAT address and port), reaches the internet; the answer, matched
// by the NAT entry of that address and port range, comes back to the sled
// as the switch sends it: the entry's VNI and MAC, inner source MAC 0, the
// External option.
func TestSwitchCarriesASNATFlowBothWays(t *testing.T) {
	swNS, sledNS, inetNS := rack(t)
	nat := table{{External: snatIP, Low: 16384, High: 32767,
		Target: dpd.NatTarget{InternalIP: sledAddr, InnerMAC: dpd.MacAddr(guestMAC), VNI: 7777}}}
	sw, err := Start(Options{Netns: swNS, TEP: tep, External: "ext0", NAT: nat})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	sled, err := netio.ListenUnderlay(sledNS, sledAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer sled.Close()
	echo := udpIn(t, inetNS, netip.AddrPortFrom(inetIP, 7))

	// Out: the guest's UDP datagram, as its sled encapsulates it.
	payload := []byte("to the internet")
	inner := make([]byte, 14+20+8+len(payload))
	wire.PutEthernet(inner, wire.TunnelEndpointMAC, guestMAC, wire.EtherTypeIPv4)
	wire.PutIPv4(inner[14:], snatIP, inetIP, wire.ProtoUDP, 8+len(payload), 63, 1, true)
	wire.PutUDP(inner[34:], 16384, 7, len(payload))
	copy(inner[42:], payload)
	var f wire.Frame
	if err := wire.Parse(inner, &f); err != nil {
		t.Fatal(err)
	}
	f.SetChecksums(inner)
	e := wire.BoundaryEncap(wire.BoundaryServicesVNI, sledAddr, tep, f.FlowKey())
	pkt := make([]byte, 256)
	n, err := e.EncapGeneve(pkt, inner)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The first may wait on neighbour discovery: sent again until
		// it arrives.
		if err := sled.WriteTo(pkt[:n], tep, e.SrcPort); err != nil {
			t.Fatal(err)
		}
		echo.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		m, from, err := echo.ReadFromUDPAddrPort(buf)
		if err == nil {
			if from != netip.AddrPortFrom(snatIP, 16384) || !bytes.Equal(buf[:m], payload) {
				t.Fatalf("the internet got %q from %s", buf[:m], from)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing reached the internet: %v (switch %+v)", err, sw.Stats())
		}
	}

	// Back: the internet answers to the SNAT address and port.
	answer := []byte("from the internet")
	if _, err := echo.WriteToUDPAddrPort(answer, netip.AddrPortFrom(snatIP, 16384)); err != nil {
		t.Fatal(err)
	}
	sled.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, from, err := sled.ReadFrom(buf)
	if err != nil {
		t.Fatalf("nothing came back to the sled: %v (switch %+v)", err, sw.Stats())
	}
	if from != netip.AddrPortFrom(tep, netio.GenevePort) {
		t.Errorf("from %s, want the tunnel endpoint's port 6081", from)
	}
	var d wire.Decap
	if err := wire.DecapGeneve(buf[:m], &d); err != nil {
		t.Fatal(err)
	}
	if d.Geneve.VNI != 7777 || !d.Geneve.External || d.Geneve.HasMSS {
		t.Errorf("Geneve %+v: want VNI 7777 and the External option alone", d.Geneve)
	}
	in := d.Inner(buf[:m])
	if err := wire.Parse(in, &f); err != nil {
		t.Fatal(err)
	}
	if f.Dst != guestMAC || f.Src != (wire.MAC{}) || f.DstIP != snatIP || f.DstPort != 16384 || f.SrcIP != inetIP || !bytes.Equal(in[f.PayloadOff:f.L4End], answer) {
		t.Errorf("inner frame %+v (payload %q): want to %v from MAC 0, %s:16384 from %s", f, in[f.PayloadOff:f.L4End], guestMAC, snatIP, inetIP)
	}

	// Outside the entry's ports: nothing goes to the sled.
	echo.WriteToUDPAddrPort(answer, netip.AddrPortFrom(snatIP, 40000))
	waitStats(t, sw, func(s Stats) bool { return s.NoEntry >= 1 })
	if st := sw.Stats(); st.Egress < 1 || st.Ingress != 1 {
		t.Errorf("stats %+v: want at least one egress, one ingress", st)
	}
}

func waitStats(t *testing.T, sw *Switch, ok func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(sw.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("switch stats %+v", sw.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
