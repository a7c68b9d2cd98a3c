package procgroup_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/procgroup"
)

// A command that outlives its deadline is killed with everything it started
// in its group, and Run says so; a command's output and failure come back.
func TestRunKillsTheGroupAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	// The shell starts a child in its group, prints its pid, and waits.
	res, err := procgroup.Run(ctx, exec.Command("/bin/sh", "-c", "sleep 60 & echo $!; wait"), procgroup.Options{})
	if !errors.Is(err, procgroup.ErrKilled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want killed at the deadline", err)
	}
	child, perr := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if perr != nil {
		t.Fatalf("output %q", res.Stdout)
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(child, 0) == nil {
		// A zombie until its parent (the killed shell's reaper) collects it.
		if b, _ := exec.Command("ps", "-o", "stat=", "-p", strconv.Itoa(child)).Output(); strings.HasPrefix(strings.TrimSpace(string(b)), "Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command's child %d outlived its group's kill", child)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunReportsOutputAndFailure(t *testing.T) {
	res, err := procgroup.Run(t.Context(), exec.Command("/bin/sh", "-c", "echo out; echo err >&2; exit 3"), procgroup.Options{})
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	res, err = procgroup.Run(t.Context(), exec.Command("/bin/sh", "-c", "echo out; echo err >&2"), procgroup.Options{Combined: true})
	if err != nil || string(res.Stdout) != "out\nerr\n" || len(res.Stderr) != 0 {
		t.Fatalf("combined: %+v, %v", res, err)
	}
	if _, err := procgroup.Run(t.Context(), exec.Command("/nonexistent"), procgroup.Options{}); !errors.Is(err, procgroup.ErrStart) {
		t.Fatalf("a command that cannot start: %v", err)
	}
}
