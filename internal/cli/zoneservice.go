package cli

import (
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// newZoneServiceCmd is the default zone image: the service a zone runs on
// Linux when its kind has no real one. The agent starts it; people do not.
func newZoneServiceCmd() *cobra.Command {
	var listen string
	var info zoneservice.Info
	cmd := &cobra.Command{
		Use:    "zone-service",
		Short:  "Run the default zone service: answers GET /health for the zone",
		Long:   "Run the default zone service, which answers GET /health with the zone's name, id and kind, until SIGTERM or SIGINT.",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			return zoneservice.Serve(ctx, listen, info)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "TCP address to listen on, e.g. [fd00:1122:3344:101::5]:32345")
	f.StringVar(&info.Name, "zone", "", "zone name")
	f.StringVar(&info.ID, "id", "", "zone id")
	f.StringVar(&info.Kind, "kind", "", "zone kind")
	for _, name := range []string{"listen", "zone", "id", "kind"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}
