package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// defaultRules are Nexus's default rules of a new VPC for the guests'
// NICs in vni.
func defaultRules(vni int, gs ...*acceptGuest) string {
	var nics []string
	for _, g := range gs {
		nics = append(nics, g.nicJSON())
	}
	return defaultVPCRules(vni, nics...)
}

// VPC.md S1 and S2 at agent level: two guests registered and run on two
// sleds as Nexus does; before any route, the sled lists the RouterIDs its
// port needs (no version), no v2p mapping, a datagram from A to B is
// dropped by the router layer, and the gateway answers A's ARP request
// with its MAC and A's ICMP echo. With the routes in the system router's
// version 3, the sleds list that version and A's datagrams to B are
// dropped by the overlay for want of a mapping; version 2 of the same
// router, without the subnet's route, is not applied: the sleds still list
// version 3, and once the mappings are pushed A's datagrams reach B.
func TestVPCAcceptRoutes(t *testing.T) {
	sa, sb := twoSleds(t, "--vmm-stand-in")
	sleds := []*vpcSled{sa, sb}
	n := newNexus(t)
	a, b := sledGuest("a", sa), sledGuest("b", sb)
	a.register(n, defaultRules(7777, a, b), "192.0.2.20")
	b.register(n, defaultRules(7777, a, b), "192.0.2.21")
	findGuests(t, a, b)
	debug := dataPaths(sa, sb)
	var ids []string
	var got []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(n.must(sa, http.StatusOK, http.MethodGet, "/vpc-routes", "")), &got); err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if v, ok := r["version"]; ok && string(v) != "null" {
			t.Errorf("route set %s has version %s before any push", r["id"], v)
		}
		ids = append(ids, string(r["id"]))
	}
	slices.Sort(ids)
	want := []string{`{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}}`, `{"vni":7777,"kind":{"type":"system"}}`}
	if !slices.Equal(ids, want) {
		t.Errorf("GET /vpc-routes ids %v, want %v", ids, want)
	}
	if v2p := n.must(sa, http.StatusOK, http.MethodGet, "/v2p", ""); strings.TrimSpace(v2p) != "[]" {
		t.Errorf("GET /v2p = %s, want []", v2p)
	}
	newUDPEcho(t, b.ns, b.ip+":5000", "B")
	udpAB := func() probe { return newUDPProbe(t, a.ns, a.ip+":0", b.ip+":5000") }
	droppedProbe(t, "S1: A to B before routes", udpAB(), a, "no route", debug)
	answeredProbe(t, "S1: A to its gateway", newICMPProbe(t, a.ns, "172.30.0.1"), debug)
	if got := gatewayARP(t, a, debug); got.String() != gatewayMAC {
		t.Errorf("S1: A's ARP request for its gateway answered with %s, want %s", got, gatewayMAC)
	}

	n.all(sleds, http.MethodPut, "/vpc-routes", vpcRoutes)
	for _, s := range sleds {
		checkRouteVersions(t, n, s, 3)
	}
	droppedProbe(t, "S2: A to B with routes, before any mapping", udpAB(), a, "no v2p mapping", debug)
	n.all(sleds, http.MethodPut, "/vpc-routes", staleRoutes)
	for _, s := range sleds {
		checkRouteVersions(t, n, s, 3)
	}
	for _, g := range []*acceptGuest{a, b} {
		n.all(sleds, http.MethodPut, "/v2p", g.v2p())
	}
	answeredProbe(t, "S2: A to B, version 3's routes kept", udpAB(), debug)
}

// dataPaths is what the sleds' data paths hold, for a failure's message.
func dataPaths(sleds ...*vpcSled) func() string {
	return func() string {
		var out []string
		for _, s := range sleds {
			out = append(out, s.dataPathState())
		}
		return strings.Join(out, "\n")
	}
}

// vpcRoutes are the route sets of VPC.md S2 for VNI 7777, without the
// internet gateway: the subnet, in the system router's version 3.
const vpcRoutes = `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":3},"routes":[{"dest":"172.30.0.0/22","target":{"type":"vpc_subnet","value":"172.30.0.0/22"}}]},` +
	`{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`

// staleRoutes are an earlier version (2) of vpcRoutes' system router,
// without the subnet's route: the version gate keeps it out.
const staleRoutes = `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":{"router_id":"5e5e0c5e-0000-4000-8000-000000000001","version":2},"routes":[]},` +
	`{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null,"routes":[]}]`

