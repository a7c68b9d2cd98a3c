package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// DefaultVPCSocket is where the data path of an agent of the default run
// dir and zone tag serves its local API.
var DefaultVPCSocket = agent.VPCSocket(agent.Config{})

// newVPCServiceCmd is the sled's VPC data path (internal/vpc/vpcd). The
// agent starts it; people do not.
func newVPCServiceCmd() *cobra.Command {
	var underlay, socket, netns, logLevel string
	cmd := &cobra.Command{
		Use:    "vpc-service",
		Short:  "Run the sled's VPC data path: ports, rules, routes and Geneve on the underlay",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, err := netip.ParseAddr(underlay)
			if err != nil || !addr.Is6() {
				return fmt.Errorf("--underlay %q: want the sled's IPv6 underlay address", underlay)
			}
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			d, err := vpcd.Start(vpcd.Options{Underlay: addr, Netns: netns, Log: log.With("component", "vpcd")})
			if err != nil {
				return err
			}
			defer d.Close()
			ctx, cancel := signalContext()
			defer cancel()
			return d.Serve(ctx, socket)
		},
	}
	f := cmd.Flags()
	f.StringVar(&underlay, "underlay", "", "the sled's underlay address: Geneve is sent from and received on [it]:6081")
	f.StringVar(&socket, "socket", DefaultVPCSocket, "the unix socket of the local API")
	f.StringVar(&netns, "netns", "", "the sled's network namespace, a path (default this process's)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	cmd.MarkFlagRequired("underlay")
	return cmd
}

// newVPCCmd shows the data path's state, as opteadm does: ports, their
// rules, routes and flows, the v2p and v2b tables.
func newVPCCmd() *cobra.Command {
	var socket, output string
	cmd := &cobra.Command{
		Use:   "vpc",
		Short: "Show the sled's VPC data path: ports, firewall rules, routes, v2p and v2b mappings, flows",
		Long: `Reads the sled's VPC data path (its local API, on a unix socket only root
reaches) and shows, as opteadm does for OPTE: each port (its link and whether
it is attached to it, VNI, MAC, addresses, packets in and out and drops by
reason), its firewall rules in the order they are tried, its router entries
and the flows its firewall allowed; the v2p mappings (where each VPC address
lives) and the v2b mappings (where traffic for outside the rack leaves it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			st, err := vpcd.NewClient(socket).State(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(cmd.OutOrStdout(), st)
			}
			return printVPC(cmd.OutOrStdout(), st)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", DefaultVPCSocket, "the data path's unix socket")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func printVPC(w io.Writer, st vpcd.State) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "underlay %s\n\n", st.Underlay)
	fmt.Fprintln(tw, "PORT\tLINK\tVNI\tMAC\tADDRESSES\tIN\tOUT\tDROPPED\tSTATUS")
	for _, p := range st.Ports {
		var addrs []string
		for _, ip := range []*vpcd.IPSpec{p.Spec.IPv4, p.Spec.IPv6} {
			if ip != nil {
				addrs = append(addrs, ip.Private.String()+" in "+ip.Subnet.String())
			}
		}
		link := p.Spec.Link.Name
		if p.Spec.Link.Netns != "" {
			link += " in " + p.Spec.Link.Netns
		}
		var drops []string
		for why, n := range p.Stats.Dropped {
			drops = append(drops, fmt.Sprintf("%d %s", n, why))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", p.Name, link, p.Spec.VNI, p.Spec.MAC, strings.Join(addrs, ", "),
			p.Stats.InPackets, p.Stats.OutPackets, strings.Join(drops, ", "), p.Status)
	}
	tw.Flush()
	for _, p := range st.Ports {
		fmt.Fprintf(w, "\nport %s\n", p.Name)
		section(w, "firewall, inbound (default deny)", p.Inbound)
		section(w, "firewall, outbound (default allow)", p.Outbound)
		section(w, "routes", p.Routes)
		section(w, "flows", p.Flows)
		section(w, "NAT flows", p.NATFlows)
		var subnets []string
		for _, a := range p.Spec.AttachedSubnets {
			kind := "vpc"
			if a.IsExternal {
				kind = "external"
			}
			subnets = append(subnets, a.CIDR.String()+" ("+kind+")")
		}
		section(w, "attached subnets", subnets)
	}
	fmt.Fprintln(w, "\nv2p")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  VNI\tVIRTUAL IP\tMAC\tSLED")
	for _, m := range st.V2P {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", m.VNI, m.VirtualIP, m.VirtualMAC, m.PhysicalHostIP)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nv2b")
	for _, b := range st.V2B {
		var teps []string
		for _, t := range b.TEPs {
			teps = append(teps, fmt.Sprintf("%s (VNI %d)", t.Addr, t.VNI))
		}
		fmt.Fprintf(w, "  %s → %s\n", b.Prefix, strings.Join(teps, ", "))
	}
	if len(st.Unmatched.Dropped) > 0 {
		b, _ := json.Marshal(st.Unmatched.Dropped)
		fmt.Fprintf(w, "\nfrom the underlay for no port: %s\n", b)
	}
	return nil
}

func section(w io.Writer, title string, lines []string) {
	fmt.Fprintf(w, "  %s:", title)
	if len(lines) == 0 {
		fmt.Fprintln(w, " none")
		return
	}
	fmt.Fprintln(w)
	for _, l := range lines {
		fmt.Fprintf(w, "    %s\n", l)
	}
}
