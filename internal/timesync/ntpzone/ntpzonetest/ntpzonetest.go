// Package ntpzonetest lets a test binary stand in for the agent binary that
// the Linux runtime's NTP image runs.
package ntpzonetest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone"
)

// ServeIfAsked plays `sled-agent ntp-zone` when the binary was started as
// the NTP image starts the agent: `<binary> ntp-zone --listen A --root R
// --tag T [--no-clock]`. It serves until SIGTERM and exits; otherwise it
// returns at once. Call it from TestMain after zoneservicetest.ServeIfAsked,
// which turns a service's run.args into os.Args.
func ServeIfAsked() {
	a := os.Args
	if len(a) != 8 && len(a) != 9 || a[1] != "ntp-zone" || a[2] != "--listen" || a[4] != "--root" || a[6] != "--tag" {
		return
	}
	opts := ntpzone.Options{Listen: a[3], Root: a[5], Tag: a[7], Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	if len(a) == 9 {
		if a[8] != "--no-clock" {
			return
		}
		opts.NoClock = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := ntpzone.Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "ntp-zone:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
