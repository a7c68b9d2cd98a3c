package bench_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/bench"
	"github.com/sled-agent/sled-agent/internal/cli"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
)

// guestAgentEnv makes this test binary the agent the guest benchmark runs.
const guestAgentEnv = "BENCH_GUEST_RUN_AGENT"

// init lets this test binary stand in for the agent binary: the guest
// benchmark runs it with `run …`, and the agent's VMM zones with
// `vmm-service …` (under runsv, as ./run), and those services their QEMU
// through qemujail's step. It runs before TestMain, which
// serves the zone benchmark's `zone-service …`.
func init() {
	qemujail.RunIfAsked() // a VMM service's QEMU, shut in
	argv := os.Args
	if a, ok, err := supervise.RunArgs(); err == nil && ok {
		argv = a
	}
	if len(argv) > 1 && argv[1] == "vmm-service" {
		if len(os.Args) == 1 {
			supervise.SetTitle(argv)
		}
		os.Exit(cli.Main(argv[1:]))
	}
	if os.Getenv(guestAgentEnv) == "1" {
		os.Exit(cli.Main(os.Args[1:]))
	}
}

// A run of one round with one VMM works and leaves nothing behind: no
// QEMU, namespace, run dir, temporary dir or host lock of its own. The
// figures are for `sled-agent bench guest`, not for a test (two TCG boots
// of the test guest: about a minute).
func TestGuestSmallRunLeavesNothing(t *testing.T) {
	image := testguest.Image(t) // skips without root, QEMU or OVMF
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	before := guestLeftovers(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	res, err := bench.Guest(ctx, bench.GuestOptions{Rounds: 1, AtOnce: 1, Image: image, AgentEnv: []string{guestAgentEnv + "=1"},
		BootTimeout: 3 * time.Minute, StopTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	o := res.One
	if !res.SameCommandLine || len(res.PerRound) != 1 || res.PerRound[0].AgentAtOnce != nil ||
		o.FloorFirstByteMs <= 0 || o.FloorMarkerMs < o.FloorFirstByteMs || o.AgentFirstByteMs <= 0 || o.AgentMarkerMs < o.AgentFirstByteMs ||
		o.FloorStopMs <= 0 || o.AgentStopMs <= 0 || o.MarkerRatio <= 0 {
		t.Errorf("result %+v", res)
	}
	if m := res.Memory; m.AgentIdleKiB <= 0 || m.AgentOneKiB <= 0 || m.ServiceKiB <= 0 || m.AgentQEMUKiB <= 0 || m.FloorQEMUKiB <= 0 {
		t.Errorf("memory %+v", m)
	}
	t.Logf("marker: floor %.0f ms, agent %.0f ms (ratio %.3f)", o.FloorMarkerMs, o.AgentMarkerMs, o.MarkerRatio)
	if left := newItems(before, guestLeftovers(t)); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// guestLeftovers lists what a run of the guest benchmark could leave:
// namespaces ("bg…"), its temporary and run dirs, host locks of its tags,
// and processes (QEMU, the agent, services) naming its dirs.
func guestLeftovers(t *testing.T) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "bg") {
			out = append(out, "namespace "+e.Name())
		}
	}
	for _, g := range []string{"/dev/shm/sled-agent-bench-guest-*", filepath.Join(os.TempDir(), "sled-agent-bench-guest-*"), "/run/lock/sled-agent-bg*.lock"} {
		found, _ := filepath.Glob(g)
		out = append(out, found...)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("sled-agent-bench-guest-")) {
			out = append(out, "process "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// newItems lists what is in after and not in before.
func newItems(before, after []string) []string {
	seen := map[string]bool{}
	for _, b := range before {
		seen[b] = true
	}
	var out []string
	for _, a := range after {
		if !seen[a] {
			out = append(out, a)
		}
	}
	return out
}
