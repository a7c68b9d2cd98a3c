package vpcd

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vpc/engine"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// A port's external addresses in its spec, as upstream's ExternalIpConfig
// reads in JSON, and the gateway map: EnsurePort applies a change to them
// on the port as it is (no new port), refuses addresses of a family the
// port lacks with nothing changed.
func TestEnsurePortExternalIPs(t *testing.T) {
	d := lonelyDataPath(t)
	var spec PortSpec
	if err := json.Unmarshal([]byte(`{"link":{"netns":"","name":"vnNotThere"},"vni":7777,"mac":"A8:40:25:F0:00:01",
 "ipv4":{"private":"172.30.0.5","subnet":"172.30.0.0/22"},"service":false,"firewall_rules":[],
 "system_routes":[{"dest":"0.0.0.0/0","target":{"type":"internet_gateway","value":{"type":"system"}}}],"custom_routes":[],
 "external_ips":{"v4":{"source_nat":{"ip":"192.0.2.20","first_port":16384,"last_port":32767},"ephemeral_ip":null,"floating_ips":[]}}}`), &spec); err != nil {
		t.Fatal(err)
	}
	if err := d.EnsurePort("p1", spec); err != nil {
		t.Fatal(err)
	}
	p, _ := d.Port("p1")
	want := engine.External{IPv4: &engine.ExternalIPs{SNAT: &engine.SNAT{IP: netip.MustParseAddr("192.0.2.20"), First: 16384, Last: 32767}, Floating: []netip.Addr{}}}
	if got := p.ExternalIPs(); !got.Equal(want) {
		t.Fatalf("external addresses %+v", got)
	}

	// An ephemeral address and a gateway for it: the same port takes them.
	eph := netip.MustParseAddr("192.0.2.10")
	igw := uuid.MustParse("1a5e0c5e-0000-4000-8000-0000000000a1")
	spec.ExternalIPs.V4.EphemeralIP = &eph
	spec.EIPGateways = map[netip.Addr][]uuid.UUID{eph: {igw}}
	if err := d.EnsurePort("p1", spec); err != nil {
		t.Fatal(err)
	}
	if q, _ := d.Port("p1"); q != p {
		t.Fatal("a change of external addresses made the port again")
	}
	want.IPv4.Ephemeral = eph
	want.Gateways = map[netip.Addr][]uuid.UUID{eph: {igw}}
	if got := p.ExternalIPs(); !got.Equal(want) {
		t.Errorf("external addresses %+v, want %+v", got, want)
	}
	b, _ := json.Marshal(d.State().Ports[0].Spec)
	var back PortSpec
	json.Unmarshal(b, &back)
	if !reflect.DeepEqual(back.ExternalIPs, spec.ExternalIPs) || !reflect.DeepEqual(back.EIPGateways, spec.EIPGateways) {
		t.Errorf("the state's spec: %s", b)
	}

	// IPv6 external addresses on an IPv4 port: refused, nothing changed.
	bad := spec
	bad.ExternalIPs = ExternalSpec{V4: spec.ExternalIPs.V4, V6: &ExternalStack{FloatingIPs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}}
	bad.Firewall = []rules.FirewallRule{}
	err := d.EnsurePort("p1", bad)
	if !errors.Is(err, ErrBadPort) || !errors.Is(err, engine.ErrExternalIPs) {
		t.Fatalf("IPv6 external addresses on an IPv4 port: %v", err)
	}
	if got := p.ExternalIPs(); !got.Equal(want) {
		t.Errorf("a refused spec changed the addresses: %+v", got)
	}
}
