package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchRestartCmd() *cobra.Command {
	opts := bench.RestartOptions{}
	cmd := &cobra.Command{
		Use:   "restart",
		Short: "Time an agent restart with --count running zones until every zone is reported ok; prints JSON",
		Long: `Bring --count zones up with one agent, stop it (its zones keep running), and
start a new agent on the same data dir, --rounds times. For each restart it
reports the time from the new agent's start until it answers, until it has
restored its state, and until its inventory reports every zone ok, and how
many zones were restarted on the way (the restore protocol adopts them: 0).
--runtime linux (default; needs root) uses real zones; --runtime sim the
simulated OS the sim runtime keeps in its data dir. Run it from the built
binary: linux zones run its zone-service subcommand. Everything it creates
carries a unique tag and is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.Restart(ctx, opts)
			if err != nil {
				return err
			}
			if err := printJSON(cmd.OutOrStdout(), res); err != nil {
				return err
			}
			if res.Restarted > 0 {
				return fmt.Errorf("%d zones were restarted by an agent restart", res.Restarted)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Count, "count", 200, "zones running when the agent restarts")
	f.IntVar(&opts.Rounds, "rounds", 3, "timed restarts; the median is reported")
	f.StringVar(&opts.Runtime, "runtime", "linux", "linux (real zones; root) or sim")
	f.DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "bound on bringing the zones up and on each recovery")
	return cmd
}
