package cli

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/sim/boundary"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
)

func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated neighbours of the agent",
	}
	cmd.AddCommand(newSimDDMCmd(), newSimDPDCmd(), newSimDNSCmd(), newSimNexusCmd())
	return cmd
}

func newSimDDMCmd() *cobra.Command {
	var listen, logLevel string
	cmd := &cobra.Command{
		Use:   "ddm",
		Short: "Run a simulated DDM admin server (maghemite ddmd)",
		Long: `Run a simulated DDM admin server (maghemite ddmd) until SIGINT or SIGTERM.

It serves GET /originated, PUT and DELETE /prefix, GET /peers, GET /prefixes,
PUT and DELETE /tunnel_endpoint, GET /originated_tunnel_endpoints and
GET /tunnel_endpoints like ddmd (api-version 2.0.0), keeping the originated
prefixes and tunnel endpoints in memory. A tunnel endpoint is
{"overlay_prefix": "0.0.0.0/0", "boundary_addr": "<ipv6>", "vni": 99, "metric": 0}.
The simulator stands for the whole underlay: every tunnel endpoint originated
here is also answered by GET /tunnel_endpoints, as learned through one peer,
fe80::aa:1. As with ddmd, requests need an api-version header, and bodies must
be sent as JSON (curl -H 'Content-Type: application/json').

Simulator-only control endpoints (no api-version header needed):
  PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"}
  POST /__sim/restart-empty  forget every prefix and tunnel endpoint and drop every connection
  GET  /__sim/state          fault, originated prefixes and tunnel endpoints, request counts
A "refuse" fault stops listening, so it cannot be cleared over HTTP: give
"refuse_for" to have it end by itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveSim("ddm", listen, logLevel, func(log *slog.Logger) simServer { return ddmsim.New(log) })
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "[::1]:8000", "address to serve the DDM admin API on")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

func newSimDPDCmd() *cobra.Command {
	var listen, logLevel, tep, external, netns string
	var slot uint16
	cmd := &cobra.Command{
		Use:   "dpd",
		Short: "Run a simulated switch daemon's NAT API (dendrite dpd)",
		Long: `Run a simulated switch daemon's NAT API (dendrite dpd) until SIGINT or SIGTERM.

It serves, like dpd (api-version 12.0.0), keeping the NAT entries in memory:
  PUT    /nat/ipv4/{ip}/{low}/{high}  (and ipv6) create an entry; 409 on overlap
  GET    /nat/ipv4/{ip}/{low}         the target of the entry holding low; 404 if none
  DELETE /nat/ipv4/{ip}/{low}         delete the entry holding low, if any
  GET    /nat/ipv4, /nat/ipv4/{ip}    paged external addresses, paged entries
  GET    /switch/identifiers          sidecar_id (random per run) and --slot
A target is {"internal_ip": "<ipv6>", "inner_mac": {"a": [six bytes]}, "vni": 100}.
As with dpd, requests need an api-version header, and bodies must be sent as
JSON (curl -H 'Content-Type: application/json').

Simulator-only control endpoints (no api-version header needed):
  PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"}
  POST /__sim/restart-empty  forget every entry and drop every connection
  POST /__sim/inject         {"external","low","high","target"}: an entry as if
                             another sled made it (replaces overlapping ones)
  GET  /__sim/state          fault, entries, request counts
A "refuse" fault stops listening, so it cannot be cleared over HTTP: give
"refuse_for" to have it end by itself.

With --tep and --external it is also the switch's boundary services data
path (internal/sim/boundary; needs root): Geneve that sleds send to the
tunnel endpoint [--tep]:6081 is decapsulated and its inner packet routed out
through the external link --external; packets arriving there are matched
against the NAT entries (destination, and TCP/UDP port or ICMP echo id) and
encapsulated to the entry's sled with its VNI, its MAC and the External
option. --netns runs that side in another network namespace (a path, e.g.
/run/netns/switch0), which must not forward IP itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if slot > 1 {
				return fmt.Errorf("--slot %d: a rack's switches are in slots 0 and 1", slot)
			}
			if (tep == "") != (external == "") {
				return fmt.Errorf("--tep and --external go together: the boundary services data path needs both")
			}
			if tep == "" {
				return serveSim("dpd", listen, logLevel, func(log *slog.Logger) simServer { return dpdsim.New(log, slot) })
			}
			addr, err := netip.ParseAddr(tep)
			if err != nil || !addr.Is6() {
				return fmt.Errorf("--tep %q: want an IPv6 address", tep)
			}
			return serveSim("dpd", listen, logLevel, func(log *slog.Logger) simServer {
				s := dpdsim.New(log, slot)
				return &boundarySim{Server: s, opts: boundary.Options{Netns: netns, TEP: addr, External: external, NAT: s, Log: log.With("component", "boundary")}}
			})
		},
	}
	cmd.Flags().StringVar(&tep, "tep", "", "the switch's tunnel endpoint address (IPv6): with --external, run the boundary services data path")
	cmd.Flags().StringVar(&external, "external", "", "the switch's external link, where packets leave for and come from outside the rack")
	cmd.Flags().StringVar(&netns, "netns", "", "the network namespace of the tunnel endpoint and the external link (a path; default this process's)")
	cmd.Flags().StringVar(&listen, "listen", "[::1]:12224", "address to serve the dpd API on")
	cmd.Flags().Uint16Var(&slot, "slot", 0, "the simulated switch's slot: 0 or 1")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

