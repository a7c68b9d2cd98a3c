package cli

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// propolisPort is the port of a VMM's Propolis API when --addr gives
// none, upstream's (PROPOLIS_PORT).
const propolisPort = 12400

// addVMMCmds adds the commands that register, list, drive and unregister
// VMMs, and their consoles, to the vmm command.
func addVMMCmds(cmd *cobra.Command, g *globals) {
	cmd.AddCommand(newVMMCreateCmd(g), newVMMListCmd(g), newVMMShowCmd(g), newVMMDeleteCmd(g), newVMMConsoleCmd(g))
	for _, s := range []struct{ use, state, asked, short string }{
		{"start", "running", "asked to run", "Ask a VMM's guest to run (PUT /vmms/{id}/state running)"},
		{"stop", "stopped", "asked to stop", "Ask a VMM's guest to stop (PUT /vmms/{id}/state stopped)"},
		{"reboot", "reboot", "asked to reboot", "Ask a VMM's guest to reboot (PUT /vmms/{id}/state reboot)"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   s.use + " ID",
			Short: s.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, asJSON, err := g.setup()
				if err != nil {
					return err
				}
				out, err := c.PutVMMState(cmd.Context(), args[0], s.state)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), out)
				}
				if out.UpdatedRuntime == nil {
					_, err = fmt.Fprintf(cmd.OutOrStdout(), "VMM %s: %s; nothing changed\n", args[0], s.asked)
					return err
				}
				st := out.UpdatedRuntime.VmmState
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "VMM %s: %s; now %s (gen %d)\n", args[0], s.asked, st.State, st.Gen)
				return err
			},
		})
	}
}

// createFlags are vmm create's flags.
type createFlags struct {
	image, cloudInit, addr, id string
	cpus, memoryMiB            int
}

