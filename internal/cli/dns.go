package cli

import (
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/dns"
)

func newSimDNSCmd() *cobra.Command {
	var listen, records, logLevel string
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Run an internal DNS server for the control-plane zone, records from a file",
		Long: `Run an authoritative DNS server for control-plane.oxide.internal, over UDP
and TCP, until SIGINT or SIGTERM.

It serves the SRV and AAAA records of --records, a JSON file, and reloads it
when it changes (checked every 500ms): rewrite the file to move a switch to
a new address. A file that cannot be loaded is logged and the records kept.
Every answer has TTL 0; names outside the zone are REFUSED. Example:

  {
    "srv": {
      "_dendrite._tcp.control-plane.oxide.internal": [
        {"target": "dendrite-<sled uuid>.host.control-plane.oxide.internal", "port": 12224}
      ]
    },
    "aaaa": {
      "dendrite-<sled uuid>.host.control-plane.oxide.internal": ["fd00:1122:3344:101::2"]
    }
  }

SRV records also take "priority" and "weight" (default 0).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			s := dns.NewServer(log.With("component", "dnssim"))
			if err := s.LoadFile(records); err != nil {
				return err
			}
			if err := s.Start(listen); err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			s.WatchFile(ctx, records)
			log.Info("dns server stopping")
			return s.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "[::1]:53", "address to serve DNS on, UDP and TCP")
	cmd.Flags().StringVar(&records, "records", "", "JSON file of the records to serve (required)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	cmd.MarkFlagRequired("records")
	return cmd
}
