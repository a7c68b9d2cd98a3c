// Package zoneservicetest lets a test binary stand in for the agent binary
// that the linux runtime's default image runs.
package zoneservicetest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// ServeIfAsked is for a test's TestMain: when the binary was started as the
// default image starts the agent binary, `<binary> zone-service --listen A
// --zone N --id I --kind K [--start-delay D]`, it serves like `sled-agent zone-service` until
// SIGTERM or SIGINT and exits; otherwise it returns at once. A binary that
// runsv started as ./run gets its arguments as the agent does
// (supervise.RunArgs): ServeIfAsked puts them in os.Args first, for
// whatever else TestMain looks for.
func ServeIfAsked() {
	argv, ok, err := supervise.RunArgs()
	if err != nil {
		// Never go on to run the tests: runsv would start them again and
		// again, each making more zones.
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if ok {
		supervise.SetTitle(argv)
		os.Args = argv
	}
	a := os.Args
	if len(a) != 10 && len(a) != 12 || a[1] != "zone-service" || a[2] != "--listen" || a[4] != "--zone" || a[6] != "--id" || a[8] != "--kind" {
		return
	}
	var delay time.Duration
	if len(a) == 12 {
		d, err := time.ParseDuration(a[11])
		if a[10] != "--start-delay" || err != nil {
			return
		}
		delay = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	select {
	case <-ctx.Done():
		os.Exit(0)
	case <-time.After(delay):
	}
	if err := zoneservice.Serve(ctx, a[3], zoneservice.Info{Name: a[5], ID: a[7], Kind: a[9]}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ExitIfService is for a test's TestMain, called last before the tests run:
// a binary that carries a service's mark (runsv started it as a service,
// or a service started it) but that nothing before recognised exits with
// an error instead of running the tests, which would make more services
// that run this binary, and so on without end.
func ExitIfService() {
	if dir := os.Getenv(supervise.MarkerEnv); dir != "" {
		fmt.Fprintf(os.Stderr, "started as (or by) the service %s with arguments no stand-in knows: %q; not running the tests\n", dir, os.Args)
		os.Exit(2)
	}
}
