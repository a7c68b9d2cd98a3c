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
		Short: "SIGKILL the agent (linux runtime) or reboot the host under it at random moments and check each restart; needs root; prints JSON",
		Long: `Run the agent from this binary with the linux runtime on a mixed config
(crucibles and a nexus with a NIC). Each iteration maybe changes the config
(adds, removes or changes a zone), SIGKILLs the agent at a random moment up to
--max-kill-delay later, or (--reboot-share of the iterations, at random)
simulates a reboot of the host: kills the agent and every process of its zones,
removes its namespaces, links and cgroups, unmounts its pools, detaches its
loop devices and empties its run dir. Then it restarts the agent on the same
data dir and requires: convergence within --converge-timeout with nothing owned
and unwanted left behind (namespaces, links, processes, zone roots), every
durable dataset's file intact, after a kill no restart of a zone that was
healthy before it and whose config did not change, after a reboot every VMM
failed with nothing of it running (or gone), and the ledger at the last
acknowledged generation. Prints iterations, kills and reboots, convergence
p50/p99 and what was found as JSON, and exits non-zero if anything was wrong.
Everything it creates carries a unique tag and is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if verbose {
				opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			}
			if opts.RebootShare == 0 {
				opts.RebootShare = -1 // none, as asked; the package's zero is its default
			}
			ctx, cancel := signalContext()
			defer cancel()
			// A line per iteration on stderr; stdout is the JSON result
			// alone.
			opts.Progress = cmd.ErrOrStderr()
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
	f.Float64Var(&opts.RebootShare, "reboot-share", 0.25, "share of the iterations that reboot the host rather than kill the agent (0: none; at least one reboot if positive)")
	f.BoolVar(&verbose, "verbose", false, "log each iteration to stderr")
	return cmd
}
