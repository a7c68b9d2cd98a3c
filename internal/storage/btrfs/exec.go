package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/procgroup"
)

// ErrHung: an earlier call on the same disk or pool has not returned
// (a syscall stuck on a dead device); no new call is started behind it.
var ErrHung = errors.New("an earlier call has not returned")

// commandWaitDelay is how long a command's output may stay open once its
// process group has been killed (a child that left the group), and how
// long a killed command is waited for before the caller is let go.
const commandWaitDelay = 200 * time.Millisecond

// runFunc runs argv and returns its combined output. Tests replace it.
type runFunc func(ctx context.Context, argv ...string) ([]byte, error)

// toolDirs are where commands are looked for, whatever the agent's PATH.
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// lookTool finds a command by name in toolDirs.
func lookTool(name string) (string, error) {
	for _, d := range toolDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s", name, strings.Join(toolDirs, ":"))
}

// runCommand runs argv (argv[0] a name looked up in toolDirs; the other
// arguments are passed as they are, no shell) in its own process group
// (internal/procgroup): at ctx's deadline the whole group is killed, and
// the caller returns at most 2×commandWaitDelay later even if a member
// cannot die (a process stuck in the kernel on a dead disk), in which case
// a goroutine is left waiting for it. Whatever the command left in its
// group is killed when it exits. Stdout and stderr come back together.
func runCommand(ctx context.Context, argv ...string) ([]byte, error) {
	path, err := lookTool(argv[0])
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, argv[1:]...)
	// BLKID_FILE=/dev/null: no blkid cache. mkfs.btrfs checks that a
	// filesystem UUID is unique against libblkid's cache, whose entries
	// outlive what they describe (a loop device detached and attached
	// again, a pool whose making was cut short); without it, every device
	// is probed as it is now. libblkid writes a non-regular cache file in
	// place, so /dev/null stays /dev/null.
	cmd.Env = []string{"PATH=" + strings.Join(toolDirs, ":"), "LC_ALL=C", "BLKID_FILE=/dev/null"}
	cmd.Dir = "/"
	res, err := procgroup.Run(ctx, cmd, procgroup.Options{WaitDelay: commandWaitDelay, Combined: true})
	var ee *exec.ExitError
	switch {
	case err == nil:
		return res.Stdout, nil
	case errors.As(err, &ee):
		return res.Stdout, &CommandError{Argv: argv, Err: err, Output: procgroup.Snippet(res.Stdout, 512)}
	default: // not started, killed at the deadline, stuck
		return res.Stdout, fmt.Errorf("%s: %w", argv[0], err)
	}
}

// CommandError is a command that ran and failed.
type CommandError struct {
	Argv   []string
	Err    error
	Output string
}

func (e *CommandError) Error() string {
	if e.Output == "" {
		return fmt.Sprintf("%s: %v", strings.Join(e.Argv, " "), e.Err)
	}
	return fmt.Sprintf("%s: %v: %q", strings.Join(e.Argv, " "), e.Err, e.Output)
}

func (e *CommandError) Unwrap() error { return e.Err }

// ExitCode is the command's exit status, -1 if it did not exit.
func (e *CommandError) ExitCode() int {
	var ee *exec.ExitError
	if errors.As(e.Err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// call runs fn, a syscall that can block on a dead disk or a hung mount,
// in a goroutine and returns its result, or ctx's error at its deadline.
// A call abandoned at its deadline keeps its goroutine (a syscall cannot
// be interrupted) until the kernel returns; while it lingers, further
// calls on the same key (a disk's device, a pool's id) fail at once with
// ErrHung rather than pile up behind it.
func call[T any](ctx context.Context, b *Backend, key string, fn func() (T, error)) (T, error) {
	var zero T
	b.mu.Lock()
	if b.lingering[key] > 0 {
		b.mu.Unlock()
		return zero, fmt.Errorf("%s: %w", key, ErrHung)
	}
	b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	abandoned := false // guarded by b.mu, as is the send on done
	go func() {
		v, err := fn()
		b.mu.Lock()
		defer b.mu.Unlock()
		done <- result{v, err}
		if abandoned {
			if b.lingering[key]--; b.lingering[key] <= 0 {
				delete(b.lingering, key)
			}
		}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case r := <-done: // it returned just now
			b.mu.Unlock()
			return r.v, r.err
		default:
		}
		abandoned = true
		b.lingering[key]++
		b.mu.Unlock()
		return zero, fmt.Errorf("%s: gave up at the deadline: %w", key, ctx.Err())
	}
}
