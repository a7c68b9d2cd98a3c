// Package spec reads upstream's instance spec (propolis-server 6.0.0's
// InstanceSpec, the sled agent's vmm_spec) and judges whether this sled can
// realise it: the board, the devices at their PCI paths and the backends
// they name. The agent checks a spec when a VMM is registered (a spec it
// cannot realise is a 400 that changes nothing); the VMM service reads the
// same spec to build its machine, and checks it again.
//
// Everything a spec says that this package does not act on (CPUID
// templates, the guest hypervisor interface, SMBIOS) is kept as sent: Raw
// is the spec itself.
package spec

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Component types of upstream's InstanceSpec.
const (
	TypeVirtioDisk       = "virtio_disk"
	TypeNvmeDisk         = "nvme_disk"
	TypeVirtioNIC        = "virtio_nic"
	TypeSerialPort       = "serial_port"
	TypePciPciBridge     = "pci_pci_bridge"
	TypeQemuPvpanic      = "qemu_pvpanic"
	TypeBootSettings     = "boot_settings"
	TypeVirtioSocket     = "virtio_socket"
	TypeSoftNpuPciPort   = "soft_npu_pci_port"
	TypeSoftNpuPort      = "soft_npu_port"
	TypeSoftNpuP9        = "soft_npu_p9"
	TypeP9fs             = "p9fs"
	TypeMigrationFailure = "migration_failure_injector"
	TypeCrucible         = "crucible_storage_backend"
	TypeFile             = "file_storage_backend"
	TypeBlob             = "blob_storage_backend"
	TypeVirtioNetwork    = "virtio_network_backend"
	TypeDlpiNetwork      = "dlpi_network_backend"
)

// unrealisable says why each component type this sled cannot realise is
// refused.
var unrealisable = map[string]string{
	TypeCrucible:         "Crucible volumes are not served on Linux; use a file_storage_backend",
	TypeDlpiNetwork:      "DLPI network backends exist only on illumos",
	TypeSoftNpuPciPort:   "SoftNPU needs a propolis built with the falcon feature",
	TypeSoftNpuPort:      "SoftNPU needs a propolis built with the falcon feature",
	TypeSoftNpuP9:        "SoftNPU needs a propolis built with the falcon feature",
	TypeP9fs:             "P9 file systems need a propolis built with the falcon feature",
	TypeMigrationFailure: "this agent does not migrate VMMs",
	TypePciPciBridge:     "devices go on the root bus here: no PCI-PCI bridges",
}

// NotRealised says why a component this sled accepts is not given to the
// guest, by type: the guest runs without it, and our view of the VMM says
// so.
//
// Upstream's Nexus gives every instance a virtio socket, guest CID 16 (omicron
// nexus/src/app/instance_platform, b848b6d), which propolis realises in user
// space, per VM. Here the only host side of a guest socket is the kernel's
// vhost-vsock, whose CIDs are unique per host, so sixteen for every guest
// cannot be had, and nothing on this sled would listen on it: the component is
// checked and left out, rather than every instance Nexus sends refused.
var NotRealised = map[string]string{
	TypeVirtioSocket: "no host side for guest sockets on this sled (the kernel's vhost-vsock needs a CID unique per host; upstream's Nexus gives every guest 16): the guest has no virtio socket",
}

// Spec is an instance spec as this agent realises it.
type Spec struct {
	Board Board
	// Components by their key in the spec.
	Components map[string]Component
	// Raw is the spec as sent.
	Raw json.RawMessage
}

// Board is the spec's mainboard.
type Board struct {
	CPUs      int
	MemoryMiB uint64
	// PCIe is the i440fx chipset's enable_pcie: the guest may reach PCI
	// configuration space through the PCIe extended mechanism. QEMU's
	// i440fx has no such mechanism, so a board with it is a q35 machine
	// (qemu), whose devices still sit on its root bus.
	PCIe bool
}

// PCIPath is a device's bus/device/function.
type PCIPath struct {
	Bus      uint8 `json:"bus"`
	Device   uint8 `json:"device"`
	Function uint8 `json:"function"`
}

func (p PCIPath) String() string { return fmt.Sprintf("%02x:%02x.%x", p.Bus, p.Device, p.Function) }

