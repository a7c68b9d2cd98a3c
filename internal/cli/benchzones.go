package cli

import (
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchZonesCmd() *cobra.Command {
	opts := bench.ZonesOptions{}
	var runtimeLog bool
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "zones",
		Short: "Compare the Linux runtime's zone start and teardown with the bare primitives; needs root; prints JSON",
		Long: `Create and destroy --count zones at once, alternately as the "floor" (a
network namespace, a veth pair, addresses and routes through netlink, and the
zone service started in the namespace, unsupervised) and through the Linux runtime's
Ensure and Destroy, --rounds times each. Prints the median wall-clock time of
each phase, the runtime/floor ratio and per-zone latencies as JSON.

Run it from the built binary (go build -o /tmp/sled-agent ./cmd/sled-agent):
zones run its zone-service subcommand. Everything it creates carries a unique
prefix and is removed on exit, error or Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runtimeLog {
				opts.RuntimeLog = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			ctx, cancel := signalContext()
			defer cancel()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.Zones(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Count, "count", 200, "zones created and destroyed at once in each phase")
	f.IntVar(&opts.Rounds, "rounds", 3, "rounds of floor and runtime; the median is reported")
	f.StringVar(&opts.TempDir, "temp-dir", "", "where the runtime's temporary data dir is made (default: the system's temp dir)")
	f.DurationVar(&opts.PhaseTimeout, "phase-timeout", 2*time.Minute, "deadline of each phase (all zones up, or all down)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write the agent process's CPU profile of the whole run to this file")
	f.BoolVar(&opts.Calibrate, "calibrate", false, "run the floor in the runtime's place too: the ratios are then the benchmark's own noise on this machine (equal work on both sides)")
	f.BoolVar(&runtimeLog, "runtime-log", false, "write the runtime's debug log (per-zone phase timings) to stderr as JSON")
	return cmd
}
