package nexussim_test

import (
	"testing"

	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// Every route of the simulator, its control ones included, bounds its
// body: one announced over the limit is a 413 at once, naming it.
func TestEveryRouteIsBounded(t *testing.T) {
	simhttptest.CheckBounds(t, start(t), nexussim.APIVersion, false)
}
