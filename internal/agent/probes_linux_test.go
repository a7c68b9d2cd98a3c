package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// A probe told with PUT /probes is a zone whose NIC's host end is its
// port's link: the port attaches, with upstream's one rule; the zone
// outlives the agent and a restarted agent keeps it (the same link); the
// empty set removes the zone, namespace and link.
func TestLinuxProbeIsAZoneWithAPort(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix,
		VPCDataPath: true, UnderlayIP: "fd00:1122:3344:1de::1"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := agent.Teardown(ctx, cfg, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
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
