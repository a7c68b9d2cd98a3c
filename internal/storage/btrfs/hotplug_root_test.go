package btrfs

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// The storage reconciler over this backend follows the vdev dir: with its
// period and its retries at 10 minutes, a synthetic disk put in is managed,
// and one deleted is reported not found, as soon as the file is there or
// gone.
func TestReconcilerFollowsTheVdevDir(t *testing.T) {
	r := newRig(t, "a")
	// Neither the period nor a retry comes within the test.
	rec := storage.New(r.b, storage.Options{Period: 10 * time.Minute, Backoff: storage.Backoff{Initial: 10 * time.Minute, Max: 10 * time.Minute}})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	a := storage.DiskConfig{ID: "disk-a", Identity: r.id("a"), PoolID: uuid.NewString()}
	b := storage.DiskConfig{ID: "disk-b", Identity: r.id("b"), PoolID: uuid.NewString()}
	rec.Update([]storage.DiskConfig{a, b}, nil)
	waitDisk(t, rec, a.ID, "disk a managed", "")
	waitDisk(t, rec, b.ID, "disk b not found", "disk not found")

	t0 := time.Now()
	r.addVdev("b")
	waitDisk(t, rec, b.ID, "disk b put in managed", "")
	t.Logf("disk b put in: managed after %s", time.Since(t0).Round(time.Millisecond))

	t0 = time.Now()
	if err := os.Remove(r.vdev("a")); err != nil {
		t.Fatal(err)
	}
	waitDisk(t, rec, a.ID, "disk a deleted not found", "disk not found")
	t.Logf("disk a deleted: not found after %s", time.Since(t0).Round(time.Millisecond))
}

// waitDisk waits (a minute at most: mkfs and mount on a loaded machine)
// for a disk's result: ok (msg "") or an error containing msg.
func waitDisk(t *testing.T, rec *storage.Reconciler, id, what, msg string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var got storage.Result
		for _, d := range rec.Status().Disks {
			if d.ID == id {
				got = d.Result
			}
		}
		if msg == "" && got.OK || msg != "" && !got.OK && strings.Contains(got.Message, msg) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %+v", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
