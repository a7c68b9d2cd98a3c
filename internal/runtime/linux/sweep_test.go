package linux_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/zone"
)

func TestSweepRemovesOrphansAndLeavesZonesAlone(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	whole, dead, garbage, empty := spec(0x41), spec(0x42), spec(0x43), spec(0x44)
	half, stray, linksOnly, cgOnly := spec(0x45), spec(0x46), spec(0x47), spec(0x48)
	// linksOnly's namespace does not have our prefix, so it is not ours and
	// the sweep leaves it: the test removes it (registered before it exists).
	otherNS := e.tag + "_other"
	t.Cleanup(func() { zonenet.Remove(context.Background(), otherNS, e.tag, linksOnly.ID) })

	e.ensure(whole)
	e.ensure(dead)
	wholeSt := status(t, serviceDir(t, e, whole))
	wholeRunsv := runsvOf(t, serviceDir(t, e, whole))
	deadSt := status(t, serviceDir(t, e, dead))
	deadRunsv := runsvOf(t, serviceDir(t, e, dead))
	// Where there is a cgroup v2 file system, the runtime's cgroups are
	// where the whole zone's is.
	var cgRoot string
	if cg := cgroupOf(t, wholeRunsv); cg != "" {
		cgRoot = filepath.Dir(cg)
	}

	// (a) A zone whose root is gone: namespace, link, supervisor, service
	// and cgroup left.
	if err := os.RemoveAll(rootOf(e, dead)); err != nil {
		t.Fatal(err)
	}
	// (b) Roots whose mark is garbage, or was never renamed into place.
	garbageRoot, emptyRoot := rootOf(e, garbage), rootOf(e, empty)
	writeFile(t, filepath.Join(garbageRoot, "zone.json"), `{"tag": "`+e.tag+`", "id": "`)
	writeFile(t, filepath.Join(emptyRoot, ".zone.json.tmp123456"), `{"tag": "`+e.tag+`"}`)
	// (c) A zone half made: its claim, namespace and link.
	claim(t, e, e.sled, half)
	ensureNet(t, ctx, e.prefix+half.Name, e.tag, half)
	// (d) A process with the mark of a service dir that holds only the
	// claim.
	strayDir := filepath.Join(e.run, e.tag, stray.Name)
	claim(t, e, e.sled, stray)
	straySleep := startSleep(t, supervise.MarkerEnv+"="+strayDir)
	// (e) Links whose namespace is not ours, of a zone claimed by us.
	claim(t, e, e.sled, linksOnly)
	ensureNet(t, ctx, otherNS, e.tag, linksOnly)

	underlay := func(s zone.Spec) string { u, _ := zonenet.LinkNames(e.tag, s.ID); return u }
	want := []string{
		"namespace " + e.prefix + dead.Name,
		"link " + underlay(dead) + " of zone " + dead.ID,
		"service dir " + serviceDir(t, e, dead),
		fmt.Sprintf("process %d (sled-agent) of service dir %s", deadSt.PID, serviceDir(t, e, dead)),
		"zone root " + garbageRoot + " without a valid mark",
		"zone root " + emptyRoot + " without a valid mark",
		"namespace " + e.prefix + half.Name,
		"link " + underlay(half) + " of zone " + half.ID,
		"service dir " + filepath.Join(e.run, e.tag, half.Name),
		fmt.Sprintf("process %d (sleep) of service dir %s", straySleep, strayDir),
		"service dir " + strayDir,
		"link " + underlay(linksOnly) + " of zone " + linksOnly.ID,
		"service dir " + filepath.Join(e.run, e.tag, linksOnly.Name),
	}
	// (f) A zone's cgroup, with an unmarked process in it.
	cgSleep := 0
	if cgRoot != "" {
		want = append(want, "cgroup "+filepath.Join(cgRoot, dead.Name))
		cgDir := filepath.Join(cgRoot, cgOnly.Name)
		claim(t, e, e.sled, cgOnly)
		if err := os.Mkdir(cgDir, 0o755); err != nil {
			t.Fatal(err)
		}
		cgSleep = startSleep(t)
		writeFile(t, filepath.Join(cgDir, "cgroup.procs"), strconv.Itoa(cgSleep))
		want = append(want, "cgroup "+cgDir, "service dir "+filepath.Join(e.run, e.tag, cgOnly.Name))
	} else {
		t.Log("no cgroup v2 file system: no cgroups to sweep")
	}

	lines, err := e.rt.Sweep(ctx)
	if err != nil {
		t.Fatalf("Sweep: %v (removed %q)", err, lines)
	}
	t.Logf("swept:\n\t%s", strings.Join(lines, "\n\t"))
	slices.Sort(lines)
	slices.Sort(want)
	if !slices.Equal(lines, want) {
		t.Errorf("Sweep removed\n\t%s\nwant\n\t%s", strings.Join(lines, "\n\t"), strings.Join(want, "\n\t"))
	}

	// The whole zone is untouched: the same service answers.
	if now := status(t, serviceDir(t, e, whole)); !now.Up || now.PID != wholeSt.PID {
		t.Errorf("whole zone's service was %+v, is %+v", wholeSt, now)
	}
	healthy(t, whole)
	if o, ok := e.observed(whole.Name); !ok || !o.Running {
		t.Errorf("List for the whole zone: %+v (found %v)", o, ok)
	}
	// Nothing else with our marks is left.
	owned, err := e.rt.Owned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(owned.Zones) != 1 || !slices.Equal(owned.Namespaces, []string{e.prefix + whole.Name}) ||
		len(owned.Links) != 1 || owned.Links[0].ZoneID != whole.ID ||
		len(owned.Processes) != 1 || owned.Processes[0].PID != wholeSt.PID {
		t.Errorf("owned after Sweep: %+v", owned)
	}
	for _, pid := range []int{deadSt.PID, deadRunsv, straySleep, cgSleep} {
		if pid != 0 && running(pid) {
			t.Errorf("process %d still runs", pid)
		}
	}
	services, _ := filepath.Glob(filepath.Join(e.run, e.tag, "*"))
	if !slices.Equal(services, []string{serviceDir(t, e, whole)}) {
		t.Errorf("service dirs left: %v", services)
	}
	roots, _ := filepath.Glob(filepath.Join(e.dir, "pools", "*", "zones", "*"))
	if !slices.Equal(roots, []string{rootOf(e, whole)}) {
		t.Errorf("zone roots left: %v", roots)
	}
	if !zonenet.NetnsExists(otherNS) {
		t.Errorf("namespace %s, not ours, was removed", otherNS)
	}

	// A second sweep finds nothing.
	if lines, err := e.rt.Sweep(ctx); len(lines) != 0 || err != nil {
		t.Errorf("second Sweep: %q, %v", lines, err)
	}
}

