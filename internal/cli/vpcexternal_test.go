package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// What VPC.md S6 pushes besides the VPC's own routes: the system router's
// default routes to the VPC's internet gateway (an instance of one, as a
// user's VPC has), and the gateway each of the guest's external addresses
// may leave through.
const (
	igwID = "1a5e0c5e-0000-4000-8000-0000000000a1"
	// igwRoutes are vpcRoutes with 0.0.0.0/0 and ::/0 to the gateway.
	igwRoutes = `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[` +
		`{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}},` +
		`{"dest":"0.0.0.0/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"` + igwID + `"}}},` +
		`{"dest":"::/0","target":{"type":"internet_gateway","value":{"type":"instance","value":"` + igwID + `"}}}]},` +
		`{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`
)

// eipGateways is PUT /eip-gateways's body as Nexus's route manager sends
// it for g: each of the external addresses ips leaves through the VPC's
// internet gateway.
func eipGateways(g *acceptGuest, ips ...string) string {
	m := map[string][]string{}
	for _, ip := range ips {
		m[ip] = []string{igwID}
	}
	b, _ := json.Marshal(map[string]any{"mappings": map[string]any{g.nic: m}})
	return string(b)
}

// switchState is what the switch daemon (simulated) holds, for a failure's
// message.
func (sw *rackSwitch) state() string {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(sw.dpd + "/__sim/state")
	if err != nil {
		return "switch: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return "switch: " + string(b)
}

// sawFrom parses an inet echo's answer ("inet saw <addr:port>").
func sawFrom(t *testing.T, what, answer string, debug func() string) netip.AddrPort {
	t.Helper()
	s, ok := strings.CutPrefix(answer, "inet saw ")
	ap, err := netip.ParseAddrPort(s)
	if !ok || err != nil {
		t.Fatalf("%s: the internet's echo answered %q, want \"inet saw <addr:port>\"\n%s", what, answer, debug())
	}
	return ap
}

// VPC.md S6 at agent level: guest A on sled A reaches the internet through
// the rack's switch (simulated: its boundary services and its NAT
// entries, put as Nexus puts them), with the sled told by Nexus's
// operations only. Outbound UDP leaves through source NAT (the switch's
// tunnel endpoint, VNI 99, its MAC), and not at all once the address is
// no longer mapped to the route's gateway; an ephemeral address, attached
// and detached, takes inbound ICMP and TCP 22 through A's firewall (UDP is
// dropped there), and A's new flows once mapped to the gateway; a
// floating address beats it; an unknown VMM is upstream's 404.
func TestVPCAcceptExternal(t *testing.T) {
	sa, _, sw := rackOfSleds(t, true, "--vmm-stand-in")
	n := newNexus(t)
	a := sledGuest("a", sa)
	sw.nat(t, "192.0.2.20", 16384, 32767, sa.underlay, a.mac, 7777)
	a.register(n, defaultRules(7777, a), "192.0.2.20")
	findGuests(t, a)
	debug := func() string { return dataPaths(sa)() + "\n" + sw.state() }
	// Nexus's route manager: the gateways of the addresses, then the routes.
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", eipGateways(a, "192.0.2.20"))
	n.must(sa, http.StatusNoContent, http.MethodPut, "/vpc-routes", igwRoutes)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/v2p", a.v2p())

	newUDPEcho(t, sw.inet, internetIP+":7", "inet")
	toInet := func() *udpProbe { return newUDPProbe(t, a.ns, a.ip+":0", internetIP+":7") }
	// outbound sends a new flow from A to the internet's echo until
	// answered, and returns the source the internet saw and A's port.
	outbound := func(what string) (netip.AddrPort, uint16) {
		t.Helper()
		p := toInet()
		answeredProbe(t, what, p, debug)
		from, port := sawFrom(t, what, p.last, debug), p.c.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort().Port()
		t.Logf("%s: A's port %d, the internet saw %s", what, port, from)
		return from, port
	}
	snatSeen := func(what string) {
		t.Helper()
		from, _ := outbound(what)
		if from.Addr() != netip.MustParseAddr("192.0.2.20") || from.Port() < 16384 || from.Port() > 32767 {
			t.Fatalf("%s: the internet saw %s, want 192.0.2.20 and a port in 16384-32767\n%s", what, from, debug())
		}
	}
	externalSeen := func(what, ip string) {
		t.Helper()
		from, port := outbound(what)
		if want := netip.AddrPortFrom(netip.MustParseAddr(ip), port); from != want {
			t.Fatalf("%s: the internet saw %s, want %s (the guest's port, 1:1)\n%s", what, from, want, debug())
		}
	}

	// 1. Source NAT, and the frame toward the switch.
	ul := startCapture(t, sw.ns, "ul0")
	snatSeen("S6.1: UDP A to the internet")
	tep, sled := netip.MustParseAddr(tunnelEndpoint), netip.MustParseAddr(sa.underlay)
	g, ok := ul.waitGeneve(5*time.Second, func(g *underlayPacket) bool {
		return g.d.Src == sled && g.d.Dst == tep && g.inner.HasL4 && g.inner.Proto == wire.ProtoUDP &&
			g.inner.DstIP == netip.MustParseAddr(internetIP) && g.inner.DstPort == 7
	})
	switch {
	case !ok:
		t.Fatalf("S6.1: the switch's ul0 received no Geneve from %s to %s with UDP to the internet's echo\n%s", sled, tep, debug())
	case g.d.Geneve.VNI != wire.BoundaryServicesVNI || g.inner.Dst != wire.TunnelEndpointMAC || g.inner.SrcIP != netip.MustParseAddr("192.0.2.20") || g.d.UDPChecksum != 0:
		t.Fatalf("S6.1: the frame to the tunnel endpoint has VNI %d, inner dst MAC %s, inner src %s, outer UDP checksum %#04x; want VNI 99, %s, 192.0.2.20, 0",
			g.d.Geneve.VNI, g.inner.Dst, g.inner.SrcIP, g.d.UDPChecksum, wire.TunnelEndpointMAC)
	case g.d.SrcPort != g.inner.FlowKey().Entropy() || g.d.HopLimit != wire.OPTEHopLimit:
		t.Fatalf("S6.1: the frame to the tunnel endpoint is from UDP port %d with hop limit %d; want the hash of the flow after NAT, %d, and %d",
			g.d.SrcPort, g.d.HopLimit, g.inner.FlowKey().Entropy(), wire.OPTEHopLimit)
	}

	// The address no longer mapped to the route's gateway: new flows are
	// dropped by A's NAT layer.
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", `{"mappings":{}}`)
	droppedProbe(t, "S6.1: UDP A to the internet, its address mapped to no gateway", toInet(), a, "no external address for the flow", debug)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", eipGateways(a, "192.0.2.20"))
	snatSeen("S6.1: UDP A to the internet, the gateway map restored")

	// 2. An ephemeral address: the switch first, then the sled, as the
	// attach saga does; then Nexus's route manager maps it to the gateway.
	const eph = `{"type":"ephemeral","value":"192.0.2.10"}`
	sw.nat(t, "192.0.2.10", 0, 65535, sa.underlay, a.mac, 7777)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/vmms/"+a.vmm+"/external-ip", eph)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/vmms/"+a.vmm+"/external-ip", eph)
	if out := n.must(sa, http.StatusInternalServerError, http.MethodPut, "/vmms/"+a.vmm+"/external-ip", `{"type":"ephemeral","value":"192.0.2.11"}`); !strings.Contains(out, "192.0.2.10") {
		t.Errorf("S6.2: a second ephemeral address: %s, want the one attached named", out)
	}
	// Until the map holds it, the address leaves through the system
	// gateway only, which no route names: new flows keep source NAT.
	snatSeen("S6.2: UDP A to the internet, the ephemeral address attached but mapped to no gateway")
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", eipGateways(a, "192.0.2.20", "192.0.2.10"))
	tcpServe(t, a.ns, a.ip+":22", "A")
	newUDPEcho(t, a.ns, a.ip+":5000", "A")
	answeredProbe(t, "S6.2: ICMP echo from the internet to the ephemeral address", newICMPProbe(t, sw.inet, "192.0.2.10"), debug)
	if banner := tcpBanner(t, "S6.2: TCP from the internet to the ephemeral address's port 22", sw.inet, "192.0.2.10:22", debug); !strings.HasPrefix(banner, "SSH-2.0-A "+internetIP+":") {
		t.Fatalf("S6.2: TCP 22 through the ephemeral address: banner %q, want A's, seeing the internet's address", banner)
	}
	droppedProbe(t, "S6.2: UDP from the internet to the ephemeral address's port 5000", newUDPProbe(t, sw.inet, internetIP+":0", "192.0.2.10:5000"), a, "firewall", debug)
	externalSeen("S6.2: UDP A to the internet with an ephemeral address", "192.0.2.10")

	// Detached, before Nexus's route manager drops it from the map.
	n.must(sa, http.StatusNoContent, http.MethodDelete, "/vmms/"+a.vmm+"/external-ip", eph)
	n.must(sa, http.StatusNoContent, http.MethodDelete, "/vmms/"+a.vmm+"/external-ip", eph)
	snatSeen("S6.2: UDP A to the internet, the ephemeral address detached")
	droppedProbe(t, "S6.2: ICMP echo from the internet to the detached ephemeral address", newICMPProbe(t, sw.inet, "192.0.2.10"), a, "spoofed", debug)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", eipGateways(a, "192.0.2.20"))

	// 3. A floating address beside the ephemeral one: it takes inbound
	// traffic, and A's new flows (floating before ephemeral before
	// source NAT); detached, the ephemeral one takes them again.
	const fip = `{"type":"floating","value":"192.0.2.12"}`
	sw.nat(t, "192.0.2.12", 0, 65535, sa.underlay, a.mac, 7777)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/vmms/"+a.vmm+"/external-ip", eph)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/vmms/"+a.vmm+"/external-ip", fip)
	n.must(sa, http.StatusNoContent, http.MethodPut, "/eip-gateways", eipGateways(a, "192.0.2.20", "192.0.2.10", "192.0.2.12"))
	answeredProbe(t, "S6.3: ICMP echo from the internet to the floating address", newICMPProbe(t, sw.inet, "192.0.2.12"), debug)
	if banner := tcpBanner(t, "S6.3: TCP from the internet to the floating address's port 22", sw.inet, "192.0.2.12:22", debug); !strings.HasPrefix(banner, "SSH-2.0-A "+internetIP+":") {
		t.Fatalf("S6.3: TCP 22 through the floating address: banner %q, want A's, seeing the internet's address", banner)
	}
	externalSeen("S6.3: UDP A to the internet with a floating and an ephemeral address", "192.0.2.12")
	n.must(sa, http.StatusNoContent, http.MethodDelete, "/vmms/"+a.vmm+"/external-ip", fip)
	externalSeen("S6.3: UDP A to the internet, the floating address detached", "192.0.2.10")
	droppedProbe(t, "S6.3: ICMP echo from the internet to the detached floating address", newICMPProbe(t, sw.inet, "192.0.2.12"), a, "spoofed", debug)

	// 4. An unknown VMM.
	unknown := uuid.New()
	out := n.must(sa, http.StatusNotFound, http.MethodPut, "/vmms/"+unknown.String()+"/external-ip", eph)
	var e struct {
		ErrorCode string `json:"error_code"`
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.ErrorCode != "NO_SUCH_INSTANCE" {
		t.Fatalf("S6.4: PUT /vmms/%s/external-ip: %s, want error_code NO_SUCH_INSTANCE", unknown, out)
	}
}
