package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// A boot of the host is the kernel's and, with the Linux runtime, its run
// dir's: the same while the run dir keeps its token, another once it is
// emptied (as a reboot empties /run).
func TestHostBootFollowsTheRunDir(t *testing.T) {
	runDir := t.TempDir()
	cfg := Config{Runtime: "linux", RunDir: runDir, ZoneTag: "bt1"}
	first, err := hostBoot(cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := hostBoot(cfg)
	if err != nil || again != first {
		t.Fatalf("the same boot named %q, then %q (%v)", first, again, err)
	}
	if err := os.Remove(filepath.Join(runDir, "bt1.boot")); err != nil {
		t.Fatal(err)
	}
	after, err := hostBoot(cfg)
	if err != nil || after == first {
		t.Fatalf("after the run dir was emptied: %q, before %q (%v)", after, first, err)
	}
	sim, err := hostBoot(Config{Runtime: "sim"})
	if err != nil || sim == "" {
		t.Fatalf("the sim runtime's boot: %q, %v", sim, err)
	}
}
