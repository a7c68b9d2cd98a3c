package simhttp_test

import (
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// Every route, the control ones included, bounds its body: over the limit
// is a 413 at once, and a body that stops coming is cut at its deadline.
func TestEveryRouteIsBounded(t *testing.T) {
	cfg, _ := config()
	cfg.BodyReadTimeout = 100 * time.Millisecond
	s := simhttp.New(cfg)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	simhttptest.CheckBounds(t, s, "1.2.3", true)
}
