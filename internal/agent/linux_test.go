package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/cli"
	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/timesync/ntpzone/ntpzonetest"
	"github.com/sled-agent/sled-agent/internal/vmm/qemujail"
	"github.com/sled-agent/sled-agent/internal/vmm/standin"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
	"github.com/sled-agent/sled-agent/internal/zoneservice/zoneservicetest"
)

// TestMain lets this test binary stand in for the agent binary that the
// linux runtime's default images run: `<binary> zone-service --listen A
// --zone N --id I --kind K`, `<binary> ntp-zone …`, `<binary> vmm-service …`.
func TestMain(m *testing.M) {
	qemujail.RunIfAsked() // a VMM service's QEMU, shut in
	standin.RunIfAsked()  // a stand-in guest's namespace
	zoneservicetest.ServeIfAsked()
	ntpzonetest.ServeIfAsked()
	serveVMMIfAsked()
	zoneservicetest.ExitIfService()
	os.Exit(m.Run())
}

// serveVMMIfAsked is ServeIfAsked for the VMM image: `<binary>
// vmm-service …` runs as `sled-agent vmm-service …` does (with the linux
// runtime, a QEMU machine); and for the VPC data path's service
// (`vpc-service …`).
func serveVMMIfAsked() {
	if len(os.Args) > 1 && (os.Args[1] == "vmm-service" || os.Args[1] == "vpc-service") {
		os.Exit(cli.Main(os.Args[1:]))
	}
}

// linuxZonesSled is the underlay address of the linux agents of this file:
// their zones and VMMs are in its /64, at addresses no other test uses.
const linuxZonesSled = "fd00:1122:3344:1e0::1"

// linuxZones is a config of three zones on addresses no other test uses: two
// crucibles and a nexus with a NIC.
func linuxZones(t *testing.T, dir, tag string, gen uint64) ([]byte, []sledconfig.Zone) {
	zones := []sledconfig.Zone{sledconfigtest.Crucible(0), sledconfigtest.Crucible(1)}
	for i := range zones {
		zones[i].ZoneType.Address = fmt.Sprintf("[fd00:1122:3344:1e0::%x]:32345", i+5)
	}
	nexus := sledconfigtest.Nexus(2, "[fd00:1122:3344:1e0::7]:12221")
	zones = sledconfigtest.OwnPools(tag, append(zones, nexus)...)
	return linuxDoc(t, dir, tag, gen, zones...), zones
}

