package cli

import (
	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/bench"
)

func newBenchCmd() *cobra.Command {
	opts := bench.Options{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure API latency beside a hanging zone and the cost of a no-op reconcile pass; prints JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			// Progress on stderr; stdout is the JSON result alone.
			opts.Progress = cmd.ErrOrStderr()
			res, err := bench.Run(ctx, opts)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.APIZones, "zones", 1000, "zones in the config used for the API measurements")
	f.IntVar(&opts.Requests, "requests", 200, "timed requests of each kind")
	f.IntSliceVar(&opts.PassZones, "pass-zones", []int{1000, 10000}, "config sizes for the no-op pass measurement")
	f.IntVar(&opts.Passes, "passes", 50, "timed no-op passes at each size")
	cmd.AddCommand(newBenchZonesCmd(), newBenchRestartCmd(), newBenchPrefixesCmd(), newBenchNATCmd(), newBenchVMMCmd(), newBenchStorageCmd(), newBenchPutCmd(), newBenchGuestCmd(), newBenchVPCCmd())
	return cmd
}
