// Package sledconfigtest builds sled configs for tests and benchmarks.
package sledconfigtest

import (
	"encoding/json"
	"fmt"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// ZoneID returns a deterministic zone UUID for index i.
func ZoneID(i int) string {
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
}

// Pool returns external pool number i, "oxp_<uuid>".
func Pool(i int) string {
	return fmt.Sprintf("oxp_%08x-1111-4111-8111-%012x", i, i)
}

// Crucible returns a crucible zone with index i, at underlay address
// fd00:1122:3344:101::<i+0x10>, on pool i (its root and its durable
// dataset: upstream allows one durable dataset of a kind per pool).
func Crucible(i int) sledconfig.Zone {
	pool := Pool(i)
	return sledconfig.Zone{
		ID:             ZoneID(i),
		FilesystemPool: &pool,
		ZoneType: sledconfig.ZoneType{
			Type:    "crucible",
			Address: fmt.Sprintf("[fd00:1122:3344:101::%x]:32345", i+0x10),
			Dataset: &sledconfig.Dataset{PoolName: pool},
		},
		ImageSource: &sledconfig.ImageSource{Type: "install_dataset"},
	}
}

// Config returns a parsed config of the given generation holding zones, and
// the storage they need (storage.go): a disk for every pool they name, and
// every zone's root and durable dataset.
func Config(gen uint64, zones ...sledconfig.Zone) *sledconfig.Config {
	return build(gen, "", true, zones)
}

// ConfigWithoutStorage returns a config as Config does, but with no disk
// and no dataset: its zones' storage is never ready.
func ConfigWithoutStorage(gen uint64, zones ...sledconfig.Zone) *sledconfig.Config {
	return build(gen, "", false, zones)
}

func build(gen uint64, vdevPrefix string, withStorage bool, zones []sledconfig.Zone) *sledconfig.Config {
	c := sledconfig.Config{
		Generation:   gen,
		Disks:        map[string]json.RawMessage{},
		Datasets:     map[string]json.RawMessage{},
		Zones:        map[string]sledconfig.Zone{},
		Measurements: []json.RawMessage{},
	}
	for _, z := range zones {
		c.Zones[z.ID] = z
	}
	if withStorage {
		addStorage(&c, vdevPrefix, zones)
	}
	data, err := json.Marshal(&c)
	if err != nil {
		panic(err)
	}
	parsed, err := sledconfig.Parse(data)
	if err != nil {
		panic(err)
	}
	return parsed
}

// Crucibles returns n crucible zones, indexes 0..n-1.
func Crucibles(n int) []sledconfig.Zone {
	out := make([]sledconfig.Zone, n)
	for i := range out {
		out[i] = Crucible(i)
	}
	return out
}

// Nexus returns a nexus zone with index i (the id of Crucible(i): do not use
// both in one config), its internal API at
// internalAddr ("[ipv6]:port"), and a NIC (private IP 172.30.2.9, MAC
// A8:40:25:FF:80:05 plus i): the zone kind with external connectivity.
func Nexus(i int, internalAddr string) sledconfig.Zone {
	z := Crucible(i)
	z.ZoneType = sledconfig.ZoneType{
		Type:               "nexus",
		InternalAddress:    internalAddr,
		ExternalIP:         "192.0.2.10",
		ExternalTLS:        new(bool),
		ExternalDNSServers: []string{"192.0.2.53"},
		NIC: &sledconfig.NIC{
			ID:       fmt.Sprintf("%08x-0000-4000-9000-%012x", i, i),
			Name:     "nexus-0",
			MAC:      fmt.Sprintf("A8:40:25:FF:%02X:%02X", (0x8005+i)>>8&0xff, (0x8005+i)&0xff),
			VNI:      100,
			Kind:     sledconfig.NICKind{Type: "service", ID: z.ID},
			IPConfig: sledconfig.IPConfig{Type: "v4", Value: sledconfig.IPConfigValue{IP: "172.30.2.9", Subnet: "172.30.2.0/24"}},
		},
	}
	return z
}

// InternalDNS returns internal DNS zone number i (0, 1, 2…), as upstream
// places them: its DNS and HTTP addresses at fd00:1122:3344:<i+1>::1 (ports
// 53 and 5353), its gz_address at fd00:1122:3344:<i+1>::2.
func InternalDNS(i int) sledconfig.Zone {
	z := Crucible(100 + i)
	idx := uint32(i)
	z.ZoneType = sledconfig.ZoneType{
		Type:           "internal_dns",
		Dataset:        z.ZoneType.Dataset,
		DNSAddress:     fmt.Sprintf("[fd00:1122:3344:%x::1]:53", i+1),
		HTTPAddress:    fmt.Sprintf("[fd00:1122:3344:%x::1]:5353", i+1),
		GZAddress:      fmt.Sprintf("fd00:1122:3344:%x::2", i+1),
		GZAddressIndex: &idx,
	}
	return z
}
