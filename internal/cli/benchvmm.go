package cli

import (
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchVMMCmd() *cobra.Command {
	opts := bench.VMMOptions{}
	cmd := &cobra.Command{
		Use:   "vmm",
		Short: "Time from a VMM zone's deletion to the VMM reported failed, per phase; prints JSON",
		Long: `Run an agent, and --rounds times in each phase (before the VMM's service is
up, while its guest starts, runs and stops) register a VMM, bring it to the
phase, delete its zone behind the agent's back (on Linux: its namespace and its
processes, as ip netns delete and kill do) and time until GET /agent/vmms says
failed. --runtime linux needs root and is run from the built binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.VMM(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Rounds, "rounds", 20, "timed deletions per phase")
	f.StringVar(&opts.Runtime, "runtime", "sim", "sim or linux (real zones; root)")
	return cmd
}
