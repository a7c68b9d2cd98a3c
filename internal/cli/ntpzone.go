package cli

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone"
)

// newNTPZoneCmd is what NTP zones run on Linux (the runtime's NTPImage):
// chronyd for the zone, ntp-admin and the zone's health. The agent starts
// it; people do not.
func newNTPZoneCmd() *cobra.Command {
	var opts ntpzone.Options
	cmd := &cobra.Command{
		Use:    "ntp-zone",
		Short:  "Run an NTP zone's service: chronyd, ntp-admin's GET /timesync and GET /health",
		Long:   "Run the service of the NTP zone whose root is --root: chronyd configured from the zone's config (boundary_ntp: its ntp_servers; internal_ntp: the servers the agent sets), kept running; ntp-admin's GET /timesync on the zone's address, port 10123; and GET /health on --listen; until SIGTERM or SIGINT.",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return ntpzone.Run(ctx, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen", "", "TCP address of GET /health: the zone's service address, e.g. [fd00:1122:3344:101::21]:123")
	f.StringVar(&opts.Root, "root", "", "the zone root, holding the zone's mark (zone.json)")
	f.StringVar(&opts.Tag, "tag", "sled-agent", "the zone runtime's tag: the zone's mark carries it, and it names the command socket's directory")
	f.BoolVar(&opts.NoClock, "no-clock", false, "chronyd only tracks (-x) and never sets this machine's clock")
	for _, name := range []string{"listen", "root"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}
