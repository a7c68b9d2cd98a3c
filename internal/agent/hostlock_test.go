package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// A second linux agent with the same zone tag, on another data dir, does not
// start while the first runs, nor does a teardown of its data dir; the error
// names the first (its pid and data dir). Agents with other tags run side by
// side, and once the first has stopped the second starts.
func TestLinuxSecondAgentWithTheTagRefusesToStart(t *testing.T) {
	tag, prefix, dirA, runDir := linuxEnv(t)
	dirB := linuxDataDir(t)
	cfgA := agent.Config{DataDir: dirA, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: prefix}
	stopA := run(t, newAgent(t, cfgA))

	holder := fmt.Sprintf("pid %d, data dir %s", os.Getpid(), dirA)
	cfgB := cfgA
	cfgB.DataDir, cfgB.Listen = dirB, "127.0.0.1:0"
	if b, err := agent.New(cfgB, testLogger(t)); err == nil {
		b.Close()
		t.Fatal("a second agent with the same tag started")
	} else if !strings.Contains(err.Error(), holder) {
		t.Errorf("second agent: %v; want it to name %q", err, holder)
	}
	if _, err := agent.Teardown(t.Context(), cfgB, testLogger(t)); err == nil || !strings.Contains(err.Error(), holder) {
		t.Errorf("teardown of another data dir: %v; want it refused, naming %q", err, holder)
	}

	// Another tag is another set of zones.
	tagC, prefixC, dirC, runDirC := linuxEnv(t)
	stopC := run(t, newAgent(t, agent.Config{DataDir: dirC, RunDir: runDirC, Runtime: "linux", ZoneTag: tagC, NetnsPrefix: prefixC}))
	if err := stopC(); err != nil {
		t.Fatal(err)
	}

	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	b := newAgent(t, cfgB)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// A data dir whose lock is still held a moment after its holder is gone
// (as after a SIGKILL) is taken once the lock is released; one whose holder
// is alive is refused at once.
func TestDataDirLockOfAGoneHolderIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.lock")
	held, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	// The file names a process that is gone.
	if err := os.WriteFile(path, []byte("2147483646\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(200 * time.Millisecond)
		held.Close()
		close(released)
	}()
	f, err := agent.LockDataDir(dir)
	if err != nil {
		t.Fatalf("LockDataDir after the gone holder's lock was released: %v", err)
	}
	select {
	case <-released:
	default:
		t.Fatal("LockDataDir took the dir while it was still locked")
	}
	f.Close()

	// A live holder: this process, through another open file.
	other, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	if _, err := agent.LockDataDir(dir); err == nil || !strings.Contains(err.Error(), "open in pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("LockDataDir with a live holder: %v", err)
	}
}
