package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// TestMain lets this test binary stand in for the agent binary whose
// zone-service the benchmark's zones run.
func TestMain(m *testing.M) {
	zoneservicetest.ServeIfAsked()
	os.Exit(m.Run())
}

// A small run of the zone benchmark works and leaves nothing behind: the
// figures themselves are for `sled-agent bench zones`, not for a test.
func TestZonesSmallRunLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the benchmark creates network namespaces, links and supervised processes")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	before := benchLeftovers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Zones(ctx, ZonesOptions{Count: 3, Rounds: 1, TempDir: t.TempDir(), PhaseTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Zones != 3 || len(res.PerRound) != 1 || res.Up.FloorS <= 0 || res.Up.RuntimeS <= 0 || res.Down.FloorS <= 0 || res.Down.RuntimeS <= 0 {
		t.Errorf("result %+v", res)
	}
	if left := newSince(before, benchLeftovers(t)); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// newSince lists what is in after and not in before.
func newSince(before, after []string) []string {
	var out []string
	for _, a := range after {
		if !slices.Contains(before, a) {
			out = append(out, a)
		}
	}
	return out
}

// benchLeftovers lists what a zone benchmark run could leave: namespaces
// with its prefix and run directories.
func benchLeftovers(t *testing.T) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "bz") {
			out = append(out, "namespace "+e.Name())
		}
	}
	dirs, _ := filepath.Glob("/dev/shm/sled-agent-bench-zones-*")
	return append(out, dirs...)
}
