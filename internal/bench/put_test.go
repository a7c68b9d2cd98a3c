package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A small run of the config benchmark works and leaves nothing behind: no
// namespace, run dir, mount or loop device of its own. The figures are for
// `sled-agent bench put`, not for a test.
func TestPutSmallRunLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the benchmark makes pools, network namespaces, links and supervised processes")
	}
	for _, tool := range []string{"runsv", "mkfs.btrfs", "btrfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (scripts/setup installs runit and btrfs-progs)", tool)
		}
	}
	before := putLeftovers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Put(ctx, PutOptions{Count: 2, Rounds: 1, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Zones != 2 || res.Datasets != 4 || len(res.Rounds) != 1 {
		t.Errorf("result %+v: want 2 zones, 4 datasets made by the PUT, 1 round", res)
	}
	r := res.Rounds[0]
	if r.PutAllOKMs <= 0 || r.PutDatasetsMs <= 0 || r.PutDatasetsMs > r.PutAllOKMs || r.RuntimeAloneMs <= 0 || r.Ratio <= 0 {
		t.Errorf("round %+v", r)
	}
	if left := newSince(before, putLeftovers(t)); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// putLeftovers lists what a run of the config benchmark could leave: what
// the runtime alone's zone benchmark could (benchLeftovers), the agent's
// namespaces ("bp…"), run dirs and mounts of its temporary dirs.
func putLeftovers(t *testing.T) []string {
	t.Helper()
	out := benchLeftovers(t)
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "bp") {
			out = append(out, "namespace "+e.Name())
		}
	}
	for _, g := range []string{"/dev/shm/sled-agent-bench-put-*", filepath.Join(os.TempDir(), "sled-agent-bench-put-*")} {
		dirs, _ := filepath.Glob(g)
		out = append(out, dirs...)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, "sled-agent-bench-put-") {
			out = append(out, "mount "+line)
		}
	}
	return out
}
