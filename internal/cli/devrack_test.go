package cli

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// A killed dev's second sled's agent is found by its data dir, and only
// it, and stopped before its sled is torn down.
func TestDevRackStopsALeftoverAgent(t *testing.T) {
	dir := t.TempDir()
	// A process whose command line is an agent's of data dir dir-b (and
	// one of another data dir): sh runs the script "run", its first
	// argument. It waits without forking (a child, between its fork and
	// its exec, would have the same command line): opening a FIFO no one
	// writes to.
	script := filepath.Join(dir, "run")
	if err := os.WriteFile(script, []byte("read x < fifo\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(dataDir string) *exec.Cmd {
		cmd := exec.Command("sh", "run", "--listen", "[::1]:0", "--data-dir", dataDir)
		cmd.Dir = dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	dataB := filepath.Join(dir, "data-b")
	agent := start(dataB)
	other := start(filepath.Join(dir, "data-c"))
	if got := agentsOf(dataB); !slices.Equal(got, []int{agent.Process.Pid}) {
		t.Fatalf("agentsOf(%s) = %v, want [%d] (not %d, of another data dir)", dataB, got, agent.Process.Pid, other.Process.Pid)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	r := &devRack{progress: io.Discard}
	r.b.DataDir = dataB
	if err := r.stopLeftoverAgents(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err == nil {
		t.Errorf("the leftover agent exited cleanly, want it ended by a signal")
	}
	if got := agentsOf(dataB); len(got) > 0 {
		t.Errorf("left: %v", got)
	}
	if got := agentsOf(filepath.Join(dir, "data-c")); !slices.Equal(got, []int{other.Process.Pid}) {
		t.Errorf("the agent of another data dir: agentsOf = %v, want it still running (%d)", got, other.Process.Pid)
	}
}
