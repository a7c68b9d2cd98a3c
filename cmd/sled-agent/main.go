// Command sled-agent is the sled agent daemon (run), a whole simulated sled
// for development (dev), the operator commands that talk to a running agent,
// and the benchmarks (bench).
package main

import (
	"os"

	"github.com/sled-agent/sled-agent/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
