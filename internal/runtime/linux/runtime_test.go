package linux_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone/ntpzonetest"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// TestMain lets the test binary play the agent binary that zone images run:
// "ntp-zone …" serves an NTP zone (ntp_root_test.go),
// "zone-service …" serves like `sled-agent zone-service`, "never-ready"
// runs without ever answering a health check; "tcp-listen" and "zone-probe"
// are a service that is not the agent's and a readiness command
// (ready_root_test.go); "guest-stand-in" plays a VMM zone's service
// (guest_root_test.go).
func TestMain(m *testing.M) {
	zoneservicetest.ServeIfAsked()
	if len(os.Args) > 1 && os.Args[1] == "never-ready" {
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	standInIfAsked()
	guestStandInIfAsked()
	ntpzonetest.ServeIfAsked()
	zoneservicetest.ExitIfService()
	os.Exit(m.Run())
}

// Hang detectors: bounds on waits, not assertions about speed.
const (
	startTimeout = 30 * time.Second
	eventTimeout = 5 * time.Second
)

type env struct {
	t      *testing.T
	rt     *linux.Runtime
	tag    string
	sled   string
	prefix string
	dir    string
	run    string
	pools  string // the pool root
	pokes  chan struct{}
	opts   linux.Options // what rt was made with
}

func newEnv(t *testing.T, images map[string]linux.Image) *env {
	t.Helper()
	return newEnvWith(t, images, nil)
}

// newEnvWith is newEnv with the runtime's options changed by edit (if not
// nil) before the runtime is made.
func newEnvWith(t *testing.T, images map[string]linux.Image, edit func(*linux.Options)) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, links and processes")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	b := make([]byte, 3)
	rand.Read(b)
	// The directories first: cleanups run last-registered first, and ours
	// needs them.
	e := &env{t: t, tag: "zt" + hex.EncodeToString(b), dir: t.TempDir(), run: t.TempDir(), pools: t.TempDir(), pokes: make(chan struct{}, 100)}
	e.prefix = e.tag + "-"
	e.sled = uuid.NewString()
	// Clean up everything with our tag, even if the test fails half-way.
	t.Cleanup(e.cleanup)
	e.opts = linux.Options{
		DataDir:     e.dir,
		RunDir:      e.run,
		PoolRoot:    e.pools,
		Tag:         e.tag,
		Sled:        e.sled,
		NetnsPrefix: e.prefix,
		Images:      images,
		Notify: func() {
			select {
			case e.pokes <- struct{}{}:
			default:
			}
		},
	}
	if edit != nil {
		edit(&e.opts)
	}
	rt, err := linux.New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	e.rt = rt
	return e
}

func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.rt != nil {
		if obs, err := e.rt.List(ctx); err == nil {
			for _, o := range obs {
				if err := e.rt.Destroy(ctx, o.Name); err != nil {
					e.t.Errorf("cleanup: %v", err)
				}
			}
		}
		if _, err := e.rt.Sweep(ctx); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	}
	// Whatever a failed test left outside a zone root.
	services, _ := filepath.Glob(filepath.Join(e.run, e.tag, "*"))
	for _, s := range services {
		supervise.Stop(ctx, s)
	}
	nss, links, _ := zonenet.List(e.prefix, e.tag)
	for _, ns := range nss {
		zonenet.Remove(ctx, ns, e.tag, ns[max(len(ns)-36, 0):]) // the zone id ends the name
	}
	for _, l := range links {
		zonenet.Remove(ctx, e.prefix+"none", e.tag, l.ZoneID)
	}
	if e.rt != nil {
		e.rt.RemoveEmptyDirs()
	}
}

// spec is a crucible zone with index i, on its own /64.
func spec(i int) zone.Spec {
	z := sledconfigtest.Crucible(i)
	z.ZoneType.Address = fmt.Sprintf("[fd00:1122:3344:1%02x::5]:32345", i)
	return zone.SpecFor(&z)
}

func (e *env) ensure(s zone.Spec) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := e.rt.Ensure(ctx, s); err != nil {
		e.t.Fatalf("Ensure %s: %v", s.Name, err)
	}
}

func (e *env) observed(name string) (zone.Observed, bool) {
	e.t.Helper()
	obs, err := e.rt.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, o := range obs {
		if o.Name == name {
			return o, true
		}
	}
	return zone.Observed{}, false
}

func healthy(t *testing.T, s zone.Spec) {
	t.Helper()
	addr, _ := s.Config.ServiceAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := zoneservice.Check(ctx, addr.String()); err != nil {
		t.Fatalf("zone %s does not answer from the host at %s: %v", s.Name, addr, err)
	}
}

