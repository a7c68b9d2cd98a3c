package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
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
	res, err := VPC(ctx, VPCOptions{Stream: 300 * time.Millisecond, Requests: 20, Progress: &progress})
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
	}
	for _, want := range []string{"vpc: setting up", "kernel-vxlan: setting up", "veth: setting up", "UDP round trips"} {
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
