package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchNATCmd() *cobra.Command {
	opts := bench.NATOptions{}
	cmd := &cobra.Command{
		Use:   "nat",
		Short: "Time from a switch daemon appearing in DNS to this sled's NAT entries being on it; prints JSON",
		Long: `Run an agent (sim runtime, the real example config: two NAT entries) that finds
its switch daemons through a DNS server on loopback; --appearances times, start
a new dpd simulator, name it in DNS, and time until the agent's entries are on
it. Switches are looked for every --period, so the time lies between 0 and one
period plus a pass.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.NAT(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Appearances, "appearances", 10, "timed switch appearances")
	f.DurationVar(&opts.Period, "period", 10*time.Second, "the NAT reconciler's period")
	return cmd
}
