// Package ensurebody builds upstream's InstanceEnsureBody (PUT /vmms/{id})
// for a guest of one NIC: the operator's sled-agent vmm create and the
// tests' registrations (internal/vmm/vmmtest) share its shape.
package ensurebody

import (
	"encoding/base64"
	"encoding/json"
	"time"
)

// Component is one member of a spec's components: {"type", "component"}.
func Component(typ string, c map[string]any) map[string]any {
	return map[string]any{"type": typ, "component": c}
}

// PCI is a PCI path on bus 0.
func PCI(dev int) map[string]any { return map[string]any{"bus": 0, "device": dev, "function": 0} }

// Guest is what a spec of Spec holds.
type Guest struct {
	CPUs      int
	MemoryMiB int
	NICID     string // the virtio NIC's interface_id, a local_config NIC's id
	// Image is the boot disk's file (a file_storage_backend, writable),
	// unless ImageBlob is set: then the boot disk is that blob, read-only.
	Image     string
	ImageBlob []byte
	// Seed, if set, is a second disk, read-only, holding these bytes (a
	// cloud-init NoCloud seed image) in a blob_storage_backend.
	Seed []byte
}

// Spec is an instance spec (upstream's VmmSpec) for g: its boot disk as a
// virtio disk, the seed disk if any, a virtio NIC, com1, pvpanic and boot
// settings naming the boot disk.
func Spec(g Guest) map[string]any {
	backend := Component("file_storage_backend", map[string]any{"path": g.Image, "readonly": false, "block_size": 512})
	if g.ImageBlob != nil {
		backend = Component("blob_storage_backend", map[string]any{"base64": base64.StdEncoding.EncodeToString(g.ImageBlob), "readonly": true})
	}
	comps := map[string]any{
		"boot-disk":         Component("virtio_disk", map[string]any{"backend_id": "boot-disk-backend", "pci_path": PCI(0x10)}),
		"boot-disk-backend": backend,
		"net0":              Component("virtio_nic", map[string]any{"backend_id": "net0-backend", "interface_id": g.NICID, "pci_path": PCI(8)}),
		"net0-backend":      Component("virtio_network_backend", map[string]any{"vnic_name": "vopte0"}),
		"com1":              Component("serial_port", map[string]any{"num": "com1"}),
		"pvpanic":           Component("qemu_pvpanic", map[string]any{"enable_isa": true}),
		"boot-settings":     Component("boot_settings", map[string]any{"order": []any{map[string]any{"id": "boot-disk"}}}),
	}
	if g.Seed != nil {
		comps["cloud-init"] = Component("virtio_disk", map[string]any{"backend_id": "cloud-init-backend", "pci_path": PCI(0x18)})
		comps["cloud-init-backend"] = Component("blob_storage_backend", map[string]any{"base64": base64.StdEncoding.EncodeToString(g.Seed), "readonly": true})
	}
	return map[string]any{
		"board":      map[string]any{"cpus": g.CPUs, "memory_mb": g.MemoryMiB, "chipset": map[string]any{"type": "i440_fx", "value": map[string]any{"enable_pcie": false}}},
		"components": comps,
	}
}

// Instance is what a body of Body says besides its spec.
type Instance struct {
	InstanceID   string
	PropolisAddr string // [ipv6]:port
	Hostname     string
	NICID, MAC   string // the one NIC of local_config
	// NICIP is the NIC's private IPv4 address in NICSubnet, and VNI its
	// VPC's (defaults: 172.30.0.5 in 172.30.0.0/22, Nexus's default VPC
	// subnet, and VNI 7777, a guest VNI; 100 is the services VPC's).
	NICIP, NICSubnet string
	VNI              uint32
	// ProjectID and SiloID are the metadata, kept by the agent as sent.
	ProjectID, SiloID string
	// TimeUpdated is vmm_runtime's time_updated (a fixed time when zero).
	TimeUpdated time.Time
}

// Body is an InstanceEnsureBody for in with spec, its VMM starting at
// generation 1; extra members are added at the top level.
func Body(in Instance, spec map[string]any, extra map[string]any) []byte {
	t := in.TimeUpdated
	if t.IsZero() {
		t = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	ip, subnet, vni := in.NICIP, in.NICSubnet, in.VNI
	if ip == "" {
		ip, subnet = "172.30.0.5", "172.30.0.0/22"
	}
	if vni == 0 {
		vni = 7777
	}
	b := map[string]any{
		"instance_id":   in.InstanceID,
		"propolis_addr": in.PropolisAddr,
		"vmm_runtime":   map[string]any{"gen": 1, "state": "starting", "time_updated": t.UTC().Format(time.RFC3339Nano)},
		"local_config": map[string]any{
			"hostname": in.Hostname, "attached_subnets": []any{}, "delegated_zvols": []any{}, "firewall_rules": []any{}, "multicast_groups": []any{},
			"dhcp_config":  map[string]any{"dns_servers": []any{}, "host_domain": nil, "search_domains": []any{}},
			"external_ips": map[string]any{},
			"nics": []any{map[string]any{
				"id": in.NICID, "kind": map[string]any{"type": "instance", "id": in.InstanceID}, "name": "net0", "mac": in.MAC,
				"ip_config": map[string]any{"type": "v4", "value": map[string]any{"ip": ip, "subnet": subnet, "transit_ips": []any{}}},
				"primary":   true, "slot": 0, "vni": vni,
			}},
		},
		"metadata": map[string]any{"project_id": in.ProjectID, "silo_id": in.SiloID},
		"vmm_spec": spec,
	}
	for k, v := range extra {
		b[k] = v
	}
	out, err := json.Marshal(b)
	if err != nil {
		panic(err) // maps of JSON values only
	}
	return out
}
