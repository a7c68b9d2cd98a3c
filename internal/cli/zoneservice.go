package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// newZoneServiceCmd is the default zone image: the service a zone runs on
// Linux when its kind has no real one. The agent starts it; people do not.
func newZoneServiceCmd() *cobra.Command {
	var listen string
	var info zoneservice.Info
	var startDelay time.Duration
	cmd := &cobra.Command{
		Use:    "zone-service",
		Short:  "Run the default zone service: answers GET /health for the zone",
		Long:   "Run the default zone service, which answers GET /health with the zone's name, id and kind, until SIGTERM or SIGINT.",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			// A service that takes its time to start, as real ones do
			// (tests and the crash test use it to widen the window).
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(startDelay):
			}
			return zoneservice.Serve(ctx, listen, info)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "TCP address to listen on, e.g. [fd00:1122:3344:101::5]:32345")
	f.StringVar(&info.Name, "zone", "", "zone name")
	f.StringVar(&info.ID, "id", "", "zone id")
	f.StringVar(&info.Kind, "kind", "", "zone kind")
	f.DurationVar(&startDelay, "start-delay", 0, "wait this long before listening")
	for _, name := range []string{"listen", "zone", "id", "kind"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}