// VPC.md S3 and S4 at agent level. With the routes and v2p mappings
// pushed, the sleds list the mappings, and ICMP, UDP and TCP cross the
// sleds: on the rack's bridge as OPTE's Geneve in VNI 7777 from A's MAC to
// B's, and into B's guest from the gateway's MAC. Pushing a mapping again
// changes nothing; deleting B's drops a new flow from A at A's port until
// it is back. Then the VPC's rules as Nexus pushes them: allow-ssh alone
// drops ICMP and UDP at B's port by its firewall while TCP to port 22
// flows, answers included (stateful); a deny of ICMP from A at priority
// 100 beats the allows at 65534, while UDP from A and ICMP from B still
// pass; at equal priority (65534) the deny still wins; the defaults again
// let ICMP through.
func TestVPCAcceptFirewall(t *testing.T) {
	sa, sb := twoSleds(t, "--vmm-stand-in")
	sleds := []*vpcSled{sa, sb}
	n := newNexus(t)
	a, b := sledGuest("a", sa), sledGuest("b", sb)
	defaults := defaultRules(7777, a, b)
	a.register(n, defaults, "192.0.2.20")
	b.register(n, defaults, "192.0.2.21")
	findGuests(t, a, b)
	debug := dataPaths(sa, sb)
	n.all(sleds, http.MethodPut, "/vpc-routes", vpcRoutes)
	for _, g := range []*acceptGuest{a, b} {
		n.all(sleds, http.MethodPut, "/v2p", g.v2p())
	}
	for _, s := range sleds {
		checkV2P(t, n, s, a, b)
	}
	newUDPEcho(t, b.ns, b.ip+":5000", "B")
	tcpServe(t, b.ns, b.ip+":22", "B")
	icmpAB := func() probe { return newICMPProbe(t, a.ns, b.ip) }
	udpAB := func() probe { return newUDPProbe(t, a.ns, a.ip+":0", b.ip+":5000") }
	onRack, atB := startCapture(t, sa.rack, "br0"), startCapture(t, b.ns, "eth0")
	answeredProbe(t, "S3: ICMP A to B", icmpAB(), debug)
	answeredProbe(t, "S3: UDP A to B", udpAB(), debug)
	tcpBanner(t, "S3: TCP A to B", a.ns, b.ip+":22", debug)
	answeredProbe(t, "S3: ICMP B to A", newICMPProbe(t, b.ns, a.ip), debug)
	checkOverlay(t, onRack, a, b)
	checkFromGateway(t, atB, a, b)

	// The same mapping again changes nothing; without B's, a new flow
	// from A to B is dropped at A's port, and with it again it flows.
	n.all(sleds, http.MethodPut, "/v2p", b.v2p())
	for _, s := range sleds {
		checkV2P(t, n, s, a, b)
	}
	n.all(sleds, http.MethodDelete, "/v2p", b.v2p())
	for _, s := range sleds {
		checkV2P(t, n, s, a)
	}
	droppedProbe(t, "S3: UDP A to B, B's mapping deleted", udpAB(), a, "no v2p mapping", debug)
	n.all(sleds, http.MethodPut, "/v2p", b.v2p())
	answeredProbe(t, "S3: UDP A to B, B's mapping back", udpAB(), debug)

	firewall := func(rules string) {
		t.Helper()
		n.all(sleds, http.MethodPut, "/vpc/9b5e0c5e-0000-4000-8000-000000000001/firewall/rules", `{"vni":7777,"rules":`+rules+`}`)
	}
	var all []json.RawMessage
	if err := json.Unmarshal([]byte(defaults), &all); err != nil {
		t.Fatal(err)
	}
	firewall("[" + string(all[1]) + "]") // allow-ssh alone
	droppedProbe(t, "S4: ICMP A to B, allow-ssh alone", icmpAB(), b, "firewall", debug)
	droppedProbe(t, "S4: UDP A to B, allow-ssh alone", udpAB(), b, "firewall", debug)
	tcpBanner(t, "S4: TCP A to B port 22, allow-ssh alone", a.ns, b.ip+":22", debug)

	deny := func(priority int) string {
		return fmt.Sprintf(`{"status":"enabled","direction":"inbound","targets":[%s],"filter_hosts":[{"type":"ip","value":"%s/32"}],`+
			`"filter_protocols":[{"type":"icmp","value":null}],"action":"deny","priority":%d}`, b.nicJSON(), a.ip, priority)
	}
	withDeny := func(priority int) string { return strings.TrimSuffix(defaults, "]") + "," + deny(priority) + "]" }
	firewall(withDeny(100))
	droppedProbe(t, "S4: ICMP A to B, denied at 100", icmpAB(), b, "firewall", debug)
	answeredProbe(t, "S4: UDP A to B beside the deny", udpAB(), debug)
	answeredProbe(t, "S4: ICMP B to A beside the deny", newICMPProbe(t, b.ns, a.ip), debug)
	firewall(withDeny(65534))
	droppedProbe(t, "S4: ICMP A to B, deny and allow both at 65534", icmpAB(), b, "firewall", debug)
	firewall(defaults)
	answeredProbe(t, "S4: ICMP A to B, the defaults again", icmpAB(), debug)
}

