package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchVPCCmd() *cobra.Command {
	opts := bench.VPCOptions{}
	cmd := &cobra.Command{
		Use:   "vpc",
		Short: "A TCP stream and UDP round trips between guests on two sleds: the VPC data path, the kernel's VXLAN, a plain veth; needs root; prints JSON",
		Long: `Make two sleds as network namespaces joined by a veth pair (MTU 9000, the
underlay), with a stand-in guest on each (a namespace whose eth0 is a veth to
the sled), and time three ways, all made at once: through the sleds' VPC data
paths (internal/vpc/vpcd: Geneve between them, the guests' ports with Nexus's
default rule and route); through the kernel's VXLAN between the same sleds (a
bridge on each); and over a plain veth pair between the guests. Each way in
turn carries one TCP stream for --stream (Gbit/s, and this process's CPU
seconds per Gbit: the data path's and the guests' sockets'); then --requests
64-byte UDP round trips each way (p50, p99) go in 10 rounds, each taking every
way in turn for a tenth of them, so that load coming and going on a shared
machine weighs on the three alike. While the VPC way's stream runs, the process
(where both sleds' data paths run) is profiled, and "cpu_breakdown" says where
its CPU went: the data path's reads and writes (in system calls, and Go's side
of them), its engine, its loops, the guests' sockets, Go's scheduler and
poller, its memory management; --cpu-profile keeps the profile for go tool
pprof. Everything it makes is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr()
			res, err := bench.VPC(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.Stream, "stream", 5*time.Second, "how long each way's TCP stream runs")
	f.IntVar(&opts.Requests, "requests", 2000, "UDP round trips timed each way")
	f.StringVar(&opts.CPUProfile, "cpu-profile", "", "write the CPU profile taken during the VPC way's stream to this file (pprof's format)")
	return cmd
}
