package agent

import (
	"errors"
	"fmt"
	"os"

	"github.com/sled-agent/sled-agent/internal/hardware"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/qemuvm"
	"github.com/sled-agent/sled-agent/internal/vmm/reservoir"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
)

// vmmHost decides how this sled runs guests: the VMM reservoir from the
// sled's memory, and with the linux runtime the accelerator (KVM only where
// hardware virtualisation is really there), which every VMM zone's service
// is told.
func (a *Agent) vmmHost(cfg Config, rt any, hw hardware.Info) error {
	size, err := reservoir.Size(hw.PhysicalRAM, cfg.VMMReservoirPercentage, cfg.VMMReservoirSizeMB)
	if err != nil {
		return fmt.Errorf("vmm reservoir: %w", err)
	}
	a.reservoir = reservoir.NewAccount(size)
	if cfg.VMMQEMUIDs != "" {
		if _, err := qemuvm.ParseIDRange(cfg.VMMQEMUIDs); err != nil {
			return fmt.Errorf("vmm-qemu-ids: %w", err)
		}
	}
	a.guestSled = func() spec.Sled { return a.sledForGuests(cfg, hw) }
	if cfg.VMMStandIn && os.Geteuid() != 0 {
		return errors.New("vmm-stand-in: stand-in guests' NICs are links and network namespaces: it needs root")
	}
	mode := cfg.VMMAccel
	if mode == "" {
		mode = "auto"
	}
	accel, why, err := qemu.ChooseAccel(mode)
	if _, ok := rt.(*linux.Runtime); !ok {
		// The sim's zones run nothing: the service runs in the agent, with
		// a simulated guest. The flag is still checked.
		if err != nil && mode != "kvm" {
			return fmt.Errorf("vmm-accel: %w", err)
		}
		h := vmm.InProcessHost{Sled: a.guestSled}
		if cfg.VMMStandIn {
			h.Options.Attach = standin.AttachFor(a.log.With("component", "stand-in-guest"))
		}
		a.guestHost = h
		return nil
	}
	if cfg.VMMStandIn {
		a.log.Info("guests", "stand-in", true, "reservoir_bytes", size)
		a.guestHost = vmm.LinuxHost{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("vmm-accel: %w", err)
	}
	a.accel, a.accelWhy = string(accel), why
	a.log.Info("guests", "accelerator", accel, "why", why, "reservoir_bytes", size)
	a.guestHost = vmm.LinuxHost{}
	return nil
}

// sledForGuests is what a VMM's spec is checked against: the sled's hardware
// threads, and where a guest's disk files may lie: the pools' ensured
// local_storage datasets and the operator's image directory; and the file
// realising a delegated zvol (localVolume).
func (a *Agent) sledForGuests(cfg Config, hw hardware.Info) spec.Sled {
	roots := a.localStorageRoots()
	if cfg.VMMImageDir != "" {
		roots = append(roots, cfg.VMMImageDir)
	}
	return spec.Sled{Threads: int(hw.HardwareThreads), FileRoots: roots, LocalVolume: a.localVolume}
}

// vmmServiceArgs are what a VMM zone's service is told when its zone is
// made: a real guest, how it runs, its directory in the zone root, and
// where its disks' files may lie (as the agent checked them).
func (a *Agent) vmmServiceArgs() []string {
	if a.cfg.VMMStandIn {
		return []string{"--backend", "stand-in"}
	}
	if a.accel == "" {
		return nil
	}
	args := []string{"--backend", "qemu", "--accel", a.accel, "--dir", "{root}/guest"}
	if a.cfg.VMMQEMUIDs != "" {
		args = append(args, "--qemu-ids", a.cfg.VMMQEMUIDs)
	}
	for _, root := range a.guestSled().FileRoots {
		args = append(args, "--file-root", root)
	}
	return args
}
