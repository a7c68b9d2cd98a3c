package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
)

// The rack of VPC.md §4.1: the sleds' underlay links meet on a bridge in a
// namespace of the rack's own, and the switch's underlay link with them.
const (
	// tunnelEndpoint is the switch's tunnel endpoint on the underlay.
	tunnelEndpoint = "fd00:1122:3344:1::1"
	// sledDDM is where each sled's routing daemon (simulated) listens, in
	// the sled's namespace, as ddmd does on a sled.
	sledDDM = "[::1]:8000"
	// internetIP is the host outside the rack, behind the switch's
	// external link; the rack's external addresses are routed to it.
	internetIP = "198.51.100.1"
)

// rack is the rack's namespace, holding the underlay's bridge br0.
type rack struct{ ns string }

// newRack makes the rack's namespace (base+"-rack") and its bridge.
func newRack(t *testing.T, base string) *rack {
	t.Helper()
	r := &rack{ns: base + "-rack"}
	ip(t, "netns", "add", r.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", r.ns).Run() })
	// No multicast snooping: neighbour discovery's solicitations reach
	// every port, as on a switch that does not snoop MLD.
	ip(t, "-n", r.ns, "link", "add", "br0", "mtu", "9000", "type", "bridge", "mcast_snooping", "0")
	ip(t, "-n", r.ns, "link", "set", "br0", "up")
	return r
}

// plug links the namespace ns to the rack's bridge: ul0 there (MTU 9000,
// up), end on the bridge.
func (r *rack) plug(t *testing.T, ns, end string) {
	t.Helper()
	ip(t, "link", "add", "ul0", "netns", ns, "type", "veth", "peer", "name", end, "netns", r.ns)
	ip(t, "-n", r.ns, "link", "set", "dev", end, "mtu", "9000", "master", "br0", "up")
	ip(t, "-n", ns, "link", "set", "ul0", "mtu", "9000", "up")
}

// rackSwitch is the rack's switch, as VPC.md §4.1 draws it: its namespace
// on the underlay with the tunnel endpoint, its external link ext0 to the
// internet's namespace (internetIP/24, the rack's 192.0.2.0/24 routed
// back through the switch), the switch daemon simulated with its boundary
// services data path (sled-agent sim dpd --tep --external --netns), and
// the tunnel endpoint advertised to every sled's routing daemon, as mgd
// does.
type rackSwitch struct {
	ns, inet string // the switch's and the internet's namespaces (paths)
	dpd      string // the switch daemon's API (base URL)
}

// addSwitch makes the switch for sleds, before their agents start: they
// find their routing daemon with the tunnel endpoint in it.
func (r *rack) addSwitch(t *testing.T, base string, sleds []*vpcSled) *rackSwitch {
	t.Helper()
	swNS, inetNS := base+"-sw", base+"-inet"
	for _, ns := range []string{swNS, inetNS} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	r.plug(t, swNS, "sw")
	for _, c := range [][]string{
		{"-n", swNS, "addr", "add", tunnelEndpoint + "/64", "dev", "ul0", "nodad"},
		{"-n", swNS, "route", "add", "fd00:1122:3344::/48", "dev", "ul0"},
		{"link", "add", "ext0", "netns", swNS, "type", "veth", "peer", "name", "eth0", "netns", inetNS},
		{"-n", swNS, "link", "set", "ext0", "up"},
		{"-n", inetNS, "link", "set", "eth0", "up"},
		{"-n", swNS, "addr", "add", "198.51.100.254/24", "dev", "ext0"},
		{"-n", inetNS, "addr", "add", internetIP + "/24", "dev", "eth0"},
		{"-n", inetNS, "route", "add", "192.0.2.0/24", "via", "198.51.100.254"},
	} {
		ip(t, c...)
	}
	sw := &rackSwitch{ns: "/run/netns/" + swNS, inet: "/run/netns/" + inetNS}
	// The internet's frames whole, with their checksums: the switch
	// carries them as they are.
	if err := netio.DisableOffloads(sw.inet, "eth0"); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	sw.dpd = "http://" + addr
	_, out := startBinary(t, "sim", "dpd", "--listen", addr, "--tep", tunnelEndpoint, "--external", "ext0", "--netns", sw.ns)
	deadline := time.Now().Add(waitDeadline)
	for {
		// Its API answers once its data path is up.
		resp, err := http.Get(sw.dpd + "/__sim/state")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the switch daemon did not come up: %v\n%s", err, out)
		}
		time.Sleep(waitInterval)
	}
	for _, s := range sleds {
		d := ddmsim.New(nil)
		if err := zonenet.RunInPath("/run/netns/"+s.ns, func() error { return d.Start(sledDDM) }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		// mgd's part: the switch's tunnel endpoint for every destination.
		code, body := httpDo(t, s.hc, http.MethodPut, "http://"+sledDDM+"/tunnel_endpoint", ddmsim.APIVersion,
			`[{"overlay_prefix":"0.0.0.0/0","boundary_addr":"`+tunnelEndpoint+`","vni":99,"metric":0}]`)
		if code != http.StatusNoContent && code != http.StatusOK {
			t.Fatalf("sled %s: advertising the tunnel endpoint: %d %s", s.tag, code, body)
		}
	}
	return sw
}

// nat puts a NAT entry on the switch as Nexus does (PUT
// /nat/ipv4/{ip}/{low}/{high}): external ip's ports low-high go to the
// guest of mac (a8:40:25:…) on sled underlay in vni.
func (sw *rackSwitch) nat(t *testing.T, external string, low, high int, underlay, mac string, vni int) {
	t.Helper()
	var b [6]int
	if _, err := fmt.Sscanf(mac, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"internal_ip":%q,"inner_mac":{"a":[%d,%d,%d,%d,%d,%d]},"vni":%d}`, underlay, b[0], b[1], b[2], b[3], b[4], b[5], vni)
	code, out := httpDo(t, http.DefaultClient, http.MethodPut, fmt.Sprintf("%s/nat/ipv4/%s/%d/%d", sw.dpd, external, low, high), dpdsim.APIVersion, body)
	if code != http.StatusOK && code != http.StatusNoContent {
		t.Fatalf("switch NAT entry for %s: %d %s", external, code, out)
	}
}

// httpDo sends one request with an api-version header and a JSON body.
func httpDo(t *testing.T, hc *http.Client, method, url, version, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("api-version", version)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
