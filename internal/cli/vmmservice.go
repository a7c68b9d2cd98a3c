package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/qemu"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
	"github.com/sled-agent/sled-agent/internal/vmm/qemuvm"
	"github.com/sled-agent/sled-agent/internal/vmm/service"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
)

// vmCloseTimeout bounds a QEMU machine's end once the service stops: QEMU
// is told to quit, then killed.
const vmCloseTimeout = 10 * time.Second

// vmmServiceFlags are vmm-service's settings.
type vmmServiceFlags struct {
	listen, id, backend string
	sim                 simguest.Options
	qemu                qemuvm.Options
	accel               string
	fileRoots           []string
	guestCgroup         string
	qemuIDs             string
}

// newVMMServiceCmd is the service a VMM zone runs: propolis-server's API
// over a simulated guest or a QEMU machine. The agent starts it; people do
// not.
func newVMMServiceCmd() *cobra.Command {
	var fl vmmServiceFlags
	cmd := &cobra.Command{
		Use:   "vmm-service",
		Short: "Run the VMM service: propolis-server's API over a simulated guest or a QEMU machine",
		Long: "Run the VMM service of a VMM zone: propolis-server 6.0.0's API (and 5.0.0's) (PUT /instance, PUT /instance/state, the state monitor, the serial console) " +
			"over a simulated guest (--backend sim) or a QEMU machine booting OVMF (--backend qemu), and GET /health, until SIGTERM or SIGINT; " +
			"then a QEMU machine is told to quit, and killed after 10s.",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVMMService(fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.listen, "listen", "", "TCP address to listen on, e.g. [fd00:1122:3344:101::5]:12400")
	f.StringVar(&fl.id, "id", "", "the VMM's propolis id (a UUID)")
	f.StringVar(&fl.backend, "backend", "sim", "the guest: sim (simulated), stand-in (simulated, its NICs veth pairs into a network namespace of its own, internal/vmm/standin) or qemu")
	f.DurationVar(&fl.sim.BootTime, "boot-time", simguest.DefaultBootTime, "sim: how long the simulated guest takes to boot")
	f.DurationVar(&fl.sim.StopTime, "stop-time", simguest.DefaultStopTime, "sim: how long the simulated guest takes to stop")
	f.DurationVar(&fl.sim.RebootTime, "reboot-time", simguest.DefaultRebootTime, "sim: how long the simulated guest takes to reboot")
	f.StringVar(&fl.qemu.Binary, "qemu", "qemu-system-x86_64", "qemu: QEMU's program")
	f.StringVar(&fl.qemu.FirmwareCode, "ovmf-code", "/usr/share/OVMF/OVMF_CODE_4M.fd", "qemu: OVMF's code image")
	f.StringVar(&fl.qemu.FirmwareVars, "ovmf-vars", "/usr/share/OVMF/OVMF_VARS_4M.fd", "qemu: OVMF's variable store template, copied for the VM")
	f.StringVar(&fl.accel, "accel", string(qemu.TCG), "qemu: the accelerator, kvm or tcg (the agent decides)")
	f.StringVar(&fl.qemu.Dir, "dir", "", "qemu: the VM's own directory (sockets, firmware variables, blob disks), an absolute path")
	f.StringArrayVar(&fl.fileRoots, "file-root", nil, "a directory a file-backed disk may lie in, an absolute path (repeatable)")
	f.StringVar(&fl.qemuIDs, "qemu-ids", qemuvm.DefaultIDs.String(), "qemu: the user and group ids QEMU runs as, FIRST:COUNT: each VM's QEMU runs unprivileged as the id of the range its VMM's id hashes to (the next free one up if a process holds it), for uid and gid alike; root, the system's users and nobody are refused")
	f.StringVar(&fl.guestCgroup, "guest-cgroup", "", "qemu: the cgroup QEMU is confined in, with the guest's limits: sled-agent/<tag>/<zone>.guest below each hierarchy's root (the zone runtime gives it)")
	for _, name := range []string{"listen", "id"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}

// runVMMService checks the flags, then serves until SIGTERM or SIGINT.
func runVMMService(fl vmmServiceFlags) error {
	health, err := service.Health(fl.id)
	if err != nil {
		return err
	}
	for _, root := range fl.fileRoots {
		if !filepath.IsAbs(root) {
			return fmt.Errorf("--file-root %q: want an absolute path", root)
		}
	}
	sled := spec.Sled{Threads: runtime.NumCPU(), FileRoots: fl.fileRoots}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "vmm-service", "propolis_id", fl.id)
	var backend propolisapi.Backend
	var vm *qemuvm.VM
	switch fl.backend {
	case "sim", "stand-in":
		// Zero would silently mean the default: refuse it with the rest.
		for _, d := range []struct {
			flag string
			v    time.Duration
		}{{"boot-time", fl.sim.BootTime}, {"stop-time", fl.sim.StopTime}, {"reboot-time", fl.sim.RebootTime}} {
			if d.v <= 0 {
				return fmt.Errorf("--%s %s: want a positive duration", d.flag, d.v)
			}
		}
		fl.sim.Sled, fl.sim.Log = sled, log
		if fl.backend == "stand-in" {
			fl.sim.Attach = standin.AttachFor(log)
		}
		guest := simguest.New(fl.sim)
		defer guest.Close()
		backend = guest
	case "qemu":
		if accel := qemu.Accel(fl.accel); accel != qemu.KVM && accel != qemu.TCG {
			return fmt.Errorf("--accel %q: want %s or %s", fl.accel, qemu.KVM, qemu.TCG)
		}
		if !filepath.IsAbs(fl.qemu.Dir) {
			return fmt.Errorf("--dir %q: the qemu backend needs the VM's directory, an absolute path", fl.qemu.Dir)
		}
		if fl.guestCgroup != "" {
			if err := guestcg.ValidName(fl.guestCgroup); err != nil {
				return fmt.Errorf("--guest-cgroup: %w", err)
			}
		}
		ids, err := qemuvm.ParseIDRange(fl.qemuIDs)
		if err != nil {
			return fmt.Errorf("--qemu-ids: %w", err)
		}
		opts := fl.qemu
		opts.Name, opts.Accel, opts.Sled, opts.Log, opts.IDs = fl.id, qemu.Accel(fl.accel), sled, log, ids
		opts.Confine = confineGuest(fl.guestCgroup)
		vm = qemuvm.New(opts)
		backend = vm
	default:
		return fmt.Errorf("--backend %q: want sim, stand-in or qemu", fl.backend)
	}

	ctx, cancel := signalContext()
	defer cancel()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", fl.listen)
	if err == nil {
		err = service.Serve(ctx, ln, backend, health, log)
	} else {
		err = fmt.Errorf("vmm service: %w", err)
	}
	if vm != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), vmCloseTimeout)
		defer ccancel()
		if cerr := vm.Close(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("vmm service: closing the VM: %w", cerr))
		}
	}
	return err
}

// confineGuest confines a guest's QEMU in the cgroup name (guestcg), with
// limits sized for the guest, in whichever hierarchies this host holds the
// controllers. It fails closed: without a name (a zone made by an agent
// that gave none), or with a limit that cannot be set, QEMU does not start,
// and the VMM fails saying why.
func confineGuest(name string) func(qemuvm.Guest) qemuvm.Confinement {
	return func(g qemuvm.Guest) qemuvm.Confinement {
		if name == "" {
			return guestcg.None("the VMM service was given no --guest-cgroup")
		}
		l := guestcg.LimitsFor(guestcg.Size{CPUs: g.CPUs, MemoryMiB: g.MemoryMiB, TCG: g.Accel == qemu.TCG, HostMemory: guestcg.HostMemory()})
		return guestcg.Make(guestcg.Detect(), name, l)
	}
}