// Component is one component of a spec: Type says which of its fields is
// set.
type Component struct {
	Type    string
	Disk    *Disk        // virtio_disk, nvme_disk
	NIC     *NIC         // virtio_nic
	Serial  string       // serial_port: com1 … com4
	Pvpanic *Pvpanic     // qemu_pvpanic
	Boot    []string     // boot_settings: the order, keys of disk components
	File    *FileBackend // file_storage_backend
	Blob    *BlobBackend // blob_storage_backend
	Network *NetBackend  // virtio_network_backend
	Vsock   *Vsock       // virtio_socket: checked, not realised (NotRealised)
}

// Vsock is a virtio socket device.
type Vsock struct {
	GuestCID uint64  `json:"guest_cid"`
	PCI      PCIPath `json:"pci_path"`
}

// Disk is a virtio or NVMe disk.
type Disk struct {
	BackendID string  `json:"backend_id"`
	PCI       PCIPath `json:"pci_path"`
	// SerialNumber is an NVMe disk's 20 bytes.
	SerialNumber []byte `json:"-"`
	// WriteCache is an NVMe disk's has_write_cache: whether it reports a
	// volatile write cache, which the guest must flush. False says the
	// backend loses no write once accepted (qemu.Disk.NoWriteCache).
	WriteCache bool `json:"-"`
}

// NIC is a virtio NIC. InterfaceID names the NIC of the sled-local config
// whose MAC it has.
type NIC struct {
	BackendID   string  `json:"backend_id"`
	InterfaceID string  `json:"interface_id"`
	PCI         PCIPath `json:"pci_path"`
}

// Pvpanic is QEMU's pvpanic device.
type Pvpanic struct {
	EnableISA bool `json:"enable_isa"`
}

// FileBackend is a disk backed by a file of the host.
type FileBackend struct {
	Path      string `json:"path"`
	ReadOnly  bool   `json:"readonly"`
	BlockSize uint32 `json:"block_size"`
}

// BlobBackend is a disk whose contents the spec gives.
type BlobBackend struct {
	Data     []byte
	ReadOnly bool
}

// NetBackend is a virtio NIC's backend: on this sled a tap device in the
// VMM's zone.
type NetBackend struct {
	VNICName string `json:"vnic_name"`
}

// Error is a spec this sled cannot realise; its message names the
// component and the problem. The agent answers it with a 400.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	return "vmm_spec: " + strings.Join(e.Problems, "; ")
}

