package sledconfigtest

import (
	"fmt"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// InternalNTP returns internal NTP zone number i (the id of Crucible(200+i):
// do not use both in one config), at fd00:1122:3344:101::<i+0x1d0> port
// 123, on pool 200+i.
func InternalNTP(i int) sledconfig.Zone {
	z := Crucible(200 + i)
	z.ZoneType = sledconfig.ZoneType{
		Type:    "internal_ntp",
		Address: fmt.Sprintf("[fd00:1122:3344:101::%x]:123", i+0x1d0),
	}
	return z
}

// BoundaryNTP returns boundary NTP zone number i (the id of Crucible(300+i):
// do not use both in one config), at addr ("[ipv6]:123"), following
// ntpServers, with the NIC and SNAT upstream's boundary NTP zones have
// (private IP 172.30.3.5, MAC A8:40:25:FF:90:00 plus i; SNAT 192.0.2.20,
// ports 0–16383).
func BoundaryNTP(i int, addr string, ntpServers ...string) sledconfig.Zone {
	z := Crucible(300 + i)
	z.ZoneType = sledconfig.ZoneType{
		Type:       "boundary_ntp",
		Address:    addr,
		NTPServers: ntpServers,
		DNSServers: []string{"192.0.2.53"},
		SNAT:       &sledconfig.SNAT{IP: "192.0.2.20", FirstPort: 0, LastPort: 16383},
		NIC: &sledconfig.NIC{
			ID:       fmt.Sprintf("%08x-0000-4000-9100-%012x", i, i),
			Name:     "ntp-0",
			MAC:      fmt.Sprintf("A8:40:25:FF:%02X:%02X", (0x9000+i)>>8&0xff, (0x9000+i)&0xff),
			VNI:      100,
			Kind:     sledconfig.NICKind{Type: "service", ID: z.ID},
			IPConfig: sledconfig.IPConfig{Type: "v4", Value: sledconfig.IPConfigValue{IP: "172.30.3.5", Subnet: "172.30.3.0/24"}},
		},
	}
	return z
}
