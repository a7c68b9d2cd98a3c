package cli

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/crashtest"
)

func newCrashTestCmd() *cobra.Command {
	var opts crashtest.Options
	var verbose bool
	cmd := &cobra.Command{
		Use:   "crashtest",
		Short: "SIGKILL the agent (linux runtime) at random moments and check each restart; needs root; prints JSON",
		Long: `Run the agent from this binary with the linux runtime on a mixed config
(crucibles and a nexus with a NIC). Each iteration maybe changes the config
(adds, removes or changes a zone), SIGKILLs the agent at a random moment up to
--max-kill-delay later, restarts it and requires: convergence within
--converge-timeout with nothing owned and unwanted left behind (namespaces,
links, processes, zone roots), no restart of a zone that was healthy before the
kill and whose config did not change, and the ledger at the last acknowledged
generation. Prints iterations, convergence p50/p99 and what was found as JSON,
and exits non-zero if anything was wrong. Everything it creates carries a
unique tag and is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verbose {
				opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			}
			ctx, cancel := signalContext()
			defer cancel()
			res, err := crashtest.Run(ctx, opts)
			if err != nil {
				return err
			}
			if err := printJSON(cmd.OutOrStdout(), res); err != nil {
				return err
			}
			if !res.OK() {
				return fmt.Errorf("crash test failed: %d leaks, %d restarts of healthy zones, %d ledger problems, %d losses of durable data", res.Leaks, res.HealthyRestarts, res.LedgerProblems, res.DataLost)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Iterations, "iterations", 20, "kills and restarts")
	f.IntVar(&opts.Crucibles, "crucibles", 6, "crucible zones in the first config (a nexus comes with them)")
	f.Uint64Var(&opts.Seed, "seed", 0, "random seed, to repeat a run (0: pick one; it is printed)")
	f.DurationVar(&opts.MaxKillDelay, "max-kill-delay", 2*time.Second, "the kill comes at a random moment up to this long after the iteration's config change")
	f.DurationVar(&opts.ConvergeTimeout, "converge-timeout", time.Minute, "bound on each recovery")
	f.DurationVar(&opts.ServiceStartDelay, "service-start-delay", 300*time.Millisecond, "how long each crucible's service takes to start (negative: none)")
	f.BoolVar(&verbose, "verbose", false, "log each iteration to stderr")
	return cmd
}