// TestLinuxZonesComeUpAndComeBack is the outside check of the linux
// runtime: every zone of a config becomes a namespace whose service accepts
// TCP from the host; a zone whose namespace is deleted and processes killed
// comes back; stopping the agent leaves the zones running.
func TestLinuxZonesComeUpAndComeBack(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)

	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, RelistPeriod: time.Second, UnderlayIP: linuxZonesSled})
	stop := run(t, a)
	c := newClient(t, a)
	doc, zones := linuxZones(t, dir, tag, 1)
	if err := c.PutConfig(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, z := range zones {
		want[z.Name()] = "running"
	}
	waitStates(t, c, want)
	for _, z := range zones {
		if !zonenet.NetnsExists(prefix + z.Name()) {
			t.Errorf("no namespace for %s", z.Name())
		}
		addr, _ := z.ServiceAddr()
		conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			t.Fatalf("zone %s does not accept TCP at %s: %v", z.Name(), addr, err)
		}
		conn.Close()
	}

	// Delete a zone behind the agent's back: its namespace and its processes.
	victim := zones[0]
	ns := prefix + victim.Name()
	pids := namespacePIDs(t, ns)
	// As `ip netns delete` does.
	if err := syscall.Unmount(zonenet.NetnsPath(ns), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(zonenet.NetnsPath(ns)); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	gone := time.Now()
	addr, _ := victim.ServiceAddr()
	waitFor(t, "the deleted zone to answer again", func() (bool, string) {
		// A short timeout: a check sent while the zone is gone waits for
		// nothing, and should not hold up the next one.
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		err := zoneservice.Check(ctx, addr.String())
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("zone back %s after its namespace was deleted", time.Since(gone).Round(time.Millisecond))
	if zs, err := c.Zone(t.Context(), victim.ID); err == nil {
		for _, e := range zs.History {
			t.Logf("  %s %+.3fs %s %s", victim.Name(), e.At.Sub(gone).Seconds(), e.Event, e.Detail)
		}
	}
	// The agent's own readiness check may see the service a moment after
	// ours did.
	waitFor(t, "the agent to report the zone running again, with one incident", func() (bool, string) {
		zs, err := c.Zone(t.Context(), victim.ID)
		if err != nil {
			return false, err.Error()
		}
		return zs.Incidents == 1 && zs.State == "running", fmt.Sprintf("%+v", zs.ZoneSummary)
	})

	// Shutdown is not Destroy.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, z := range zones {
		addr, _ := z.ServiceAddr()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if err := zoneservice.Check(ctx, addr.String()); err != nil {
			t.Errorf("zone %s down after the agent stopped: %v", z.Name(), err)
		}
		cancel()
	}
}

// linuxEnv skips the test unless it can make real zones, and returns a
// unique ownership tag and namespace prefix, and a data dir and run dir;
// everything with the tag is destroyed when the test ends.
func linuxEnv(t *testing.T) (tag, prefix, dir, runDir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, links and processes")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		t.Skip("needs runit's runsv (scripts/setup installs it)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("needs btrfs-progs: zones' datasets are on btrfs pools (scripts/setup installs them)")
	}
	b := make([]byte, 3)
	rand.Read(b)
	tag = "zt" + hex.EncodeToString(b)
	prefix = tag + "-"
	dir, runDir = linuxDataDir(t), t.TempDir()
	t.Cleanup(func() {
		destroyAll(t, dir, runDir, tag, prefix)
		if err := agent.RemoveHostLock(tag); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return tag, prefix, dir, runDir
}

// linuxDataDir returns a data dir for a Linux test agent whose pools are
// released (unmounted, their loop devices detached) at cleanup, after the
// zones on them are gone (cleanups registered later run first).
func linuxDataDir(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() {
		if err := btrfs.ReleaseUnder(context.Background(), dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return dir
}

// vdevDir is where a Linux test agent with data dir dir finds its disks.
func vdevDir(dir string) string { return filepath.Join(dir, "vdev") }

// linuxDoc returns the config of zones for a Linux test agent of tag with
// data dir dir, each pool carried by a vdev made in vdevDir(dir). The
// zones' pools are to be the test's own (sledconfigtest.OwnPools).
func linuxDoc(t *testing.T, dir, tag string, gen uint64, zones ...sledconfig.Zone) []byte {
	t.Helper()
	if err := btrfs.MakeVdevs(vdevDir(dir), sledconfigtest.VdevNames(tag+"-", zones...)...); err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(sledconfigtest.ConfigOnVdevs(gen, tag+"-", zones...))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// namespacePIDs lists the processes in the named network namespace.
func namespacePIDs(t *testing.T, ns string) []int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(zonenet.NetnsPath(ns), &st); err != nil {
		t.Fatal(err)
	}
	want := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if link, _ := os.Readlink("/proc/" + e.Name() + "/ns/net"); link == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// destroyAll removes every zone with the test's tag.
func destroyAll(t *testing.T, dir, runDir, tag, prefix string) {
	// The sled's, if an agent ran here: its zones are the ones to destroy.
	sled := uuid.NewString()
	if b, err := os.ReadFile(filepath.Join(dir, "sled-id")); err == nil {
		sled = strings.TrimSpace(string(b))
	}
	rt, err := linux.New(linux.Options{DataDir: dir, RunDir: runDir, Tag: tag, Sled: sled, NetnsPrefix: prefix})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs, err := rt.List(ctx)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, o := range obs {
		if err := rt.Destroy(ctx, o.Name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	rt.RemoveEmptyDirs()
	nss, links, _ := zonenet.List(prefix, tag)
	if len(nss)+len(links) > 0 {
		t.Errorf("left behind: namespaces %v, links %v", nss, links)
	}
}

// TestLinuxRestartAdoptsZones: an agent restarted with its zones running
// adopts them without restarting a single process; a config ledgered while
// it was down restarts only the zone it changed.
func TestLinuxRestartAdoptsZones(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, RelistPeriod: time.Second, UnderlayIP: linuxZonesSled}

	first := newAgent(t, cfg)
	stop := run(t, first)
	c := newClient(t, first)
	doc, zones := linuxZones(t, dir, tag, 1)
	if err := c.PutConfig(t.Context(), doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, z := range zones {
		want[z.Name()] = "running"
	}
	waitStates(t, c, want)
	pids := servicePIDs(t, runDir, tag, zones)
	// Data in a crucible's durable dataset, which must outlive the agent.
	pool, _ := storage.PoolIDFromName(zones[0].ZoneType.Dataset.PoolName)
	data := filepath.Join(dir, "storage", "ext", pool, "crucible", "extent-0")
	if err := os.WriteFile(data, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A leftover of a zone whose root is gone: its claim, namespace and
	// links, as a crash of Ensure right after the zone's network leaves
	// them, once the root is lost too.
	orphan := sledconfigtest.Crucible(9)
	orphanAddr := netip.MustParseAddr("fd00:1122:3344:1e0::9")
	sledID, err := os.ReadFile(filepath.Join(dir, "sled-id"))
	if err != nil {
		t.Fatal(err)
	}
	claim := filepath.Join(runDir, tag, orphan.Name(), linux.ClaimFile)
	if err := os.MkdirAll(filepath.Dir(claim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(claim, []byte(`{"sled_id": "`+strings.TrimSpace(string(sledID))+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := zonenet.Ensure(t.Context(), zonenet.Config{Netns: prefix + orphan.Name(), Tag: tag, ZoneID: orphan.ID, Underlay: orphanAddr}); err != nil {
		t.Fatal(err)
	}

	// Restarted as it was: every zone adopted, no process restarted, the
	// leftover swept.
	second := newAgent(t, cfg)
	stop = run(t, second)
	c = newClient(t, second)
	waitStates(t, c, want)
	var rs *reconciler.RestoreStatus
	waitFor(t, "the restore protocol done", func() (bool, string) {
		var err error
		rs, err = c.Restore(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return rs.Done, fmt.Sprintf("%+v", rs)
	})
	if rs.Found != 3 || rs.Adopted != 3 || len(rs.Leftovers) == 0 {
		t.Errorf("restore %+v, want 3 found and adopted, and leftovers swept", rs)
	}
	if zonenet.NetnsExists(prefix + orphan.Name()) {
		t.Errorf("the leftover namespace is still there")
	}
	if nss, links, err := zonenet.List(prefix, tag); err != nil || len(nss) != 3 || len(links) != 4 {
		t.Errorf("after the restart: namespaces %v, links %v (%v), want the 3 zones' (4 links: the nexus has two)", nss, links, err)
	}
	if got := servicePIDs(t, runDir, tag, zones); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("service PIDs %v after the restart, want %v (unchanged)", got, pids)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "keep me" {
		t.Errorf("the crucible's durable data after the restart: %q, %v", b, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A config ledgered while the agent was down (as when it dies right
	// after the ledger commit): crucible 1 moves to another port.
	l, err := ledger.Open([]string{filepath.Join(dir, "ledger-a"), filepath.Join(dir, "ledger-b")}, agent.LedgerFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	changed := slices.Clone(zones)
	changed[1].ZoneType.Address = strings.Replace(changed[1].ZoneType.Address, ":32345", ":32346", 1)
	doc2 := linuxDoc(t, dir, tag, 2, changed...)
	if err := configstore.Open(l, nil, nil, configstore.Options{}).Put(t.Context(), doc2); err != nil {
		t.Fatal(err)
	}
	third := newAgent(t, cfg)
	run(t, third)
	c = newClient(t, third)
	waitFor(t, "the changed zone running with its new config", func() (bool, string) {
		zs, err := c.Zone(t.Context(), changed[1].ID)
		if err != nil {
			return false, err.Error()
		}
		return zs.State == "running" && zs.ConfigHash == changed[1].Hash(), fmt.Sprintf("%+v", zs.ZoneSummary)
	})
	waitStates(t, c, want)
	after := servicePIDs(t, runDir, tag, zones)
	for i, z := range zones {
		same := after[z.Name()] == pids[z.Name()]
		if i == 1 && same {
			t.Errorf("changed zone %s kept its service process %d", z.Name(), pids[z.Name()])
		}
		if i != 1 && !same {
			t.Errorf("unchanged zone %s restarted: pid %d → %d", z.Name(), pids[z.Name()], after[z.Name()])
		}
	}
	if rs, err := c.Restore(t.Context()); err != nil || rs.Adopted != 2 || rs.Repair != 1 {
		t.Errorf("restore %+v (%v), want 2 adopted and 1 repaired", rs, err)
	}
}

// servicePIDs reads each zone's service PID from its supervisor.
func servicePIDs(t *testing.T, runDir, tag string, zones []sledconfig.Zone) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, z := range zones {
		st, err := supervise.Status(filepath.Join(runDir, tag, z.Name()))
		if err != nil || !st.Up {
			t.Fatalf("zone %s service: %+v, %v", z.Name(), st, err)
		}
		out[z.Name()] = st.PID
	}
	return out
}

// TestLinuxVMMFailsWhenItsZoneIsDeleted is the outside check of VMMs on
// Linux: a registered VMM asked to run reaches running in a real zone (QEMU
// runs its firmware: the spec's disk is a blob with nothing to boot); after
// the zone's namespace is deleted and its processes killed, QEMU with them,
// its state says failed (the issue asks within 2 s; the wait here is only a
// hang detector).
func TestLinuxVMMFailsWhenItsZoneIsDeleted(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: linuxZonesSled})
	run(t, a)
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:1e0::1:5]:12400")); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
		t.Fatalf("requesting running: %d %s", code, b)
	}
	waitVMM(t, a, "running")
	ns := prefix + zone.VMMNamePrefix + testVMM
	pids := namespacePIDs(t, ns)
	if len(pids) == 0 {
		t.Fatalf("no process in the VMM's namespace %s", ns)
	}
	if err := syscall.Unmount(zonenet.NetnsPath(ns), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(zonenet.NetnsPath(ns)); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deleted := time.Now()
	st := waitVMM(t, a, "failed")
	t.Logf("VMM failed %s after its zone was deleted (gen %d)", time.Since(deleted).Round(time.Millisecond), st.VmmState.Gen)
	waitFor(t, "nothing of the VMM's zone left", func() (bool, string) {
		nss, links, err := zonenet.List(prefix, tag)
		return err == nil && len(nss)+len(links) == 0, fmt.Sprint(nss, links, err)
	})
}

// TestLinuxRestartAdoptsARunningVMM: the VMM's service process in its real
// zone keeps running through an agent restart, and the new agent follows it
// with a higher generation.
func TestLinuxRestartAdoptsARunningVMM(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	cfg := agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: linuxZonesSled}
	first := newAgent(t, cfg)
	stop := run(t, first)
	call(t, first, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:1e0::1:6]:12400"))
	call(t, first, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	before := waitVMM(t, first, "running")
	svc := filepath.Join(runDir, tag, zone.VMMNamePrefix+testVMM)
	st, err := supervise.Status(svc)
	if err != nil || !st.Up {
		t.Fatalf("VMM service: %+v, %v", st, err)
	}
	qemu := qemuPIDs(t, "guest="+testVMM, dir+"/")
	if len(qemu) != 1 {
		t.Fatalf("QEMU of the VMM: %v, want one", qemu)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	second := newAgent(t, cfg)
	run(t, second)
	after := waitVMM(t, second, "running")
	if after.VmmState.Gen <= before.VmmState.Gen {
		t.Errorf("gen %d after the restart, %d before", after.VmmState.Gen, before.VmmState.Gen)
	}
	if st2, err := supervise.Status(svc); err != nil || st2.PID != st.PID {
		t.Errorf("VMM service pid %d before the restart, %+v (%v) after", st.PID, st2, err)
	}
	if got := qemuPIDs(t, "guest="+testVMM, dir+"/"); len(got) != 1 || got[0] != qemu[0] {
		t.Errorf("QEMU %v before the restart, %v after", qemu, got)
	}
}

// TestLinuxStoppedServiceIsNotOK is the outside check of health after
// start: a zone whose service is stopped by a signal (alive, not answering)
// is reported err, or restarted and answering, within 30 s with the default
// health period and threshold.
func TestLinuxStoppedServiceIsNotOK(t *testing.T) {
	tag, prefix, dir, runDir := linuxEnv(t)
	a := newAgent(t, agent.Config{DataDir: dir, RunDir: runDir, Runtime: "linux", VdevDir: vdevDir(dir), ZoneTag: tag, NetnsPrefix: prefix, UnderlayIP: linuxZonesSled})
	run(t, a)
	c := newClient(t, a)
	z := sledconfigtest.OwnPools(tag, sledconfigtest.Crucible(0))[0]
	z.ZoneType.Address = "[fd00:1122:3344:1e0::1:7]:32345"
	if err := c.PutConfig(t.Context(), linuxDoc(t, dir, tag, 1, z)); err != nil {
		t.Fatal(err)
	}
	waitStates(t, c, map[string]string{z.Name(): "running"})
	pid := servicePIDs(t, runDir, tag, []sledconfig.Zone{z})[z.Name()]
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	stopped := time.Now()
	addr, _ := z.ServiceAddr()
	// Either is fine: the repair can be done between two looks.
	var seen string
	for time.Since(stopped) < 30*time.Second && seen == "" {
		inv, err := c.Inventory(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if res := inv.LastReconciliation.Zones[z.ID]; res.Result != "ok" {
			seen = "reported " + res.Message
		} else if st, err := supervise.Status(filepath.Join(runDir, tag, z.Name())); err == nil && st.Up && st.PID != pid {
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			if zoneservice.Check(ctx, addr.String()) == nil {
				seen = fmt.Sprintf("restarted (service PID %d → %d) and answering", pid, st.PID)
			}
			cancel()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if seen == "" {
		t.Fatalf("a stopped service was reported ok for 30s")
	}
	t.Logf("%s %s after SIGSTOP", seen, time.Since(stopped).Round(time.Millisecond))
	// Repaired through the normal path: a new service that answers.
	waitFor(t, "the zone to be restarted and answer", func() (bool, string) {
		zs, err := c.Zone(t.Context(), z.ID)
		if err != nil {
			return false, err.Error()
		}
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		err = zoneservice.Check(ctx, addr.String())
		return zs.State == "running" && err == nil, fmt.Sprintf("%s %s; check: %v", zs.State, zs.Activity, err)
	})
	zs, err := c.Zone(t.Context(), z.ID)
	if err != nil || zs.Incidents != 1 || !slices.ContainsFunc(zs.History, func(e reconciler.Event) bool { return e.Event == "unhealthy" }) {
		t.Fatalf("zone after repair: %+v, %v", zs, err)
	}
	if got := servicePIDs(t, runDir, tag, []sledconfig.Zone{z})[z.Name()]; got == pid {
		t.Fatalf("service PID still %d", pid)
	}
}