func TestSweepWithNothingToDo(t *testing.T) {
	e := newEnv(t, nil)
	lines, err := e.rt.Sweep(context.Background())
	if len(lines) != 0 || err != nil {
		t.Fatalf("Sweep: %q, %v", lines, err)
	}
}

func TestSweepLeavesRootsNotMarkedAsOursAlone(t *testing.T) {
	e := newEnv(t, nil)
	other, untagged, mine, otherSled := spec(0x51), spec(0x52), spec(0x53), spec(0x54)
	marks := map[string]string{
		// Another agent's zone.
		rootOf(e, other): `{"tag": "someone-else", "id": "` + other.ID + `", "name": "` + other.Name + `"}`,
		// Another sled's zone, with our tag.
		rootOf(e, otherSled): `{"tag": "` + e.tag + `", "sled_id": "` + uuid.NewString() + `", "id": "` + otherSled.ID + `", "name": "` + otherSled.Name + `"}`,
		// A mark that parses but names no agent.
		rootOf(e, untagged): `{}`,
		// Ours, with nothing but the root: a zone (List shows it), not
		// litter; the reconciler decides what becomes of it.
		rootOf(e, mine): `{"tag": "` + e.tag + `", "id": "` + mine.ID + `", "name": "` + mine.Name + `"}`,
	}
	for root, mark := range marks {
		writeFile(t, filepath.Join(root, "zone.json"), mark)
	}
	lines, err := e.rt.Sweep(context.Background())
	if len(lines) != 0 || err != nil {
		t.Fatalf("Sweep: %q, %v", lines, err)
	}
	for root, mark := range marks {
		if b, err := os.ReadFile(filepath.Join(root, "zone.json")); err != nil || string(b) != mark {
			t.Errorf("%s: %q, %v", root, b, err)
		}
	}
	if o, ok := e.observed(otherSled.Name); ok {
		t.Errorf("List shows another sled's zone: %+v", o)
	}
	if _, ok := e.observed(mine.Name); !ok {
		t.Error("List does not show our zone")
	}
}

func status(t *testing.T, svc string) supervise.State {
	t.Helper()
	st, err := supervise.Status(svc)
	if err != nil || !st.Up || st.PID == 0 {
		t.Fatalf("status of %s: %+v, %v", svc, st, err)
	}
	return st
}

