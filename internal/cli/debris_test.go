package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// The teardown that the refusal of another sled's live zone names clears
// it: a sled whose agent is gone and whose data dir was removed left a zone
// running; a new sled's runtime refuses that zone's id, naming the command;
// run as named, the command exits 0, and the new sled then starts the zone.
func TestTeardownNamedByTheRefusalClearsTheZone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes zones with the linux runtime")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	b := make([]byte, 3)
	rand.Read(b)
	tag := "zt" + hex.EncodeToString(b)
	prefix := tag + "-"
	runDir, dirA, dirB := t.TempDir(), t.TempDir(), t.TempDir()
	sledA, sledB := uuid.NewString(), uuid.NewString()
	z := sledconfigtest.Crucible(0x75)
	z.ZoneType.Address = "[fd00:1122:3344:1f3::75]:32345"
	spec := zone.SpecFor(&z)
	newRuntime := func(dir, sled string) *linux.Runtime {
		t.Helper()
		rt, err := linux.New(linux.Options{DataDir: dir, RunDir: runDir, Tag: tag, Sled: sled, NetnsPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, s := range []struct{ dir, sled string }{{dirA, sledA}, {t.TempDir(), sledB}} {
			rt, err := linux.New(linux.Options{DataDir: s.dir, RunDir: runDir, Tag: tag, Sled: s.sled, NetnsPrefix: prefix})
			if err != nil {
				t.Errorf("cleanup: %v", err)
				continue
			}
			rt.Destroy(ctx, spec.Name)
			rt.RemoveEmptyDirs()
		}
		if nss, links, _ := zonenet.List(prefix, tag); len(nss)+len(links) > 0 {
			t.Errorf("left behind: namespaces %v, links %v", nss, links)
		}
		if err := agent.RemoveHostLock(tag); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Sled B's zone runs; its agent is gone, its data dir removed.
	if err := newRuntime(dirB, sledB).Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dirB); err != nil {
		t.Fatal(err)
	}
	// Sled A is refused the zone's id, and told what clears it.
	rtA := newRuntime(dirA, sledA)
	err := rtA.Ensure(ctx, spec)
	var ose *linux.OtherSledError
	if !errors.As(err, &ose) {
		t.Fatalf("Ensure of the other sled's live zone: %v; want an OtherSledError", err)
	}
	t.Logf("refused: %v", err)
	cmdline := ose.Teardown
	if dir, rest, ok := strings.Cut(cmdline, " && "); ok {
		mk, ok := strings.CutPrefix(dir, "mkdir -p ")
		if !ok {
			t.Fatalf("the command %q: want mkdir -p <dir> && sled-agent teardown …", cmdline)
		}
		if err := os.MkdirAll(mk, 0o755); err != nil {
			t.Fatal(err)
		}
		cmdline = rest
	}
	args := strings.Fields(cmdline)
	end := -1
	for i, a := range args {
		if a == "--yes" {
			end = i
			break
		}
	}
	if len(args) < 3 || args[0] != "sled-agent" || args[1] != "teardown" || end < 0 {
		t.Fatalf("the command %q: want sled-agent teardown … --yes", ose.Teardown)
	}
	td, out := startBinary(t, args[1:end+1]...)
	if err := td.Wait(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args[:end+1], " "), err, out)
	}
	t.Logf("teardown:\n%s", out)
	if zonenet.NetnsExists(prefix + spec.Name) {
		t.Errorf("the teardown left the zone's namespace")
	}
	if err := rtA.Ensure(ctx, spec); err != nil {
		t.Fatalf("Ensure after the teardown: %v", err)
	}
}
