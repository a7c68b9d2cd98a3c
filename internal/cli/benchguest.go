package cli

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchGuestCmd() *cobra.Command {
	opts := bench.GuestOptions{}
	var quiet bool
	cmd := &cobra.Command{
		Use:   "guest",
		Short: "Time a real guest's boot and stop through the agent against the same QEMU started by hand; needs root, QEMU and OVMF; prints JSON",
		Long: `Run the agent (this binary, with the linux runtime, a zone tag, namespace
prefix and temporary dirs of its own, --vmm-accel tcg) and, --rounds times,
alternately first:

  agent: PUT /vmms/{id} with the test guest's disk (a copy in --vmm-image-dir),
         PUT state running, and the time to the first byte and to the guest's
         READY line on the serial console's websocket at propolis_addr; then
         PUT state stopped until the VMM is destroyed;
  floor: the QEMU command line the VMM service builds for the same spec,
         started by hand in a network namespace (QMP cont, com1 read
         directly), timed the same way; system_powerdown until QEMU exits.

Each side boots one VMM, then --at-once VMMs together (time until every one
shows READY). Prints medians, agent/floor ratios, per-round figures, and the
resident memory of the agent, each VMM service and each QEMU, as JSON;
progress goes to stderr.

Run it from the built binary (go build -o /tmp/sled-agent ./cmd/sled-agent).
The test guest is built on first use (scripts/build-test-guest). Everything it
creates carries a unique prefix and is removed on exit, error or Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !quiet {
				opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("bench", "guest")
			}
			ctx, cancel := signalContext()
			defer cancel()
			res, err := bench.Guest(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Rounds, "rounds", 3, "rounds of floor and agent; medians are reported")
	f.IntVar(&opts.AtOnce, "at-once", 4, "VMMs booted together in each round's second phase (below 2: none)")
	f.StringVar(&opts.Image, "image", "", "the test guest's disk image (default: built into /var/cache/sled-agent/test-guest)")
	f.StringVar(&opts.AgentLog, "agent-log", "", "keep the agent's log in this file (default: in the run's temporary dir, removed)")
	f.DurationVar(&opts.BootTimeout, "boot-timeout", 4*time.Minute, "deadline of each boot phase (every guest's READY line)")
	f.DurationVar(&opts.StopTimeout, "stop-timeout", time.Minute, "deadline of each stop phase")
	f.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	return cmd
}
