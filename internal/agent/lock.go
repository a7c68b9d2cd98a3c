package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockFile, in the data dir, is held (flock) by the agent using the dir.
const lockFile = "agent.lock"

// LockDataDir takes the data dir for this process: an agent, or an operator
// command that must not run beside one (teardown). The lock is released by
// closing the file, or by the process ending however it ends. A dir held by
// another process is an error naming that process.
func LockDataDir(dataDir string) (*os.File, error) {
	path := filepath.Join(dataDir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another sled agent (pid %s): one agent per data dir", dataDir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("locking data dir %s: %w", dataDir, err)
	}
	// Who holds it, for the message above; the lock itself is the flock.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