func TestZoneComesUpAndAnswersFromTheHost(t *testing.T) {
	e := newEnv(t, nil)
	plain := spec(1)
	withNIC := sledconfigtest.Crucible(2)
	withNIC.ZoneType.Type = "nexus"
	withNIC.ZoneType.InternalAddress = "[fd00:1122:3344:102::6]:12221"
	withNIC.ZoneType.Address, withNIC.ZoneType.Dataset = "", nil
	withNIC.ZoneType.NIC = &sledconfig.NIC{MAC: "A8:40:25:FF:80:05", VNI: 100,
		IPConfig: sledconfig.IPConfig{Type: "v4", Value: sledconfig.IPConfigValue{IP: "172.30.2.9", Subnet: "172.30.2.0/24"}}}
	nexus := zone.SpecFor(&withNIC)

	for _, s := range []zone.Spec{plain, nexus} {
		e.ensure(s)
		healthy(t, s)
		o, ok := e.observed(s.Name)
		if !ok || !o.Running || o.Hash != s.Hash || o.ID != s.ID {
			t.Fatalf("List for %s: %+v (found %v)", s.Name, o, ok)
		}
		if _, err := os.Stat("/run/netns/" + e.prefix + s.Name); err != nil {
			t.Errorf("namespace not visible to ip netns: %v", err)
		}
	}
	// Ensure of a running zone is a no-op that returns at once.
	e.ensure(plain)
	healthy(t, plain)

	// Everything carrying our marks is listed: both zones, their
	// namespaces, three links (the nexus has a NIC) and both services.
	owned, err := e.rt.Owned(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(owned.Zones) != 2 || len(owned.Namespaces) != 2 || len(owned.Links) != 3 || len(owned.Processes) != 2 {
		t.Fatalf("owned: %+v", owned)
	}
	for _, p := range owned.Processes {
		if p.Comm != "sled-agent" || filepath.Dir(p.Dir) != filepath.Join(e.run, e.tag) {
			t.Errorf("marked process %+v", p)
		}
	}
	// The supervisor and the service were born in the zone's namespace.
	for _, s := range []zone.Spec{plain, nexus} {
		e.inZone(s)
	}
}

// inZone fails the test unless the zone's runsv and its service run in the
// zone's namespace.
func (e *env) inZone(s zone.Spec) {
	e.t.Helper()
	svc := serviceDir(e.t, e, s)
	st, err := supervise.Status(svc)
	if err != nil || st.PID == 0 {
		e.t.Fatalf("%s: status %+v, %v", s.Name, st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	sv, err := supervise.StartContext(ctx, svc) // finds the running one
	if err != nil {
		e.t.Fatal(err)
	}
	defer sv.Close()
	for what, pid := range map[string]int{"runsv": sv.PID, "service": st.PID} {
		if in, err := zonenet.ProcessIn(pid, e.prefix+s.Name); err != nil || !in {
			e.t.Errorf("%s: %s %d in the zone's namespace: %v, %v", s.Name, what, pid, in, err)
		}
	}
}

// A runsv that runs outside the zone's namespace (as an older agent, whose
// run script entered the namespace itself, left it) is replaced by one
// inside, so that no restart of the service lands in the host's namespace.
func TestSupervisorOutsideTheNamespaceIsReplaced(t *testing.T) {
	e := newEnv(t, nil)
	s := spec(4)
	e.ensure(s)
	svc := serviceDir(t, e, s)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := supervise.StopSupervisor(ctx, svc); err != nil {
		t.Fatal(err)
	}
	outside, err := supervise.StartContext(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	if in, err := zonenet.ProcessIn(outside.PID, e.prefix+s.Name); err != nil || in {
		t.Fatalf("setup: runsv %d in the zone: %v, %v", outside.PID, in, err)
	}
	e.ensure(s)
	if !outside.Exited() {
		t.Errorf("runsv %d outside the namespace still runs", outside.PID)
	}
	e.inZone(s)
	healthy(t, s)
}

func TestSupervisorRestartsAKilledService(t *testing.T) {
	e := newEnv(t, nil)
	s := spec(3)
	e.ensure(s)
	svc := serviceDir(t, e, s)
	st, err := supervise.Status(svc)
	if err != nil || !st.Up || st.PID == 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		now, err := supervise.Status(svc)
		if err == nil && now.Up && now.PID != st.PID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service not restarted: %+v, %v", now, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitHealthy(t, s)
	e.inZone(s)
}

func waitHealthy(t *testing.T, s zone.Spec) {
	t.Helper()
	addr, _ := s.Config.ServiceAddr()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := zoneservice.Check(ctx, addr.String())
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %s never healthy again: %v", s.Name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func serviceDir(t *testing.T, e *env, s zone.Spec) string {
	t.Helper()
	return filepath.Join(e.run, e.tag, s.Name)
}

func TestNamespaceDeletedDuringReadinessWaitIsZoneGone(t *testing.T) {
	e := newEnv(t, map[string]linux.Image{"crucible": {Command: []string{"{agent}", "never-ready"}}})
	s := spec(4)
	errc := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { errc <- e.rt.Ensure(ctx, s) }()
	ns := e.prefix + s.Name
	deadline := time.Now().Add(startTimeout)
	for !zonenet.NetnsExists(ns) {
		if time.Now().After(deadline) {
			t.Fatal("namespace never created")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // well into the wait
	deleted := time.Now()
	if err := zonenet.Remove(context.Background(), ns, e.tag, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, zone.ErrGone) {
			t.Fatalf("Ensure returned %v, want a zone-gone error", err)
		}
		t.Logf("zone gone reported %s after the namespace was deleted", time.Since(deleted))
	case <-time.After(eventTimeout):
		t.Fatal("Ensure still waiting after the namespace was deleted")
	}
}

func TestServiceThatKeepsExitingIsNotReadyAndSaysWhy(t *testing.T) {
	e := newEnv(t, map[string]linux.Image{"crucible": {Command: []string{"/bin/sh", "-c", "exit 3"}}})
	s := spec(6)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := e.rt.Ensure(ctx, s)
	if err == nil || errors.Is(err, zone.ErrGone) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ensure = %v, want a deadline error that is not zone gone", err)
	}
	if !strings.Contains(err.Error(), "last exited with code 3") {
		t.Errorf("Ensure's error %q does not say how the service exited", err)
	}
}

func TestDeletedNamespaceOfARunningZoneIsNoticed(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchDone := make(chan error, 1)
	go func() { watchDone <- e.rt.Watch(ctx) }()
	s := spec(5)
	e.ensure(s)
	for len(e.pokes) > 0 {
		<-e.pokes
	}
	if err := zonenet.Remove(context.Background(), e.prefix+s.Name, e.tag, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.pokes:
	case <-time.After(eventTimeout):
		t.Fatal("no notification after the zone's namespace was deleted")
	}
	o, ok := e.observed(s.Name)
	if !ok || o.Running || !strings.Contains(o.Detail, "namespace") {
		t.Fatalf("List after deletion: %+v (found %v)", o, ok)
	}
	cancel()
	if err := <-watchDone; err != nil {
		t.Errorf("Watch: %v", err)
	}
}

func TestDestroyLeavesNothing(t *testing.T) {
	e := newEnv(t, nil)
	s := spec(6)
	e.ensure(s)
	svc := serviceDir(t, e, s)
	st, _ := supervise.Status(svc)
	runsv, found, err := supervise.Find(svc)
	if err != nil || !found {
		t.Fatalf("runsv not found: %v", err)
	}
	// Where there is a cgroup v2 file system, the zone's supervisor and
	// service live in the zone's own cgroup.
	if cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", runsv.PID)); err == nil && strings.Contains(string(cg), "0::") {
		want := "0::/sled-agent/" + e.tag + "/" + s.Name + "\n"
		for _, pid := range []int{runsv.PID, st.PID} {
			if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); !strings.Contains(string(cg), want) {
				t.Errorf("process %d is in cgroup %q, want %q", pid, cg, want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	for _, pid := range []int{st.PID, runsv.PID} {
		if running(pid) {
			t.Errorf("process %d still runs", pid)
		}
	}
	nss, links, err := zonenet.List(e.prefix, e.tag)
	if err != nil || len(nss) != 0 || len(links) != 0 {
		t.Errorf("left: namespaces %v, links %v (%v)", nss, links, err)
	}
	if roots, _ := filepath.Glob(filepath.Join(e.dir, "pools", "*", "zones", "*")); len(roots) != 0 {
		t.Errorf("zone roots left: %v", roots)
	}
	if _, ok := e.observed(s.Name); ok {
		t.Error("List still shows the zone")
	}
	addr, _ := s.Config.ServiceAddr()
	if c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Error("the zone's address still answers")
	}
}

// running reports whether process pid exists and has not exited (a zombie,
// dead and waiting for its parent to reap it, does not run).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// A service that leaves behind a child deaf to SIGTERM still leaves nothing
// after Destroy: the child is killed with the zone.
func TestDestroyKillsWhatTheServiceLeft(t *testing.T) {
	// sh makes its background child ignore SIGTERM, then becomes the
	// zone service.
	script := `trap '' TERM; sleep 600 & exec "$0" zone-service --listen "$1" --zone "$2" --id "$3" --kind "$4"`
	e := newEnv(t, map[string]linux.Image{"crucible": {Command: []string{"/bin/sh", "-c", script, "{agent}", "{listen}", "{name}", "{id}", "{kind}"}}})
	s := spec(7)
	e.ensure(s)
	runsv, found, err := supervise.Find(serviceDir(t, e, s))
	if err != nil || !found {
		t.Fatalf("runsv not found: %v", err)
	}
	var pids []int
	if cg := cgroupOf(t, runsv.PID); cg != "" {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			pids = append(pids, pid)
		}
		if len(pids) != 3 {
			t.Fatalf("the zone's cgroup holds %v, want runsv, the service and its child", pids)
		}
	} else {
		t.Log("no cgroup v2 file system: the child is found by its namespace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := e.rt.Destroy(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("process %d still runs", pid)
		}
	}
	if nss, links, err := zonenet.List(e.prefix, e.tag); err != nil || len(nss) != 0 || len(links) != 0 {
		t.Errorf("left: namespaces %v, links %v (%v)", nss, links, err)
	}
}
