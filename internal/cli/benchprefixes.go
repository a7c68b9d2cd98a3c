package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchPrefixesCmd() *cobra.Command {
	opts := bench.PrefixOptions{}
	cmd := &cobra.Command{
		Use:   "prefixes",
		Short: "Time prefix withdrawal after a DNS zone's removal, and convergence after DDM returns; prints JSON",
		Long: `Run an agent (sim runtime) that keeps its prefixes in a DDM simulator on
loopback. Time, --withdrawals times, from the PUT that removes an internal DNS
zone to its prefix being gone from DDM; and, --recoveries times, from DDM
answering again (empty, after an outage of 1 to 3 s during which the config
changed) to DDM holding exactly the wanted prefixes. The prefix reconciler's
period is --period: withdrawals do not wait for it; recoveries wait for the
next retry (at most 5 s apart). A DDM that restarts empty while nothing
changes is repaired at the next period.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.Prefixes(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Withdrawals, "withdrawals", 50, "timed withdrawals")
	f.IntVar(&opts.Recoveries, "recoveries", 10, "timed DDM outages")
	f.DurationVar(&opts.Period, "period", 30*time.Second, "the prefix reconciler's period")
	return cmd
}
