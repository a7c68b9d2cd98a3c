package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledns"
)

func newTeardownCmd() *cobra.Command {
	d := newDaemonFlags()
	var yes bool
	cmd := &cobra.Command{
		Use:   "teardown",
		Short: "Destroy every zone of this sled, and every leftover of one (the agent must be stopped)",
		Long: `Destroy every zone the runtime holds for this data dir, then every leftover
part that belongs to no zone (links, processes, zone roots). Stopping the agent
never does this; this command is how an operator empties a sled. It refuses to
run while an agent uses the data dir or, with the linux runtime, while any agent
of the same zone tag runs on the host, and it removes only this data dir's sled's
parts (others are logged as not ours and left alone). With the linux runtime it
then unmounts the pools under --pool-root and detaches the loop devices of the
--vdev-dir files and of those the agent recorded attaching (so --vdev-dir need
not be given again); nothing is formatted, and real disks are only unmounted.
Last it unmounts the tmpfs the agent mounted on the run dir, unless another
agent's files are in it. What it leaves, it says why. The ledger is kept: an
agent started later creates the ledgered zones again.

To clear the zones of a sled whose data dir is gone, give its id and an empty
data dir: --sled-id <its id> --data-dir <an empty dir>.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return fmt.Errorf("teardown destroys every zone of this sled: pass --yes to do it")
			}
			cfg, err := d.resolve(cmd)
			if err != nil {
				return err
			}
			log, err := newLogger(d.logLevel)
			if err != nil {
				return err
			}
			if cfg.Netns != "" {
				// A sled in a namespace is torn down from inside it.
				if err := sledns.Enter(cfg.Netns); err != nil {
					return err
				}
			}
			ctx, cancel := signalContext()
			defer cancel()
			r, err := agent.TeardownReport(ctx, cfg, log)
			for _, line := range r.Removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", line)
			}
			for _, line := range r.Left {
				fmt.Fprintln(cmd.OutOrStdout(), "left", line)
			}
			if err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%d removed; the ledger is kept\n", len(r.Removed))
			}
			return err
		},
	}
	// What teardown reads of the agent's config: whose sled, which
	// runtime, and where the linux runtime's parts are.
	d.add(cmd, "data-dir", "netns", "runtime", "sled-id", "run-dir", "vdev-dir", "pool-root", "log-level", "zone-tag", "netns-prefix")
	d.all.Lookup("data-dir").Usage = "the agent's data dir: its sled's zones are destroyed"
	d.all.Lookup("runtime").Usage = "the agent's zone runtime: sim or linux"
	d.all.Lookup("sled-id").Usage = "the sled whose parts the linux runtime removes (default: the one kept in --data-dir)"
	d.all.Lookup("run-dir").Usage = "the linux runtime's run dir, whose tmpfs is unmounted last"
	d.all.Lookup("vdev-dir").Usage = "directory of file-backed disks whose loop devices are detached (linux runtime; those the agent recorded attaching are detached anyway)"
	d.all.Lookup("pool-root").Usage = "where the linux runtime's pools are mounted, to be unmounted (default <data-dir>/storage)"
	cmd.Flags().BoolVar(&yes, "yes", false, "really destroy every zone")
	return cmd
}
