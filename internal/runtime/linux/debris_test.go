package linux_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/syncbuf"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// lockFile is the file in a data dir whose flock the agent using it holds.
const lockFile = "agent.lock"

// newEnvLogged is newEnv whose runtime logs into the returned buffer.
func newEnvLogged(t *testing.T) (*env, *syncbuf.Buffer) {
	t.Helper()
	log := &syncbuf.Buffer{}
	e := newEnvWith(t, nil, func(o *linux.Options) { o.Log = slog.New(slog.NewTextHandler(log, nil)) })
	return e, log
}

// holdLock takes an flock on path, as a running agent holds its data dir's
// agent.lock, and returns what releases it (also at cleanup).
func holdLock(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	f.WriteString("4242\n")
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}

// killZone kills everything a zone runs and removes its namespace and
// links, as the death of a host's agent and zones (and someone deleting
// their namespaces) leaves it: its service directory, with its claim, and
// its empty cgroup stay.
func killZone(t *testing.T, ctx context.Context, e *env, s zone.Spec) {
	t.Helper()
	p := partsOf(t, e, s)
	cg := ""
	if p.runsv != 0 {
		cg = cgroupOf(t, p.runsv)
	}
	if cg != "" {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	} else {
		for _, pid := range []int{p.runsv, p.svc} {
			if pid != 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for deadline := time.Now().Add(eventTimeout); ; {
		if q := partsOf(t, e, s); q.runsv == 0 && q.svc == 0 && (p.runsv == 0 || !running(p.runsv)) && (p.svc == 0 || !running(p.svc)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %s's processes do not die: %+v", s.Name, partsOf(t, e, s))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := zonenet.Remove(ctx, e.prefix+s.Name, e.tag, s.ID); err != nil {
		t.Fatal(err)
	}
	if q := partsOf(t, e, s); q != (zoneParts{}) {
		t.Fatalf("zone %s is not dead: %+v", s.Name, q)
	}
	if _, err := os.Stat(filepath.Join(serviceDir(t, e, s), linux.ClaimFile)); err != nil {
		t.Fatalf("the dead zone's claim: %v", err)
	}
}

// claimOf returns the sled that the zone's claim names.
func claimOf(t *testing.T, e *env, s zone.Spec) string {
	t.Helper()
	var c struct {
		Sled string `json:"sled_id"`
	}
	raw, err := os.ReadFile(filepath.Join(serviceDir(t, e, s), linux.ClaimFile))
	if err == nil {
		err = json.Unmarshal(raw, &c)
	}
	if err != nil {
		t.Fatalf("claim of %s: %v", s.Name, err)
	}
	return c.Sled
}

// A sled's agent killed, its zones dead, and its lock free or its data dir
// gone: the claims it left are debris, and another sled's runtime starts
// zones with those ids, saying what it removed. Each way the dead sled can
// be told dead is tried: its lock free, its data dir removed, a claim of the
// previous version (no lock in it) whose data dir is gone, and a sled that
// used this sled's own data dir before it.
func TestDeadSledsDebrisDoesNotBlockItsZones(t *testing.T) {
	a, log := newEnvLogged(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	// a's agent runs: it holds its data dir's lock.
	holdLock(t, filepath.Join(a.dir, lockFile))

	// The dead sled b: its agent held its lock while its zones were made,
	// then it and its zones were killed.
	b := a.sibling(t)
	freed, removedDir := spec(0x81), spec(0x82)
	t.Cleanup(func() {
		for _, s := range []zone.Spec{freed, removedDir} {
			b.rt.Destroy(context.Background(), s.Name) // if the test stops early
		}
	})
	releaseB := holdLock(t, filepath.Join(b.dir, lockFile))
	b.ensure(freed)
	b.ensure(removedDir)
	killZone(t, ctx, b, freed)
	killZone(t, ctx, b, removedDir)
	releaseB()

	// Its lock free: the first zone is a's to start.
	svc := serviceDir(t, a, freed)
	a.ensure(freed)
	if got := claimOf(t, a, freed); got != a.sled {
		t.Errorf("%s is claimed by %s, want %s", freed.Name, got, a.sled)
	}
	if p := partsOf(t, a, freed); !p.netns || !p.link || p.runsv == 0 || p.svc == 0 {
		t.Errorf("zone %s is not whole: %+v", freed.Name, p)
	}
	healthy(t, freed)
	if l := log.String(); !strings.Contains(l, "removed the debris of a dead sled's zone") || !strings.Contains(l, "zone="+freed.Name) ||
		!strings.Contains(l, "service dir "+svc) || !strings.Contains(l, "sled="+b.sled) {
		t.Errorf("the log does not say what was removed:\n%s", l)
	}

	// Its data dir removed (the claim's lock with it): a sweep clears
	// the second zone's debris, and a starts it.
	if err := os.RemoveAll(b.dir); err != nil {
		t.Fatal(err)
	}
	lines, err := a.rt.Sweep(ctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if want := "service dir " + serviceDir(t, a, removedDir) + " (debris of sled " + b.sled + ")"; !contains(lines, want) {
		t.Errorf("Sweep removed %q, want %q among them", lines, want)
	}
	if _, err := os.Stat(serviceDir(t, a, removedDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sweep left %s: %v", serviceDir(t, a, removedDir), err)
	}
	a.ensure(removedDir)
	healthy(t, removedDir)

	// A claim of the previous version (no lock), of a sled whose data dir
	// is gone; and a claim of a sled that used a's data dir before a (its
	// data dir removed and made again): nothing else of either zone.
	old, before := spec(0x83), spec(0x84)
	writeFile(t, filepath.Join(serviceDir(t, a, old), linux.ClaimFile),
		`{"sled_id": "`+uuid.NewString()+`", "data_dir": "`+filepath.Join(a.dir, "gone")+`"}`)
	writeFile(t, filepath.Join(serviceDir(t, a, before), linux.ClaimFile),
		`{"sled_id": "`+uuid.NewString()+`", "data_dir": "`+a.dir+`", "lock": "`+filepath.Join(a.dir, lockFile)+`"}`)
	for _, s := range []zone.Spec{old, before} {
		a.ensure(s)
		if got := claimOf(t, a, s); got != a.sled {
			t.Errorf("%s is claimed by %s, want %s", s.Name, got, a.sled)
		}
		healthy(t, s)
	}
}

// Another sled's parts that are not debris are still refused, and the
// error names the teardown that clears them: while its agent runs (its lock
// held), even with nothing of the zone alive; and while parts of the zone
// live, even with its agent gone. Nothing of theirs is touched.
func TestLiveSledsZoneIsRefusedNamingTheTeardown(t *testing.T) {
	a := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	b := a.sibling(t)
	live, dead := spec(0x85), spec(0x86)
	t.Cleanup(func() {
		for _, s := range []zone.Spec{live, dead} {
			b.rt.Destroy(context.Background(), s.Name)
		}
	})
	releaseB := holdLock(t, filepath.Join(b.dir, lockFile))
	b.ensure(live)
	b.ensure(dead)
	killZone(t, ctx, b, dead)
	liveParts := partsOf(t, b, live)
	teardown := "sled-agent teardown --runtime linux --data-dir " + b.dir + " --sled-id " + b.sled +
		" --run-dir " + a.run + " --zone-tag " + a.tag + " --netns-prefix " + a.prefix + " --yes"

	refused := func(s zone.Spec, why string) {
		t.Helper()
		err := a.rt.Ensure(ctx, s)
		if !errors.Is(err, linux.ErrOtherSled) {
			t.Fatalf("Ensure of %s, another sled's: %v; want ErrOtherSled", s.Name, err)
		}
		if msg := err.Error(); !strings.Contains(msg, teardown) || !strings.Contains(msg, why) || !strings.Contains(msg, b.sled) {
			t.Errorf("Ensure of %s: %q\nwant it to say %q and name the teardown %q", s.Name, msg, why, teardown)
		}
		if got := claimOf(t, b, s); got != b.sled {
			t.Errorf("%s is claimed by %s, want %s", s.Name, got, b.sled)
		}
	}
	// b's agent runs.
	refused(dead, "its agent runs")
	refused(live, "its agent runs")
	if lines := sweep(t, ctx, a); len(lines) != 0 {
		t.Errorf("a's sweep removed %q of a live sled", lines)
	}
	if _, err := os.Stat(serviceDir(t, b, dead)); err != nil {
		t.Errorf("the dead zone of a live sled: %v", err)
	}
	// b's agent gone, its running zone still running.
	releaseB()
	refused(live, "parts of the zone live: namespace "+a.prefix+live.Name)
	if lines := sweep(t, ctx, a); contains(lines, "service dir "+serviceDir(t, b, live)+" (debris of sled "+b.sled+")") {
		t.Errorf("a's sweep removed a running zone's service dir: %q", lines)
	}
	if now := partsOf(t, b, live); now != liveParts {
		t.Errorf("zone %s was %+v, is %+v", live.Name, liveParts, now)
	}
	healthy(t, live)
}

func sweep(t *testing.T, ctx context.Context, e *env) []string {
	t.Helper()
	lines, err := e.rt.Sweep(ctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return lines
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}