func newSimNexusCmd() *cobra.Command {
	var listen, logLevel string
	cmd := &cobra.Command{
		Use:   "nexus",
		Short: "Run a simulated Nexus internal API (omicron nexus-internal)",
		Long: `Run a simulated Nexus internal API (omicron nexus-internal) until SIGINT or SIGTERM.

It serves, like Nexus's internal server (api-version 1.0.0), keeping what it is
told in memory:
  GET  /sled-agents/{sled_id}  the SledAgentInfo held; 404 if none
  POST /sled-agents/{sled_id}  SledAgentInfo: upsert; 500 if its generation is
                               not newer than the one held or the sled is
                               decommissioned, as upstream
  PUT  /vmms/{propolis_id}     SledVmmState: kept in arrival order; the newest
                               by vmm_state.gen is the VMM's latest
As with Nexus, requests need an api-version header, and bodies must be sent as
JSON (curl -H 'Content-Type: application/json').

Simulator-only control endpoints (no api-version header needed):
  PUT    /__sim/fault                   {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"}
  POST   /__sim/restart-empty           forget every sled and VMM, drop every connection
  POST   /__sim/decommission/{sled_id}  mark a sled held decommissioned
  PUT    /__sim/sleds/{sled_id}         SledAgentInfo: hold it as given
  POST   /__sim/vmm-faults              {"status": 4xx, "vmm": "<uuid>", "count": n}: refuse
                                        VMM updates (of one VMM; the next n)
  DELETE /__sim/vmm-faults              end every VMM fault
  GET    /__sim/state                   fault, sleds, VMM updates, VMM faults, request counts
A "refuse" fault stops listening, so it cannot be cleared over HTTP: give
"refuse_for" to have it end by itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveSim("nexus", listen, logLevel, func(log *slog.Logger) simServer { return nexussim.New(nexussim.Config{Log: log}) })
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "[::1]:12221", "address to serve the Nexus internal API on")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

// simServer is a simulator's server.
type simServer interface {
	Start(addr string) error
	Close() error
}

// serveSim serves the simulator build makes on listen until SIGINT or
// SIGTERM.
func serveSim(name, listen, logLevel string, build func(*slog.Logger) simServer) error {
	log, err := newLogger(logLevel)
	if err != nil {
		return err
	}
	s := build(log.With("component", name+"sim"))
	if err := s.Start(listen); err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	<-ctx.Done()
	log.Info(name + " simulator stopping")
	return s.Close()
}

// boundarySim is a dpd simulator with the switch's boundary services data
// path over its NAT entries.
type boundarySim struct {
	*dpdsim.Server
	opts boundary.Options
	sw   *boundary.Switch
}

func (b *boundarySim) Start(addr string) error {
	sw, err := boundary.Start(b.opts)
	if err != nil {
		return err
	}
	if err := b.Server.Start(addr); err != nil {
		sw.Close()
		return err
	}
	b.sw = sw
	return nil
}

func (b *boundarySim) Close() error {
	if b.sw != nil {
		b.sw.Close()
	}
	return b.Server.Close()
}
