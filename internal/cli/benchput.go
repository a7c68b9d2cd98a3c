package cli

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchPutCmd() *cobra.Command {
	opts := bench.PutOptions{}
	var agentLog bool
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "put",
		Short: "Time a PUT /omicron-config of --count crucible zones with their datasets until every zone answers, against the Linux runtime alone; needs root; prints JSON",
		Long: `Each round makes --count pools, one per zone, on file-backed disks of its
own through a fresh agent with the Linux runtime (a config of the disks and
each pool's "zone" dataset), then PUTs the config that adds the crucible zones
with their root and durable datasets (2 × --count datasets), and times it
until the agent's inventory reports every zone ok (each zone's service
answered its readiness check), and until its storage reports every dataset
ok. In the same round the Linux runtime alone brings as many zones up at once
(as bench zones does, on plain directories). Prints both, their ratio, and
medians over --rounds, as JSON.

Run it from the built binary (zones run its zone-service subcommand); it
needs runsv and btrfs-progs. Everything it creates carries a unique tag and
is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if agentLog {
				opts.Log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			ctx, cancel := signalContext()
			defer cancel()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				opts.CPUProfile = f
			}
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.Put(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Count, "count", 200, "crucible zones the timed PUT brings up, each with a pool of its own")
	f.IntVar(&opts.Rounds, "rounds", 3, "rounds, each on blank disks; medians are reported")
	f.DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "bound on each wait: the pools made, the zones up")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write the CPU profile of the first round's timed PUT (until every zone answers) to this file")
	f.BoolVar(&agentLog, "agent-log", false, "write the agent's debug log to stderr as JSON")
	return cmd
}
