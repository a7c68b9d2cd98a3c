// Package vmmtest makes VMM registrations for tests: upstream's
// InstanceEnsureBody with an instance spec that any sled can realise (its
// boot disk a blob, one NIC, com1), so a test needs no file of the sled's.
package vmmtest

import (
	"encoding/json"
	"net"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vmm"
)

// NICID and MAC are the test guest's NIC, in local_config.nics and the spec.
const (
	NICID = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"
	MAC   = "a8:40:25:f0:00:07"
)

// MemoryMiB is the test guest's memory.
const MemoryMiB = 256

// Spec is an instance spec with 1 CPU, MemoryMiB of memory, a blob-backed
// virtio boot disk, a virtio NIC (NICID), com1 and pvpanic.
func Spec() map[string]any {
	comp := func(typ string, c map[string]any) map[string]any { return map[string]any{"type": typ, "component": c} }
	pci := func(dev int) map[string]any { return map[string]any{"bus": 0, "device": dev, "function": 0} }
	return map[string]any{
		"board": map[string]any{"cpus": 1, "memory_mb": MemoryMiB, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": map[string]any{
			"boot-disk":         comp("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": pci(0x10)}),
			"boot-disk-backend": comp("blob_storage_backend", map[string]any{"base64": "AAAAAA==", "readonly": true}),
			"net0":              comp("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": NICID, "pci_path": pci(8)}),
			"net0-backend":      comp("virtio_network_backend", map[string]any{"vnic_name": "vopte0"}),
			"com1":              comp("serial_port", map[string]any{"num": "com1"}),
			"pvpanic":           comp("qemu_pvpanic", map[string]any{"enable_isa": true}),
			"boot-settings":     comp("boot_settings", map[string]any{"order": []any{map[string]any{"id": "boot-disk"}}}),
		},
	}
}

// Body is an InstanceEnsureBody for instance at propolisAddr with spec
// (Spec() when nil); extra members are added at the top level.
func Body(instance, propolisAddr string, spec map[string]any, extra map[string]any) []byte {
	if spec == nil {
		spec = Spec()
	}
	b := map[string]any{
		"instance_id":   instance,
		"propolis_addr": propolisAddr,
		"vmm_runtime":   map[string]any{"gen": 1, "state": "starting", "time_updated": "2026-01-01T00:00:00Z"},
		"local_config": map[string]any{
			"hostname": "vm0", "attached_subnets": []any{}, "delegated_zvols": []any{}, "firewall_rules": []any{}, "multicast_groups": []any{},
			"dhcp_config":  map[string]any{"dns_servers": []any{}, "host_domain": nil, "search_domains": []any{}},
			"external_ips": map[string]any{},
			"nics": []any{map[string]any{
				"id": NICID, "kind": map[string]any{"type": "instance", "id": instance}, "name": "net0", "mac": MAC,
				"ip_config": map[string]any{}, "primary": true, "slot": 0, "vni": 100,
			}},
		},
		"metadata": map[string]any{"project_id": "11111111-2222-3333-4444-555555555555", "silo_id": "66666666-7777-8888-9999-000000000000"},
		"vmm_spec": spec,
	}
	for k, v := range extra {
		b[k] = v
	}
	out, err := json.Marshal(b)
	if err != nil {
		panic(err)
	}
	return out
}

// Registration is Body parsed as the API parses it.
func Registration(instance, propolisAddr string, extra map[string]any) vmm.Registration {
	body := Body(instance, propolisAddr, nil, extra)
	g, err := vmm.ParseGuest(body)
	if err != nil {
		panic(err)
	}
	return vmm.Registration{
		InstanceID:   instance,
		PropolisAddr: netip.MustParseAddrPort(propolisAddr),
		Initial:      vmm.RuntimeState{Gen: 1, State: "starting"},
		Body:         body,
		Guest:        g,
	}
}

// MustMAC is MAC parsed.
func MustMAC() net.HardwareAddr {
	mac, err := net.ParseMAC(MAC)
	if err != nil {
		panic(err)
	}
	return mac
}