// Decode reads an InstanceSpec. It fails with an *Error that names every
// component it cannot read or this sled cannot realise.
func Decode(raw []byte) (*Spec, error) {
	var doc struct {
		Board *struct {
			CPUs     *int    `json:"cpus"`
			MemoryMB *uint64 `json:"memory_mb"`
			Chipset  *struct {
				Type  string `json:"type"`
				Value *struct {
					EnablePCIe *bool `json:"enable_pcie"`
				} `json:"value"`
			} `json:"chipset"`
		} `json:"board"`
		Components map[string]struct {
			Type      string          `json:"type"`
			Component json.RawMessage `json:"component"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, &Error{Problems: []string{"not an InstanceSpec: " + err.Error()}}
	}
	var probs []string
	s := &Spec{Components: map[string]Component{}, Raw: json.RawMessage(bytes.Clone(raw))}
	switch b := doc.Board; {
	case b == nil:
		probs = append(probs, "board: missing")
	case b.CPUs == nil || b.MemoryMB == nil || b.Chipset == nil:
		probs = append(probs, "board: cpus, memory_mb and chipset are required")
	case b.Chipset.Type != "i440_fx" || b.Chipset.Value == nil || b.Chipset.Value.EnablePCIe == nil:
		probs = append(probs, fmt.Sprintf(`board.chipset: want {"type": "i440_fx", "value": {"enable_pcie": bool}}, not type %q`, b.Chipset.Type))
	default:
		s.Board = Board{CPUs: *b.CPUs, MemoryMiB: *b.MemoryMB, PCIe: *b.Chipset.Value.EnablePCIe}
	}
	if doc.Components == nil {
		probs = append(probs, "components: missing")
	}
	for _, key := range slices.Sorted(maps.Keys(doc.Components)) {
		c := doc.Components[key]
		comp, err := decodeComponent(c.Type, c.Component)
		if err != nil {
			probs = append(probs, fmt.Sprintf("component %q (%s): %v", key, c.Type, err))
			continue
		}
		s.Components[key] = comp
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	return s, nil
}

func decodeComponent(typ string, raw json.RawMessage) (Component, error) {
	c := Component{Type: typ}
	if why, ok := unrealisable[typ]; ok {
		return c, errors.New("cannot be realised on this sled: " + why)
	}
	if len(raw) == 0 || raw[0] != '{' {
		return c, errors.New("component: want a JSON object")
	}
	strict := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	switch typ {
	case TypeVirtioDisk:
		c.Disk = &Disk{}
		return c, strict(c.Disk)
	case TypeNvmeDisk:
		var d struct {
			Disk
			SerialNumber []int `json:"serial_number"`
			// Required from propolis-server 6.0.0 on, as in
			// sled-agent 48's vmm_spec. The VMM service reads a
			// 5.0.0 client's spec as 6.0.0's (propolisapi).
			HasWriteCache *bool `json:"has_write_cache"`
		}
		if err := strict(&d); err != nil {
			return c, err
		}
		if d.HasWriteCache == nil {
			return c, errors.New("missing field `has_write_cache`")
		}
		d.Disk.WriteCache = *d.HasWriteCache
		if len(d.SerialNumber) != 20 {
			return c, fmt.Errorf("serial_number: want 20 bytes, not %d", len(d.SerialNumber))
		}
		for _, b := range d.SerialNumber {
			if b < 0 || b > 255 {
				return c, fmt.Errorf("serial_number: %d is not a byte", b)
			}
			d.Disk.SerialNumber = append(d.Disk.SerialNumber, byte(b))
		}
		c.Disk = &d.Disk
		return c, nil
	case TypeVirtioNIC:
		c.NIC = &NIC{}
		return c, strict(c.NIC)
	case TypeSerialPort:
		var p struct {
			Num string `json:"num"`
		}
		if err := strict(&p); err != nil {
			return c, err
		}
		if !slices.Contains([]string{"com1", "com2", "com3", "com4"}, p.Num) {
			return c, fmt.Errorf("num %q: want com1, com2, com3 or com4", p.Num)
		}
		c.Serial = p.Num
		return c, nil
	case TypeQemuPvpanic:
		c.Pvpanic = &Pvpanic{}
		return c, strict(c.Pvpanic)
	case TypeBootSettings:
		var b struct {
			Order []struct {
				ID string `json:"id"`
			} `json:"order"`
		}
		if err := strict(&b); err != nil {
			return c, err
		}
		c.Boot = []string{}
		for _, e := range b.Order {
			c.Boot = append(c.Boot, e.ID)
		}
		return c, nil
	case TypeFile:
		var f struct {
			FileBackend
			Workers *uint `json:"workers"`
		}
		if err := strict(&f); err != nil {
			return c, err
		}
		c.File = &f.FileBackend
		return c, nil
	case TypeBlob:
		var b struct {
			Base64   string `json:"base64"`
			ReadOnly bool   `json:"readonly"`
		}
		if err := strict(&b); err != nil {
			return c, err
		}
		data, err := base64.StdEncoding.DecodeString(b.Base64)
		if err != nil {
			return c, fmt.Errorf("base64: %v", err)
		}
		c.Blob = &BlobBackend{Data: data, ReadOnly: b.ReadOnly}
		return c, nil
	case TypeVirtioNetwork:
		c.Network = &NetBackend{}
		return c, strict(c.Network)
	case TypeVirtioSocket:
		c.Vsock = &Vsock{}
		if err := strict(c.Vsock); err != nil {
			return c, err
		}
		// 0 to 2 name the hypervisor, the loopback and the host; a
		// CID is 32 bits, and all ones is VMADDR_CID_ANY.
		if cid := c.Vsock.GuestCID; cid < 3 || cid >= 0xffffffff {
			return c, fmt.Errorf("guest_cid %d: want 3 to %d (0 to 2 are the hypervisor's, the loopback's and the host's)", cid, uint32(0xfffffffe))
		}
		return c, nil
	}
	return c, errors.New("not a component type of propolis-server 6.0.0's InstanceSpec")
}
