package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet/zonenettest"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// sled-agent vpc shows the data path as opteadm does: its ports (link,
// status, VNI, MAC, addresses), each port's rules, routes, flows and
// attached subnets, and the v2p table; -o json is the data path's state as it gave it.
func TestVPCCommandShowsTheDataPath(t *testing.T) {
	d := lonelyDataPath(t)
	sock := filepath.Join(t.TempDir(), "vpcd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, sock) }()
	defer func() { cancel(); <-served }()
	subnet := netip.MustParsePrefix("172.30.0.0/22")
	c := vpcd.NewClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.EnsurePort(t.Context(), "vna84025f00001", vpcd.PortSpec{Link: vpcd.Link{Name: "vna84025f00001"}, VNI: 7777, MAC: rules.MustMAC("a8:40:25:f0:00:01"),
			IPv4:            &vpcd.IPSpec{Private: netip.MustParseAddr("172.30.0.5"), Subnet: subnet},
			System:          []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}},
			AttachedSubnets: []vpcd.AttachSubnet{{CIDR: netip.MustParsePrefix("203.0.113.0/28"), IsExternal: true}}})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.SetV2P(t.Context(), vpcd.V2P{VirtualIP: netip.MustParseAddr("172.30.0.6"), VirtualMAC: rules.MustMAC("a8:40:25:f0:00:02"), PhysicalHostIP: netip.MustParseAddr("fd00:1122:3344:102::1"), VNI: 7777})

	var out, errOut bytes.Buffer
	if code := run([]string{"vpc", "--socket", sock}, &out, &errOut); code != 0 {
		t.Fatalf("vpc: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"vna84025f00001", "7777", "172.30.0.5 in 172.30.0.0/22", "waiting for its link", "routes:", "172.30.0.0/22", "firewall, inbound (default deny): none", "attached subnets:\n    203.0.113.0/28 (external)", "172.30.0.6", "fd00:1122:3344:102::1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("vpc does not say %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"vpc", "--socket", sock, "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("vpc -o json: exit %d: %s", code, errOut.String())
	}
	var st vpcd.State
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || len(st.Ports) != 1 || len(st.V2P) != 1 {
		t.Errorf("vpc -o json: %v %s", err, out.String())
	}
	// No data path: the command says what it tried.
	errOut.Reset()
	if code := run([]string{"vpc", "--socket", filepath.Join(t.TempDir(), "none.sock")}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "is the data path running?") {
		t.Errorf("vpc without a data path: exit %d: %s", code, errOut.String())
	}
}

// lonelyDataPath starts a data path with no neighbour: its Geneve socket on
// [::1]:6081 of a network namespace of the test's own when it may make one
// (so that tests running at once do not meet), else of this process's.
func lonelyDataPath(t *testing.T) *vpcd.Daemon {
	t.Helper()
	opts := vpcd.Options{Underlay: netip.MustParseAddr("::1")}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("ip"); err == nil {
			ns := zonenettest.Netns(t, "zt")
			exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
			opts.Netns = "/run/netns/" + ns
		}
	}
	d, err := vpcd.Start(opts)
	if err != nil {
		t.Skipf("no Geneve socket on [::1]:6081 here: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
