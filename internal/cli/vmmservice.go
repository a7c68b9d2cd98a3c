package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/vmm/propolis"
)

// newVMMServiceCmd is the service a VMM zone runs: it plays propolis for a
// simulated guest. The agent starts it; people do not.
func newVMMServiceCmd() *cobra.Command {
	var listen, id string
	var opts propolis.Options
	cmd := &cobra.Command{
		Use:    "vmm-service",
		Short:  "Run the VMM service: a simulated guest driven over HTTP, as propolis is",
		Long:   "Run the VMM service of a VMM zone, which boots, runs, reboots and stops a simulated guest on request (PUT /state) and reports its state (GET /state, long polls with ?after_gen=N&wait=D) and health (GET /health), until SIGTERM or SIGINT.",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Zero would silently mean the default: refuse it with the rest.
			for _, d := range []struct {
				flag string
				v    time.Duration
			}{{"boot-time", opts.BootTime}, {"stop-time", opts.StopTime}, {"reboot-time", opts.RebootTime}} {
				if d.v <= 0 {
					return fmt.Errorf("--%s %s: want a positive duration", d.flag, d.v)
				}
			}
			ctx, cancel := signalContext()
			defer cancel()
			return propolis.Serve(ctx, listen, id, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "TCP address to listen on, e.g. [fd00:1122:3344:101::5]:12400")
	f.StringVar(&id, "id", "", "the VMM's propolis id (a UUID)")
	f.DurationVar(&opts.BootTime, "boot-time", propolis.DefaultBootTime, "how long the simulated guest takes to boot")
	f.DurationVar(&opts.StopTime, "stop-time", propolis.DefaultStopTime, "how long the simulated guest takes to stop")
	f.DurationVar(&opts.RebootTime, "reboot-time", propolis.DefaultRebootTime, "how long the simulated guest takes to reboot")
	for _, name := range []string{"listen", "id"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}
