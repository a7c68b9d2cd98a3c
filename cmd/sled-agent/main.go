// Command sled-agent is the sled agent daemon (run), a whole simulated sled
// for development (dev), the operator commands that talk to a running agent,
// and the benchmarks (bench).
package main

import (
	"fmt"
	"os"

	"github.com/sled-agent/sled-agent/internal/cli"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
)

func main() {
	// Started by the VMM service to shut QEMU in: nothing else runs.
	qemujail.RunIfAsked()
	// Started by a stand-in guest's service to hold the guest's network
	// namespace: nothing else runs.
	standin.RunIfAsked()
	args := os.Args[1:]
	// Started by runsv as a zone's service: the arguments are in the
	// service directory (supervise.PrepareDirect).
	argv, ok, err := supervise.RunArgs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sled-agent: %v\n", err)
		os.Exit(2)
	}
	if ok {
		supervise.SetTitle(argv) // best effort: only what ps shows
		args = argv[1:]
	}
	os.Exit(cli.Main(args))
}
