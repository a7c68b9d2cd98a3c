package cli

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
)

// dev's banner is printed once; after it, a repair and a config put and its
// convergence are a line each.
func TestDevProgressBannerOnce(t *testing.T) {
	var out bytes.Buffer
	p := newDevProgress(&out, time.Now())
	p.gen = 351
	zones := func(states ...reconciler.State) []reconciler.ZoneStatus {
		var zs []reconciler.ZoneStatus
		for i, s := range states {
			zs = append(zs, reconciler.ZoneStatus{Name: []string{"oxz_a", "oxz_b", "oxz_c"}[i], Wanted: true, State: s})
		}
		return zs
	}
	run, fail, start := reconciler.StateRunning, reconciler.StateFailed, reconciler.StateStarting
	banners := 0
	for _, s := range []struct {
		gen, passGen uint64
		idle         bool
		zones        []reconciler.ZoneStatus
	}{
		{351, 0, false, zones(start, start)},
		{351, 351, true, zones(run, run)}, // converged: the banner
		{351, 351, true, zones(run, run)},
		{351, 351, true, zones(run, fail)}, // a repair
		{351, 351, false, zones(run, start)},
		{351, 351, true, zones(run, run)},
		{352, 351, true, zones(run, run)}, // a config put, same zones
		{352, 352, true, zones(run, run)},
		{353, 352, true, zones(run, run, start)}, // a config put, one more zone
		{353, 353, true, zones(run, run, run)},
		{353, 353, true, zones(run, run, run)},
	} {
		if p.step(s.gen, s.passGen, s.idle, s.zones) {
			banners++
		}
	}
	if banners != 1 {
		t.Errorf("banner asked for %d times, want once", banners)
	}
	got := out.String()
	for _, want := range []string{
		"repaired oxz_b: all 2 zones running",
		"config generation 352 put; reconciling",
		"config generation 352 converged: all 2 zones running after",
		"config generation 353 put; reconciling",
		"config generation 353 converged: all 3 zones running after",
	} {
		if n := strings.Count(got, want); n != 1 {
			t.Errorf("output has %q %d times, want once:\n%s", want, n, got)
		}
	}
}

// bench prints its progress on stderr, a line per phase, and its result
// alone on stdout.
func TestBenchProgressOnStderr(t *testing.T) {
	r := sled(t, "bench", "--zones", "3", "--requests", "2", "--pass-zones", "3,4", "--passes", "2")
	if r.code != 0 {
		t.Fatalf("bench exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Errorf("bench stdout is not its JSON result alone: %v\n%s", err, r.stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	want := []string{
		"bench: starting 3 zones, one of them hanging",
		"bench: 2 config puts at 3 zones",
		"bench: 2 inventory reads at 3 zones",
		"bench: 2 no-op passes at 3 zones",
		"bench: 2 no-op passes at 4 zones",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("bench stderr = %q, want %q", lines, want)
	}
}

// bench restart, over the sim runtime, prints a line per phase and round
// on stderr and its result alone on stdout.
func TestBenchRestartProgressOnStderr(t *testing.T) {
	r := sled(t, "bench", "restart", "--runtime", "sim", "--count", "3", "--rounds", "2")
	if r.code != 0 {
		t.Fatalf("bench restart exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Errorf("bench restart stdout is not its JSON result alone: %v\n%s", err, r.stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	want := []string{
		"bench restart: bringing 3 zones up",
		"bench restart: round 1/2: an agent restarted over 3 zones",
		"bench restart: round 2/2: an agent restarted over 3 zones",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("bench restart stderr = %q, want %q", lines, want)
	}
}

// The other sim benchmarks print a line on stderr as each phase begins and
// as each timed loop ends (and one now and then in a long loop), and their
// result alone on stdout.
func TestBenchPhasesProgressOnStderr(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "nat", "--appearances", "2", "--period", "100ms"}, []string{
			"bench nat: starting an agent (sim runtime) that finds its switch daemons through DNS",
			"bench nat: the example config put; waiting for its 2 NAT entries on the first switch",
			"bench nat: 2 switch appearances, each at a random moment of the 100ms period",
			"bench nat: switch appearances: 2/2",
		}},
		{[]string{"bench", "prefixes", "--withdrawals", "2", "--recoveries", "1"}, []string{
			"bench prefixes: starting an agent (sim runtime) that keeps its prefixes in a DDM simulator",
			"bench prefixes: 2 withdrawals of an internal DNS zone's prefix",
			"bench prefixes: withdrawals: 2/2",
			"bench prefixes: 1 DDM outages of 1 to 3 s, each followed by its recovery",
			"bench prefixes: recoveries: 1/1",
		}},
		{[]string{"bench", "vmm", "--rounds", "1"}, []string{
			"bench vmm: starting an agent (sim runtime)",
			"bench vmm: phase 1/4, before its service is up: 1 rounds, each deleting a VMM's zone",
			"bench vmm: before its service is up: 1/1",
			"bench vmm: phase 2/4, starting: 1 rounds, each deleting a VMM's zone",
			"bench vmm: starting: 1/1",
			"bench vmm: phase 3/4, running: 1 rounds, each deleting a VMM's zone",
			"bench vmm: running: 1/1",
			"bench vmm: phase 4/4, stopping: 1 rounds, each deleting a VMM's zone",
			"bench vmm: stopping: 1/1",
		}},
		{[]string{"bench", "storage", "--runtime", "sim", "--rounds", "1", "--passes", "2"}, []string{
			"bench storage: round 1/1: 10 disks and 54 datasets from blank disks (sim runtime)",
			"bench storage: round 1/1: 2 no-op storage passes",
			"bench storage: round 1/1: no-op passes: 2/2",
			"bench storage: round 1/1: a new agent adopting them",
		}},
	} {
		name := strings.Join(tc.args[:2], " ")
		r := sled(t, tc.args...)
		if r.code != 0 {
			t.Errorf("%s: exit %d; stderr:\n%s", name, r.code, r.stderr)
			continue
		}
		var res map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Errorf("%s: stdout is not its JSON result alone: %v\n%s", name, err, r.stdout)
		}
		// Every wanted line, in order; a long loop's periodic lines (only
		// on a slow machine at this size) may come between them.
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		next := 0
		for _, l := range lines {
			if !strings.HasPrefix(l, name+": ") {
				t.Errorf("%s: a stderr line not its progress: %q", name, l)
			}
			if next < len(tc.want) && l == tc.want[next] {
				next++
			}
		}
		if next < len(tc.want) {
			t.Errorf("%s stderr = %q, want these lines in order: %q", name, lines, tc.want)
		}
	}
}

// dev --runtime linux boots real guests: stand-in guests, which boot
// nothing, are refused with why, before anything is made.
func TestDevLinuxRefusesStandInGuests(t *testing.T) {
	r := sled(t, "dev", "--runtime", "linux", "--vmm-stand-in", "--data-dir", t.TempDir())
	if r.code == 0 || !strings.Contains(r.stderr, "--vmm-stand-in") {
		t.Errorf("dev --runtime linux --vmm-stand-in: exit %d, stderr %q; want it refused, naming the flag", r.code, r.stderr)
	}
}
