package spec

import (
	"net"
	"testing"
)

func mustMAC(s string) net.HardwareAddr {
	mac, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return mac
}

// vnic_names carry their NIC's MAC; others are not this agent's.
func TestVNICName(t *testing.T) {
	mac := mustMAC("a8:40:25:f0:00:07")
	name := VNICName(mac)
	if name != "vna84025f00007" || len(name) > 15 {
		t.Fatalf("VNICName = %q", name)
	}
	got, err := MACOfVNIC(name)
	if err != nil || got.String() != "a8:40:25:f0:00:07" {
		t.Fatalf("MACOfVNIC(%q) = %v, %v", name, got, err)
	}
	for _, bad := range []string{"vopte0", "vnA84025F00007", "vna84025f0000", "vna84025f0000g", "xna84025f00007"} {
		if _, err := MACOfVNIC(bad); err == nil {
			t.Errorf("MACOfVNIC(%q) succeeded", bad)
		}
	}
}
