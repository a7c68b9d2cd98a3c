package spec

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
)

// Sled is what a spec is judged against.
type Sled struct {
	// Threads is how many hardware threads a guest may have at most.
	Threads int
	// FileRoots are the directories a file backend's file may lie in
	// (the pools' local_storage datasets and the operator's image
	// directory), each as the sled names it: a root's own symbolic links
	// are followed, none below it (diskfile.Open).
	FileRoots []string
	// NICs are the sled-local config's NICs, by id: a virtio NIC's
	// interface_id names one, and the guest sees its MAC.
	NICs map[string]net.HardwareAddr
	// Zvols are the sled-local config's delegated zvols: a file backend
	// may name one by its device path (Zvol.Device), and has the file
	// LocalVolume says realises it.
	Zvols []Zvol
	// LocalVolume is the file that realises a pool's local storage
	// allocation (POST /local-storage), or why there is none; nil: the
	// sled has no local storage.
	LocalVolume func(zpoolID, datasetID string) (string, error)
}

// MaxBlobBytes bounds a blob backend's contents (a cloud-init seed is a few
// KiB; the whole registration is bounded anyway).
const MaxBlobBytes = 1 << 20

// Files are a spec's file backends opened as judged (diskfile.Open), by
// component key: what QEMU is given, so that nothing opens the files by
// name again.
type Files map[string]*diskfile.File

// Close closes every file.
func (fs Files) Close() {
	for _, f := range fs {
		f.Close()
	}
}

// Check judges whether the sled can realise s. It returns an *Error naming
// every problem, or nil. The file backends' files are opened to be judged,
// and closed.
func Check(s *Spec, sled Sled) error {
	files, err := CheckOpen(s, sled)
	files.Close()
	return err
}

// CheckOpen is Check, and returns the file backends' files open as judged
// (the caller closes them); nil with an error.
func CheckOpen(s *Spec, sled Sled) (Files, error) {
	files := Files{}
	same := map[diskfile.ID]string{} // a file → the first backend that has it
	var probs []string
	add := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	switch {
	case s.Board.CPUs < 1:
		add("board.cpus %d: a guest needs at least one", s.Board.CPUs)
	case s.Board.CPUs > sled.Threads:
		add("board.cpus %d: this sled has %d hardware threads for guests", s.Board.CPUs, sled.Threads)
	}
	if s.Board.MemoryMiB < 1 {
		add("board.memory_mb %d: a guest needs memory", s.Board.MemoryMiB)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range s.Components {
			if !yield(k) {
				return
			}
		}
	})
	paths := map[PCIPath]string{}
	usedBy := map[string]string{} // backend key → the device naming it
	serials := map[string]string{}
	var boots []string
	for _, key := range keys {
		c := s.Components[key]
		var pci *PCIPath
		switch c.Type {
		case TypeVirtioDisk, TypeNvmeDisk:
			pci = &c.Disk.PCI
			probs = append(probs, backendProblems(s, key, c.Disk.BackendID, usedBy, TypeFile, TypeBlob)...)
		case TypeVirtioNIC:
			pci = &c.NIC.PCI
			probs = append(probs, backendProblems(s, key, c.NIC.BackendID, usedBy, TypeVirtioNetwork)...)
			if _, ok := sled.NICs[strings.ToLower(c.NIC.InterfaceID)]; !ok {
				add("component %q (virtio_nic): interface_id %q names no NIC of local_config.nics", key, c.NIC.InterfaceID)
			}
		case TypeVirtioSocket:
			pci = &c.Vsock.PCI
		case TypeSerialPort:
			if other, ok := serials[c.Serial]; ok {
				add("components %q and %q are both serial port %s", other, key, c.Serial)
			}
			serials[c.Serial] = key
		case TypeBootSettings:
			boots = append(boots, key)
			seen := map[string]bool{}
			for _, id := range c.Boot {
				d, ok := s.Components[id]
				switch {
				case !ok:
					add("component %q (boot_settings): boot entry %q names no component", key, id)
				case d.Type != TypeVirtioDisk && d.Type != TypeNvmeDisk:
					add("component %q (boot_settings): boot entry %q is a %s, not a disk", key, id, d.Type)
				case seen[id]:
					add("component %q (boot_settings): disk %q is in the boot order twice", key, id)
				}
				seen[id] = true
			}
		case TypeFile:
			f, err := OpenBackend(c.File, sled)
			if err != nil {
				add("component %q (file_storage_backend): %v", key, err)
				break
			}
			files[key] = f
			// Two names of one file are refused below a root (links), but
			// two roots may show one directory (a bind mount).
			if other, ok := same[f.ID]; ok && (!c.File.ReadOnly || !s.Components[other].File.ReadOnly) {
				add("components %q and %q are one file (%s) and one of them writes it", other, key, f.ID)
			}
			same[f.ID] = key
		case TypeBlob:
			if n := len(c.Blob.Data); n == 0 || n > MaxBlobBytes {
				add("component %q (blob_storage_backend): %d bytes: want 1 to %d", key, n, MaxBlobBytes)
			}
		}
		if pci == nil {
			continue
		}
		if why := pciProblem(*pci, s.Board.PCIe); why != "" {
			add("component %q (%s): pci_path %s: %s", key, c.Type, pci, why)
			continue
		}
		if other, ok := paths[*pci]; ok {
			add("components %q and %q are both at pci_path %s", other, key, pci)
		}
		paths[*pci] = key
	}
	if len(boots) > 1 {
		add("components %s: at most one boot_settings", quoteAll(boots))
	}
	if len(probs) > 0 {
		files.Close()
		return nil, &Error{Problems: probs}
	}
	return files, nil
}

// backendProblems checks that a device's backend_id names a backend of one
// of the kinds it takes, used by no other device.
func backendProblems(s *Spec, key, backend string, usedBy map[string]string, kinds ...string) []string {
	b, ok := s.Components[backend]
	switch {
	case !ok:
		return []string{fmt.Sprintf("component %q: backend_id %q names no component", key, backend)}
	case !slices.Contains(kinds, b.Type):
		return []string{fmt.Sprintf("component %q: backend_id %q is a %s, not a %s", key, backend, b.Type, strings.Join(kinds, " or a "))}
	}
	if other, ok := usedBy[backend]; ok {
		return []string{fmt.Sprintf("components %q and %q both use backend %q", other, key, backend)}
	}
	usedBy[backend] = key
	return nil
}

// pciProblem says why a device cannot sit at p, or "". Devices sit on the
// root bus (a spec with a PCI-PCI bridge is refused), one function each
// (QEMU would need the device's function 0 to be multi-function), at a slot
// the chipset does not hold: 0 is the host bridge on both, 1 the i440fx's
// PIIX (ISA, IDE, ACPI), 0x1f the q35's LPC, SATA and SMBus.
func pciProblem(p PCIPath, pcie bool) string {
	switch {
	case p.Bus != 0:
		return "devices sit on bus 0 on this sled (no PCI-PCI bridges)"
	case p.Device > 31:
		return "a PCI device number is 0 to 31"
	case p.Function != 0:
		return "only function 0 is offered (no multi-function devices)"
	case p.Device == 0:
		return "slot 0 is the host bridge"
	case p.Device == 1 && !pcie:
		return "slot 1 is the chipset's (PIIX: ISA, IDE, ACPI)"
	case p.Device == 0x1f && pcie:
		return "slot 0x1f is the chipset's (LPC, SATA, SMBus)"
	}
	return ""
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
