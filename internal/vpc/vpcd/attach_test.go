package vpcd

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// Attached subnets over the local API: a port made with one, another
// attached, the same again and a detach of one it does not have changing
// nothing; the state shows the port's set; a subnet of a family the port
// has no address in is a 400 and changes nothing; an unknown port a 404.
func TestAPIAttachedSubnets(t *testing.T) {
	d := lonelyDataPath(t)
	c := serveAPI(t, d)
	vpc := netip.MustParsePrefix("10.1.0.0/24")
	ext := netip.MustParsePrefix("203.0.113.0/28")
	spec := PortSpec{Link: Link{Name: "vnNotThere"}, VNI: 7777, MAC: rules.MustMAC("a8:40:25:f0:00:01"),
		IPv4:            &IPSpec{Private: netip.MustParseAddr("172.30.0.5"), Subnet: netip.MustParsePrefix("172.30.0.0/22")},
		AttachedSubnets: []AttachSubnet{{CIDR: vpc}}}
	if err := c.EnsurePort(t.Context(), "p1", spec); err != nil {
		t.Fatal(err)
	}
	have := func(want ...AttachSubnet) {
		t.Helper()
		st, err := c.State(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := st.Ports[0].Spec.AttachedSubnets
		p, _ := d.Port("p1")
		if len(got) != len(want) || len(p.AttachedSubnets()) != len(want) {
			t.Fatalf("attached subnets %+v (the port's %+v), want %+v", got, p.AttachedSubnets(), want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("attached subnet %d: %+v, want %+v", i, got[i], want[i])
			}
		}
	}
	have(AttachSubnet{CIDR: vpc})
	for range 2 {
		if err := c.AttachSubnet(t.Context(), "p1", AttachSubnet{CIDR: ext, IsExternal: true}); err != nil {
			t.Fatal(err)
		}
	}
	have(AttachSubnet{CIDR: vpc}, AttachSubnet{CIDR: ext, IsExternal: true})
	for range 2 {
		if err := c.DetachSubnet(t.Context(), "p1", DetachSubnet{CIDR: vpc}); err != nil {
			t.Fatal(err)
		}
	}
	have(AttachSubnet{CIDR: ext, IsExternal: true})
	var ae *APIError
	if err := c.AttachSubnet(t.Context(), "p1", AttachSubnet{CIDR: netip.MustParsePrefix("fd00:1::/64")}); !errors.As(err, &ae) || ae.Status != 400 {
		t.Errorf("an IPv6 subnet on an IPv4 port: %v", err)
	}
	have(AttachSubnet{CIDR: ext, IsExternal: true})
	if err := c.AttachSubnet(t.Context(), "nope", AttachSubnet{CIDR: vpc}); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("an unknown port: %v", err)
	}
	// The port made again with its spec: the spec's set, exactly.
	if err := c.EnsurePort(t.Context(), "p1", spec); err != nil {
		t.Fatal(err)
	}
	have(AttachSubnet{CIDR: vpc})
	// A spec for the port whose subnet it would refuse changes nothing of
	// it: not its firewall either, which comes before the subnets.
	bad := spec
	bad.Firewall = []rules.FirewallRule{{Status: rules.Enabled, Direction: rules.Inbound, Action: rules.RuleAllow, Priority: 100}}
	bad.AttachedSubnets = []AttachSubnet{{CIDR: netip.MustParsePrefix("fd00:1::/64")}}
	if err := c.EnsurePort(t.Context(), "p1", bad); !errors.As(err, &ae) || ae.Status != 400 {
		t.Errorf("a spec with an IPv6 subnet on an IPv4 port: %v", err)
	}
	have(AttachSubnet{CIDR: vpc})
	if p, _ := d.Port("p1"); len(p.Firewall().Rules(rules.In)) != 0 {
		t.Errorf("the refused spec's firewall was applied: %+v", p.Firewall().Rules(rules.In))
	}
}
