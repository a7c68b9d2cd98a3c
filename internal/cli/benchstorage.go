package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchStorageCmd() *cobra.Command {
	opts := bench.StorageOptions{}
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Time the example config's 10 disks and 54 datasets through an agent: from blank disks, a no-op pass, a restart; prints JSON",
		Long: `Give a fresh agent the storage half of the example sled config (its 10
disks and 54 datasets, on disks of the run's own, with new pool ids, and no
zones) and time, --rounds times, each round on blank disks:
  - from the PUT until the storage status reports every disk and dataset ok;
  - --passes storage passes that change nothing (a Poke, until every disk's
    pass has ended);
  - a new agent on the same data dir until everything is ok again (adopted:
    nothing formatted, every dataset with the id it had).
--runtime linux (default; needs root and btrfs-progs) uses btrfs on 10
file-backed disks; --runtime sim the simulated machine in its data dir.
With linux it also counts the changes the btrfs backend made in each phase
(it logs each one), and fails if a no-op pass or a restart made any.
Everything it creates carries a unique tag and is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Progress = cmd.ErrOrStderr() // stdout is the JSON result alone
			res, err := bench.Storage(ctx, opts)
			if err != nil {
				return err
			}
			if err := printJSON(cmd.OutOrStdout(), res); err != nil {
				return err
			}
			var errs []error
			if n := res.NoopPassChanges; n != nil && *n > 0 {
				errs = append(errs, fmt.Errorf("storage passes that should have changed nothing made %d changes", *n))
			}
			if n := res.RestartAdoptChanges; n != nil && *n > 0 {
				errs = append(errs, fmt.Errorf("restarted agents made %d storage changes adopting what was there", *n))
			}
			return errors.Join(errs...)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Rounds, "rounds", 3, "timed rounds, each on blank disks; the median is reported")
	f.IntVar(&opts.Passes, "passes", 20, "timed no-op storage passes in each round")
	f.StringVar(&opts.Runtime, "runtime", "linux", "linux (btrfs on file-backed disks; root) or sim")
	f.DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "bound on each wait: the storage ensured, one pass, the adoption")
	return cmd
}
