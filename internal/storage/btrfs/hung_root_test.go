package btrfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A btrfs command that hangs (here a real process group that never exits,
// standing in for `btrfs subvolume list` on a dead disk) is killed with
// its whole group at the deadline, and a call on another pool meanwhile is
// not held up by it.
func TestHungCommandKilledAtDeadline(t *testing.T) {
	needTools(t, "sh", "sleep")
	r := newRig(t, "a", "b")
	ctx := testCtx(t)
	hungPool, _ := r.pool(ctx, "a")
	okPool, _ := r.pool(ctx, "b")
	pidfile := filepath.Join(r.dir, "hung.pid")
	next := r.rec.next
	r.rec.next = func(ctx context.Context, argv ...string) ([]byte, error) {
		if strings.Join(argv, " ") == "btrfs subvolume list "+r.b.mountpoint(hungPool) {
			return runCommand(ctx, "sh", "-c", `sleep 3600 & echo $! > "$0"; wait`, pidfile)
		}
		return next(ctx, argv...)
	}

	hctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hung := make(chan error, 1)
	go func() {
		_, err := r.b.Datasets(hctx, hungPool)
		hung <- err
	}()
	// Wait for the hung command to be running.
	for end := time.Now().Add(30 * time.Second); !exists(pidfile); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the hung command never started")
		}
	}
	if _, err := r.b.EnsureDataset(ctx, dataset(okPool, "debug")); err != nil {
		t.Fatalf("another pool's dataset: %v", err)
	}
	if _, err := r.b.Datasets(ctx, okPool); err != nil {
		t.Fatalf("another pool's datasets: %v", err)
	}
	select {
	case err := <-hung:
		t.Fatalf("the hung call returned before its deadline: %v", err)
	default:
	}
	cancel() // its deadline
	if err := <-hung; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "killed at its deadline") {
		t.Fatalf("hung Datasets = %v, want it killed at its deadline", err)
	}
	b, _ := os.ReadFile(pidfile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	gone(t, pid)
}
