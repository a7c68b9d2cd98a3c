package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// bench vpc, tiny: each of the three ways carries the stream and the round
// trips, says so on the progress writer, and leaves no namespace.
func TestVPCBenchRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	profPath := filepath.Join(t.TempDir(), "vpc.prof")
	res, err := VPC(ctx, VPCOptions{Stream: 300 * time.Millisecond, Requests: 20, CPUProfile: profPath, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Paths) != 3 {
		t.Fatalf("paths %+v", res.Paths)
	}
	for _, p := range res.Paths {
		if p.StreamGbps <= 0 || p.RoundTrip.N == 0 {
			t.Errorf("%s: %+v", p.Path, p)
		}
		// Only the VPC way's CPU is broken down, and its parts are all
		// of it.
		sum := 0.0
		for _, c := range p.CPU {
			sum += c.Share
		}
		if (p.Path == "vpc") != (len(p.CPU) > 0) || len(p.CPU) > 0 && math.Abs(sum-1) > 1e-6 {
			t.Errorf("%s: CPU breakdown %+v", p.Path, p.CPU)
		}
	}
	if st, err := os.Stat(profPath); err != nil || st.Size() == 0 {
		t.Errorf("the CPU profile: %v", err)
	}
	for _, want := range []string{"vpc: setting up", "kernel-vxlan: setting up", "veth: setting up", "UDP round trips", "vpc: CPU: data path"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("no %q in the progress: %s", want, progress.String())
		}
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "zb") {
			t.Errorf("left: namespace %s", l)
		}
	}
}

// The round trips go in rounds taking each way in turn: every way gets its
// requests (a remainder spread over the first rounds), each round starts
// one way further on, and a round trip that fails is not timed.
func TestInterleaveTakesEachWayInTurn(t *testing.T) {
	var order []int
	way := func(i int, fail func(n int) bool) func() (time.Duration, error) {
		n := 0
		return func() (time.Duration, error) {
			order = append(order, i)
			n++
			if fail != nil && fail(n) {
				return 0, errors.New("lost")
			}
			return time.Duration(len(order)), nil
		}
	}
	ways := []func() (time.Duration, error){way(0, nil), way(1, func(n int) bool { return n%5 == 0 }), way(2, nil)}
	got := interleave(context.Background(), ways, 7, 3)
	want := []int{
		0, 0, 0, 1, 1, 1, 2, 2, 2, // round 0: 3 each (7 = 3+2+2)
		1, 1, 2, 2, 0, 0, // round 1 starts with way 1
		2, 2, 0, 0, 1, 1, // round 2 with way 2
	}
	if !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if len(got[0]) != 7 || len(got[1]) != 6 || len(got[2]) != 7 {
		t.Errorf("timed %d, %d, %d round trips; want 7, 6 (the fifth lost), 7", len(got[0]), len(got[1]), len(got[2]))
	}
	// Each way's durations are its own (the call's index in the order).
	for i, ds := range got {
		for _, d := range ds {
			if order[d-1] != i {
				t.Errorf("way %d got the duration of a call to way %d", i, order[d-1])
			}
		}
	}
}

// A load that grows through the run weighs on every way alike: three ways
// equally fast, timed on a clock that slows down as calls go by, come out
// with p50s within a round's drift of each other; one way after the other
// they would not.
func TestInterleaveSharesDrift(t *testing.T) {
	calls := 0
	way := func() (time.Duration, error) {
		calls++
		return time.Duration(calls) * time.Microsecond, nil // the machine slows
	}
	const requests = 1000
	got := interleave(context.Background(), []func() (time.Duration, error){way, way, way}, requests, 10)
	var p50 []float64
	for _, ds := range got {
		if len(ds) != requests {
			t.Fatalf("%d round trips, want %d", len(ds), requests)
		}
		p50 = append(p50, summarize(ds).P50ms)
	}
	lo, hi := slices.Min(p50), slices.Max(p50)
	// A round is 300 calls: the ways' p50s differ by at most that.
	if hi-lo > 0.3 {
		t.Errorf("p50s %v ms: a drift of the machine biases a way", p50)
	}
	// One round: the last way would see twice the first's p50.
	calls = 0
	seq := interleave(context.Background(), []func() (time.Duration, error){way, way, way}, requests, 1)
	if a, c := summarize(seq[0]).P50ms, summarize(seq[2]).P50ms; c < 2*a {
		t.Errorf("one round: p50s %v and %v ms; the test does not show drift", a, c)
	}
}

// A cancelled run stops between round trips.
func TestInterleaveStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	way := func() (time.Duration, error) {
		if n++; n == 5 {
			cancel()
		}
		return time.Microsecond, nil
	}
	got := interleave(ctx, []func() (time.Duration, error){way, way}, 100, 10)
	if len(got[0])+len(got[1]) != 5 {
		t.Errorf("timed %d and %d round trips after a cancel at the fifth", len(got[0]), len(got[1]))
	}
}

// Latencies keep tenths of a microsecond, as round trips of some tens of
// microseconds need to be compared.
func TestSummarizeKeepsTenthsOfMicroseconds(t *testing.T) {
	ds := []time.Duration{20550 * time.Nanosecond, 19 * time.Microsecond, 31*time.Microsecond + 990*time.Nanosecond}
	l := summarize(ds)
	if l.N != 3 || l.P50ms != 0.0205 || l.P99ms != 0.0319 || l.MaxMs != 0.0319 {
		t.Errorf("%+v, want p50 0.0205 ms, p99 and max 0.0319", l)
	}
}