func runsvOf(t *testing.T, svc string) int {
	t.Helper()
	p, found, err := supervise.Find(svc)
	if err != nil || !found {
		t.Fatalf("runsv of %s not found: %v", svc, err)
	}
	defer p.Close()
	return p.PID
}

// rootOf is where the runtime keeps the zone's root.
func rootOf(e *env, s zone.Spec) string {
	return filepath.Join(e.dir, "pools", *s.Config.FilesystemPool, "zones", s.Name)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// claim writes the zone's claim for sled into its service dir, as Ensure
// does before it makes anything else of the zone.
func claim(t *testing.T, e *env, sled string, s zone.Spec) {
	t.Helper()
	writeFile(t, filepath.Join(e.run, e.tag, s.Name, linux.ClaimFile), `{"sled_id": "`+sled+`", "data_dir": "`+e.dir+`"}`)
}

// ensureNet makes the zone's namespace and links, as Ensure would, and
// nothing else.
func ensureNet(t *testing.T, ctx context.Context, netns, tag string, s zone.Spec) {
	t.Helper()
	addr, _ := s.Config.ServiceAddr()
	if err := zonenet.Ensure(ctx, zonenet.Config{Netns: netns, Tag: tag, ZoneID: s.ID, Underlay: addr.Addr()}); err != nil {
		t.Fatal(err)
	}
}

// startSleep starts a long sleep with the environment env, killed and
// reaped when the test ends, and returns its PID.
func startSleep(t *testing.T, env ...string) int {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return cmd.Process.Pid
}

// cgroupOf returns the cgroup v2 directory of process pid, or "" if there
// is no cgroup v2 file system.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var path string
	for l := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(l), "0::"); ok {
			path = p
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, _ := strings.Cut(sc.Text(), " - ")
		if fs := strings.Fields(pre); strings.HasPrefix(post, "cgroup2 ") && len(fs) >= 5 && path != "" {
			return filepath.Join(fs[4], path)
		}
	}
	return ""
}

// A zone whose root's mark is lost or damaged while its parts live is not
// known to be unwanted: Sweep leaves it, parts and root, as they are.
func TestSweepLeavesALiveZoneWhoseMarkIsLostAlone(t *testing.T) {
	e := newEnv(t, nil)
	lost, damaged := spec(0x61), spec(0x62)
	e.ensure(lost)
	e.ensure(damaged)
	pids := map[string]int{}
	marks := map[string][]byte{}
	for _, s := range []zone.Spec{lost, damaged} {
		pids[s.Name] = status(t, serviceDir(t, e, s)).PID
		b, err := os.ReadFile(filepath.Join(rootOf(e, s), "zone.json"))
		if err != nil {
			t.Fatal(err)
		}
		marks[s.Name] = b
	}
	// Put the marks back for the cleanup, which goes by them.
	t.Cleanup(func() {
		for _, s := range []zone.Spec{lost, damaged} {
			os.WriteFile(filepath.Join(rootOf(e, s), "zone.json"), marks[s.Name], 0o644)
		}
	})
	if err := os.Remove(filepath.Join(rootOf(e, lost), "zone.json")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(rootOf(e, damaged), "zone.json"), `{"tag": "`+e.tag+`", "id": "`)
	lines, err := e.rt.Sweep(context.Background())
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	for _, l := range lines {
		if strings.Contains(l, lost.Name) || strings.Contains(l, lost.ID) || strings.Contains(l, damaged.Name) || strings.Contains(l, damaged.ID) {
			t.Errorf("Sweep removed a part of a live zone whose mark is unreadable: %q", l)
		}
	}
	for _, s := range []zone.Spec{lost, damaged} {
		if st := status(t, serviceDir(t, e, s)); st.PID != pids[s.Name] {
			t.Errorf("zone %s: its service is now pid %d, was %d", s.Name, st.PID, pids[s.Name])
		}
		if !zonenet.NetnsExists(e.prefix + s.Name) {
			t.Errorf("zone %s: namespace removed", s.Name)
		}
		if _, err := os.Stat(rootOf(e, s)); err != nil {
			t.Errorf("zone %s: root removed: %v", s.Name, err)
		}
		// Nor is it reported gone (a VMM's monitor would tear it down).
		if o, exists, err := e.rt.Inspect(context.Background(), s.Name); err == nil && !exists {
			t.Errorf("zone %s: Inspect says it does not exist: %+v", s.Name, o)
		}
	}
}
