package dpdsim_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// Every route of the simulator, its control ones included, bounds its
// body: one announced over the limit is a 413 at once, naming it.
func TestEveryRouteIsBounded(t *testing.T) {
	s, _ := start(t)
	simhttptest.CheckBounds(t, s, dpdsim.APIVersion, false)
}

// A body of unknown length cut at the limit is a 413 naming it, not the
// handler's 400 for a body it cannot read.
func TestChunkedBodyOverLimit(t *testing.T) {
	s, _ := start(t)
	body := io.MultiReader(strings.NewReader(`{"external": "`), strings.NewReader(strings.Repeat("f", simhttp.MaxBodyBytes)))
	req, err := http.NewRequest(http.MethodPut, s.URL()+"/nat/ipv6/fd00::1/1024/2047", io.NopCloser(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("api-version", dpdsim.APIVersion)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), httpbound.TooLargeMessage(simhttp.MaxBodyBytes)) {
		t.Fatalf("%s %s, want 413 naming %d bytes", resp.Status, b, simhttp.MaxBodyBytes)
	}
}
