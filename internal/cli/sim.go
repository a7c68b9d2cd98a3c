package cli

import (
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
)

func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated neighbours of the agent",
	}
	cmd.AddCommand(newSimDDMCmd())
	return cmd
}

func newSimDDMCmd() *cobra.Command {
	var listen, logLevel string
	cmd := &cobra.Command{
		Use:   "ddm",
		Short: "Run a simulated DDM admin server (maghemite ddmd)",
		Long: `Run a simulated DDM admin server (maghemite ddmd) until SIGINT or SIGTERM.

It serves GET /originated, PUT and DELETE /prefix, GET /peers and GET /prefixes
like ddmd (api-version 2.0.0), keeping the originated prefixes in memory. As
with ddmd, requests need an api-version header, and bodies must be sent as
JSON (curl -H 'Content-Type: application/json').

Simulator-only control endpoints (no api-version header needed):
  PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"}
  POST /__sim/restart-empty  forget every prefix and drop every connection
  GET  /__sim/state          fault, originated prefixes, request counts
A "refuse" fault stops listening, so it cannot be cleared over HTTP: give
"refuse_for" to have it end by itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			s := ddmsim.New(log.With("component", "ddmsim"))
			if err := s.Start(listen); err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			<-ctx.Done()
			log.Info("ddm simulator stopping")
			return s.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "[::1]:8000", "address to serve the DDM admin API on")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}
