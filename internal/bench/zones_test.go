package bench

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/syncbuf"
	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// TestMain lets this test binary stand in for the agent binary whose
// zone-service the benchmark's zones run.
func TestMain(m *testing.M) {
	zoneservicetest.ServeIfAsked()
	zoneservicetest.ExitIfService()
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
	res, made := zonesRun(t, ZonesOptions{Count: 3})
	if res.Calibration || res.Zones != 3 || len(res.PerRound) != 1 || res.Up.FloorS <= 0 || res.Up.RuntimeS <= 0 || res.Down.FloorS <= 0 || res.Down.RuntimeS <= 0 {
		t.Errorf("result %+v", res)
	}
	if made != 3 {
		t.Errorf("the runtime made %d zones, want 3", made)
	}
}

// A calibration run puts the floor in the runtime's place: the runtime
// makes no zone, and both sides' figures are the floor's.
func TestZonesCalibrateRunsOnlyTheFloor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the benchmark creates network namespaces and links")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	res, made := zonesRun(t, ZonesOptions{Count: 2, Calibrate: true})
	if !res.Calibration || res.Up.FloorS <= 0 || res.Up.RuntimeS <= 0 || res.Down.FloorS <= 0 || res.Down.RuntimeS <= 0 {
		t.Errorf("result %+v", res)
	}
	if made != 0 {
		t.Errorf("the runtime made %d zones in a calibration run, want none", made)
	}
}

// zonesRun runs the zone benchmark for one round with opts, checks that it
// left nothing behind, and returns its result and how many zones the
// runtime said it made ready.
func zonesRun(t *testing.T, opts ZonesOptions) (*ZonesResult, int) {
	t.Helper()
	before := benchLeftovers(t)
	var log syncbuf.Buffer
	opts.Rounds, opts.TempDir, opts.PhaseTimeout = 1, t.TempDir(), time.Minute
	opts.RuntimeLog = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Zones(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if left := newSince(before, benchLeftovers(t)); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	return res, strings.Count(log.String(), `msg="zone ready"`)
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