// VPC.md S5 at agent level: guest D on sled A, in another VPC (VNI 8888)
// with the very address of B, its own rules, routes and v2p mapping pushed
// as Nexus pushes them. A's datagrams to that address reach B, never D; D
// has no mapping for A's address in its VPC and its datagrams are dropped
// at its port; Geneve handcrafted on the rack's bridge in VNI 8888 to B's
// MAC is dropped by B's data path, while the same in VNI 7777 reaches B;
// sled A lists D's VPC's RouterIDs too.
func TestVPCAcceptIsolation(t *testing.T) {
	sa, sb := twoSleds(t, "--vmm-stand-in")
	sleds := []*vpcSled{sa, sb}
	n := newNexus(t)
	a, b := sledGuest("a", sa), sledGuest("b", sb)
	d := &acceptGuest{name: "d", sled: sa, vmm: "d0000000-0000-4000-8000-0000000000a1", nic: "d0000000-0000-4000-8000-0000000000c1",
		instance: "d0000000-0000-4000-8000-000000000001", mac: sa.mac[:len(sa.mac)-2] + "04", ip: b.ip, vni: 8888,
		addr: strings.Replace(sa.addr, "::10]", "::11]", 1)}
	defaults := defaultRules(7777, a, b)
	a.register(n, defaults, "192.0.2.20")
	b.register(n, defaults, "192.0.2.21")
	d.register(n, defaultRules(8888, d), "192.0.2.22")
	findGuests(t, a, b, d)
	debug := dataPaths(sa, sb)
	n.all(sleds, http.MethodPut, "/vpc-routes", vpcRoutes)
	n.all(sleds, http.MethodPut, "/vpc-routes", strings.ReplaceAll(vpcRoutes, "7777", "8888"))
	for _, g := range []*acceptGuest{a, b, d} {
		n.all(sleds, http.MethodPut, "/v2p", g.v2p())
	}
	atB := newUDPEcho(t, b.ns, b.ip+":5000", "B")
	atD := newUDPEcho(t, d.ns, d.ip+":5000", "D")
	newUDPEcho(t, a.ns, a.ip+":5000", "A")
	answeredProbe(t, "S5: UDP A to "+b.ip, newUDPProbe(t, a.ns, a.ip+":0", b.ip+":5000"), debug)
	if atB.heard.Load() == 0 || atD.heard.Load() != 0 {
		t.Fatalf("A's datagrams to %s: B heard %d, D heard %d; want B's alone", b.ip, atB.heard.Load(), atD.heard.Load())
	}
	droppedProbe(t, "S5: UDP D to "+a.ip, newUDPProbe(t, d.ns, d.ip+":0", a.ip+":5000"), d, "no v2p mapping", debug)

	// Geneve put on the rack's bridge as if from sled A, a datagram to B's
	// address and MAC: in VNI 8888 B's sled has no port for it and drops
	// it; the same but for the VNI (and its payload, saying which) reaches
	// B in VNI 7777. Sent after the first, the second is read after it by
	// B's data path: once B has it, the first was dropped for good.
	sink := newUDPSink(t, b.ns, b.ip+":5001")
	inject := newInjector(t, sa, sb)
	before := sb.unmatched(t)
	for deadline := time.Now().Add(waitDeadline); ; time.Sleep(waitInterval) {
		inject.udp(t, 8888, a, b, 5001, "in VNI 8888")
		if sb.unmatched(t) > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("S5: Geneve in VNI 8888 to B's MAC: B's data path counts no drop for it\n%s", debug())
		}
	}
	for deadline := time.Now().Add(waitDeadline); ; time.Sleep(waitInterval) {
		inject.udp(t, 7777, a, b, 5001, "in VNI 7777")
		if sink.heard("in VNI 7777") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("S5: Geneve in VNI 7777 to B's MAC never reached B\n%s", debug())
		}
	}
	if n := sink.heard("in VNI 8888"); n != 0 {
		t.Errorf("S5: Geneve in VNI 8888 to B's MAC reached B %d times, want never", n)
	}
	var got []struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal([]byte(n.must(sa, http.StatusOK, http.MethodGet, "/vpc-routes", "")), &got); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, string(r.ID))
	}
	for _, want := range []string{`{"vni":8888,"kind":{"type":"system"}}`, `{"vni":8888,"kind":{"type":"custom","subnet":"172.30.0.0/22"}}`} {
		if !slices.Contains(ids, want) {
			t.Errorf("GET /vpc-routes on sled A: %v, want %s among them", ids, want)
		}
	}
}
