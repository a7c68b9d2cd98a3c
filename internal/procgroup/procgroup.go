// Package procgroup runs an external command in a process group of its own,
// under a deadline: at the deadline the whole group is killed, the caller
// gets control back within a bound even if a member cannot die (a process
// stuck in the kernel on a dead disk), and whatever the command leaves in
// its group is killed once it exits. The storage backend, the Linux
// runtime's readiness commands and chronyc all run their commands so.
package procgroup

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

var (
	// ErrStart wraps a command that could not be started.
	ErrStart = errors.New("could not start")
	// ErrKilled wraps ctx's error for a command killed at its deadline.
	ErrKilled = errors.New("killed at its deadline")
	// ErrStuck wraps ctx's error for a command killed at its deadline
	// that had not exited WaitDelay later.
	ErrStuck = errors.New("killed at its deadline, still not exited")
)

// Options set Run up. Zero values take the defaults.
type Options struct {
	// Start starts the command (default (*exec.Cmd).Start): the Linux
	// runtime starts readiness commands from a thread in a zone's
	// network namespace.
	Start func(*exec.Cmd) error
	// WaitDelay bounds how long output may stay open once the command is
	// gone, and, doubled, how long Run waits for a killed command to be
	// reaped (100ms).
	WaitDelay time.Duration
	// Combined captures stderr with stdout, in the order written.
	Combined bool
}

// Result is what the command wrote (the first OutputLimit bytes of each
// stream; Stderr is empty when Combined), and its process id.
type Result struct {
	Stdout, Stderr []byte
	Pid            int
}

// OutputLimit is how much of each stream Run keeps.
const OutputLimit = 64 << 10

// Run runs cmd, which the caller has set up (path, arguments, environment,
// directory), in a process group of its own until it exits or ctx ends.
// Its error wraps ErrStart, ErrKilled or ErrStuck, or is the command's own
// (an *exec.ExitError for a command that failed). A stuck command's output
// is not returned: it may still be written.
func Run(ctx context.Context, cmd *exec.Cmd, opts Options) (Result, error) {
	wait := cmp.Or(opts.WaitDelay, 100*time.Millisecond)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.WaitDelay = wait
	var stdout, stderr limitedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if opts.Combined {
		cmd.Stderr = &stdout
	}
	start := opts.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrStart, err)
	}
	pid := cmd.Process.Pid // the group's id
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		syscall.Kill(-pid, syscall.SIGKILL)
		select {
		case err = <-done:
		case <-time.After(2 * wait):
			return Result{Pid: pid}, fmt.Errorf("%w: %w", ErrStuck, ctx.Err())
		}
	}
	// Whatever the command left running in its group goes with it (the
	// group's id is not reused while any member is left).
	syscall.Kill(-pid, syscall.SIGKILL)
	res := Result{Stdout: stdout.b.Bytes(), Stderr: stderr.b.Bytes(), Pid: pid}
	if ctx.Err() != nil {
		return res, fmt.Errorf("%w: %w", ErrKilled, ctx.Err())
	}
	return res, err
}

// Snippet is output for an error message: trimmed, at most n bytes.
func Snippet(output []byte, n int) string {
	s := strings.TrimSpace(string(output))
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// limitedBuffer keeps the first OutputLimit bytes written to it.
type limitedBuffer struct{ b bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := OutputLimit - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
