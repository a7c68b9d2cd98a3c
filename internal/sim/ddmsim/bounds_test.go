package ddmsim_test

import (
	"testing"

	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// Every route of the simulator, its control ones included, bounds its
// body: one announced over the limit is a 413 at once, naming it.
func TestEveryRouteIsBounded(t *testing.T) {
	s, _ := start(t)
	simhttptest.CheckBounds(t, s, ddmsim.APIVersion, false)
}
