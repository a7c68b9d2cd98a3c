package btrfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// gone waits (at most 10 s: a liveness bound, not a speed check) for pid
// to be gone.
func gone(t *testing.T, pid int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		// A killed child of ours not yet reaped by init is a zombie.
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(st), ") Z ") {
			return
		}
	}
	t.Fatalf("process %d still running", pid)
}

func TestCommandKilledWithItsGroupAtDeadline(t *testing.T) {
	needTools(t, "sh", "sleep")
	pidfile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// The command leaves a grandchild in its group, and waits forever.
	_, err := runCommand(ctx, "sh", "-c", `sleep 3600 & echo $! > "$0"; wait`, pidfile)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
	b, rerr := os.ReadFile(pidfile)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if rerr != nil || perr != nil {
		t.Fatalf("grandchild's pid: %v %v", rerr, perr)
	}
	gone(t, pid)
}

func TestCommandFailureSaysWhy(t *testing.T) {
	needTools(t, "sh")
	_, err := runCommand(context.Background(), "sh", "-c", "echo no such pool >&2; exit 3")
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode() != 3 || !strings.Contains(err.Error(), "no such pool") {
		t.Fatalf("err = %v", err)
	}
	if _, err := runCommand(context.Background(), "no-such-tool-anywhere"); err == nil {
		t.Fatal("a missing tool ran")
	}
}

// A syscall that blocks (here: reading a FIFO nobody writes, as a read of a
// dead disk would) is given up at the deadline; while it lingers, another
// call on the same disk fails at once; once it returns, calls work again.
func TestHungSyscallGivenUpAtDeadline(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "dead-disk")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{PoolRoot: "/nonexistent", ProbeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := b.probe(ctx, fifo); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("probe = %v, want the deadline", err)
	}
	if _, err := b.probe(context.Background(), fifo); !errors.Is(err, ErrHung) {
		t.Fatalf("probe while the first lingers = %v, want ErrHung", err)
	}
	other := filepath.Join(t.TempDir(), "other")
	os.WriteFile(other, nil, 0o600)
	if _, err := readHeadOn(b, other); err != nil {
		t.Fatalf("another disk is delayed: %v", err)
	}
	// The disk answers: the lingering read returns.
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	for end := time.Now().Add(10 * time.Second); lingering(b) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the lingering call never cleared")
		}
	}
	// A FIFO with a writer reads as an empty, blank disk.
	go func() {
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
	}()
	if _, err := readHeadOn(b, fifo); err != nil {
		t.Fatalf("after it returned: %v", err)
	}
}

func lingering(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.lingering)
}

func readHeadOn(b *Backend, path string) ([]byte, error) {
	return call(context.Background(), b, path, func() ([]byte, error) { return readHead(path) })
}