func newVMMCreateCmd(g *globals) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create --image FILE",
		Short: "Register a VMM booting a disk image (PUT /vmms/{id}) and print its id",
		Long: `Builds upstream's InstanceEnsureBody and registers it: a guest of --cpus
CPUs and --memory MiB whose boot disk is --image (a file_storage_backend,
written to by the guest) on a virtio disk, with one virtio NIC (and the
sled-local NIC config that gives it a MAC), com1 as its serial console
(sled-agent vmm console), and boot settings naming the disk. With
--cloud-init, a second virtio disk, read-only, holds that file: a NoCloud
seed image (e.g. made by cloud-localds), at most 1 MiB, sent in the spec as a
blob_storage_backend. The metadata's project and silo are generated.

The image's path is the agent's, not this command's: it must be a regular file
under the agent's --vmm-image-dir or a pool's local_storage dataset, not
reached through a symbolic link, or the agent refuses the VMM (400).

The VMM's Propolis API listens at --addr, by default a random address of the
sled's /64 (from the agent's sled_agent_address in its inventory) on port
12400; an --addr must be in that /64 and not one of its first three
addresses. Its guest does not run until sled-agent vmm start ID.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			id, body, err := f.body(cmd.Context(), c)
			if err != nil {
				return err
			}
			st, err := c.RegisterVMM(cmd.Context(), id, body)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"propolis_id": id, "state": st})
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), id)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "the guest's boot disk image, a path on the agent's host under its --vmm-image-dir or a pool's local_storage (required)")
	fl.IntVar(&f.cpus, "cpus", 1, "the guest's CPUs")
	fl.IntVar(&f.memoryMiB, "memory", 1024, "the guest's memory, MiB")
	fl.StringVar(&f.cloudInit, "cloud-init", "", "a cloud-init NoCloud seed image (at most 1 MiB) given to the guest as a second, read-only disk")
	fl.StringVar(&f.addr, "addr", "", "[ipv6]:port of the VMM's Propolis API, in the sled's /64 (default: a random address of it, port 12400)")
	fl.StringVar(&f.id, "id", "", "the VMM's (propolis) UUID (default: generated)")
	return cmd
}

// body checks the flags and returns the VMM's id and its registration.
func (f *createFlags) body(ctx context.Context, c *client.Client) (string, []byte, error) {
	if f.image == "" {
		return "", nil, errors.New("--image is required: the guest's boot disk, under the agent's --vmm-image-dir or a pool's local_storage")
	}
	if !filepath.IsAbs(f.image) {
		// The agent resolves it, not this command's directory.
		return "", nil, fmt.Errorf("--image %q: want an absolute path (the agent's)", f.image)
	}
	id := uuid.NewString()
	if f.id != "" {
		u, err := uuid.Parse(f.id)
		if err != nil || len(f.id) != 36 {
			return "", nil, fmt.Errorf("--id %q is not a UUID", f.id)
		}
		id = u.String()
	}
	if f.cpus < 1 {
		return "", nil, fmt.Errorf("--cpus %d: want at least 1", f.cpus)
	}
	if f.memoryMiB < 1 {
		return "", nil, fmt.Errorf("--memory %d: want at least 1 MiB", f.memoryMiB)
	}
	var seed []byte
	if f.cloudInit != "" {
		fi, err := os.Stat(f.cloudInit)
		if err != nil {
			return "", nil, fmt.Errorf("--cloud-init: %w", err)
		}
		if fi.Size() > spec.MaxBlobBytes {
			return "", nil, fmt.Errorf("--cloud-init %s: %d bytes, want at most %d", f.cloudInit, fi.Size(), spec.MaxBlobBytes)
		}
		if seed, err = os.ReadFile(f.cloudInit); err != nil {
			return "", nil, fmt.Errorf("--cloud-init: %w", err)
		}
	}
	inv, err := c.AgentInventory(ctx)
	if err != nil {
		return "", nil, err
	}
	sled, err := sledAddr(inv.SledAgentAddress)
	if err != nil {
		return "", nil, err
	}
	addr, err := propolisAddr(f.addr, sled)
	if err != nil {
		return "", nil, err
	}
	mac, err := randomMAC()
	if err != nil {
		return "", nil, err
	}
	nic := uuid.NewString()
	s := ensurebody.Spec(ensurebody.Guest{CPUs: f.cpus, MemoryMiB: f.memoryMiB, NICID: nic, Image: f.image, Seed: seed})
	return id, ensurebody.Body(ensurebody.Instance{
		InstanceID: uuid.NewString(), PropolisAddr: addr.String(), Hostname: "vm-" + id[:8], NICID: nic, MAC: mac,
		ProjectID: uuid.NewString(), SiloID: uuid.NewString(), TimeUpdated: time.Now(),
	}, s, nil), nil
}

// sledAddr is the sled's underlay address, from the inventory's
// sled_agent_address ([ipv6]:port).
func sledAddr(s string) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || !ap.Addr().Is6() {
		return netip.Addr{}, fmt.Errorf("the agent's inventory gives sled_agent_address %q: want [ipv6]:port", s)
	}
	return ap.Addr(), nil
}

// propolisAddr checks flag, or picks a random address of sled's /64 when it
// is empty. Upstream's Nexus allocates it from the sled's subnet too; a
// random one of 2^64 meets a zone's or another VMM's with no real chance,
// and the agent refuses one that does (409).
func propolisAddr(flag string, sled netip.Addr) (netip.AddrPort, error) {
	if flag != "" {
		ap, err := netip.ParseAddrPort(flag)
		if err != nil || !ap.Addr().Is6() || ap.Port() == 0 {
			return netip.AddrPort{}, fmt.Errorf("--addr %q: want [ipv6]:port", flag)
		}
		if p := sledconfig.SledAddrProblem(sled, ap.Addr()); p != "" {
			return netip.AddrPort{}, fmt.Errorf("--addr: %s", p)
		}
		if ap.Addr() == sled {
			return netip.AddrPort{}, fmt.Errorf("--addr: %s is the sled agent's own address", sled)
		}
		return ap, nil
	}
	// A random host part is all but never one of the few refused; a
	// handful of draws bound it all the same.
	for range 16 {
		b := sledconfig.SledSubnet(sled).Addr().As16()
		if _, err := rand.Read(b[8:]); err != nil {
			return netip.AddrPort{}, err
		}
		a := netip.AddrFrom16(b)
		if a != sled && sledconfig.SledAddrProblem(sled, a) == "" {
			return netip.AddrPortFrom(a, propolisPort), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("no address of the sled's subnet %s drawn; give one with --addr", sledconfig.SledSubnet(sled))
}

// randomMAC is a locally administered unicast MAC in upstream's guest
// range (A8:40:25:F0–FF:…), as Nexus gives guests.
func randomMAC() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("a8:40:25:%02x:%02x:%02x", 0xf0|b[0]&0x0f, b[1], b[2]), nil
}

func newVMMListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the VMMs and their states (GET /agent/vmms, every page)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			vmms, err := c.VMMs(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if vmms == nil {
					vmms = []vmm.Info{}
				}
				return printJSON(cmd.OutOrStdout(), vmms)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VMM\tSTATE\tGEN\tPROPOLIS\tINSTANCE\tDETAIL")
			for _, v := range vmms {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", v.ID, vmmState(v), v.State.Gen, v.PropolisAddr, v.InstanceID, truncate(v.Detail, 80))
			}
			return tw.Flush()
		},
	}
}

// vmmState is a VMM's state as the table shows it.
func vmmState(v vmm.Info) string {
	if v.Status == vmm.StatusUnknown {
		return "unknown"
	}
	return v.State.State
}

// findVMM returns VMM id from every page of the VMMs.
func findVMM(ctx context.Context, c *client.Client, id string) (vmm.Info, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return vmm.Info{}, fmt.Errorf("VMM id %q is not a UUID", id)
	}
	vmms, err := c.VMMs(ctx)
	if err != nil {
		return vmm.Info{}, err
	}
	for _, v := range vmms {
		if v.ID == u.String() {
			return v, nil
		}
	}
	return vmm.Info{}, fmt.Errorf("no VMM %s on this sled (see: sled-agent vmm list)", u)
}

func newVMMShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one VMM: its state, addresses and history (with -o json its registration too)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			v, err := findVMM(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), v)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "vmm\t%s\n", v.ID)
			fmt.Fprintf(tw, "status\t%s\n", v.Status)
			fmt.Fprintf(tw, "instance\t%s\n", v.InstanceID)
			fmt.Fprintf(tw, "zone\t%s\n", v.Zone)
			fmt.Fprintf(tw, "propolis\t%s\n", v.PropolisAddr)
			fmt.Fprintf(tw, "state\t%s (gen %d)\n", vmmState(v), v.State.Gen)
			if v.Detail != "" {
				fmt.Fprintf(tw, "detail\t%s\n", v.Detail)
			}
			for _, rc := range v.RecordCopies {
				line := rc.State
				if rc.Error != "" {
					line += ": " + rc.Error
				}
				fmt.Fprintf(tw, "record copy\t%s  %s\n", rc.Path, line)
			}
			fmt.Fprintln(tw, "\nhistory:")
			for _, e := range v.History {
				fmt.Fprintf(tw, "  %s\t%s\t%s\n", e.At.Local().Format("15:04:05.000"), e.Event, e.Detail)
			}
			return tw.Flush()
		},
	}
}

func newVMMDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete ID",
		Short: "Unregister a VMM and tear its zone down, with its guest (DELETE /vmms/{id})",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			out, err := c.UnregisterVMM(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			state := ""
			if r := out.UpdatedRuntime; r != nil {
				state = fmt.Sprintf(" (%s, gen %d)", r.VmmState.State, r.VmmState.Gen)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "VMM %s unregistered%s; its zone is being torn down\n", args[0], state)
			return err
		},
	}
}

// serviceAddr is where VMM v's Propolis API answers: where the agent
// reaches it (with the sim runtime, the service runs in the agent on
// loopback), else its propolis_addr.
func serviceAddr(v vmm.Info) string { return cmp.Or(v.ServiceAddr, v.PropolisAddr) }
