package cli

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/syncbuf"
	"github.com/sled-agent/sled-agent/internal/testguest"
)

// devLinuxWait bounds the Linux dev rack's start, from nothing to guest
// A's ping of guest B answered (under a minute here; the guests' first
// boots through OVMF under TCG on a busy machine take minutes): a hang
// detector, not a timing.
const devLinuxWait = 12 * time.Minute

// The outside check of `sled-agent dev --runtime linux`: run as a person
// runs it (a second time, after a first run was killed and left everything
// behind), it says its zones run and its time is synchronized through its
// NTP zone; its second sled runs in a namespace of its own; each sled's
// guest takes its address by DHCP from its sled's data path, and guest A's
// ping of guest B across the sleds is answered; `sled-agent vpc` shows
// each sled's data path. At SIGINT (Ctrl-C) it exits 0, and nothing of
// either sled or of the rack is left on the host: no namespace, link,
// mount, loop device, process, cgroup, run dir or host lock of their tags,
// and no data dir.
func TestDevLinuxRunsARealSledAndLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: dev --runtime linux makes namespaces, mounts, loop devices and processes")
	}
	if _, err := devLinuxTools(); err != nil {
		t.Skipf("dev --runtime linux cannot run here: %v", err)
	}
	testguest.Image(t) // built once per machine, before the dev sled waits for it
	// The cleanup's teardown of the second sled runs this binary as
	// sled-agent.
	t.Setenv(runAgentEnv, "1")
	b := make([]byte, 3)
	rand.Read(b)
	tag := "zt" + hex.EncodeToString(b)
	top := t.TempDir()
	dataDir, runDir := filepath.Join(top, "data"), filepath.Join(top, "run")
	tagB, dataDirB, runDirB := tag+"-b", dataDir+"-b", runDir+"-b"
	args := []string{"dev", "--runtime", "linux", "--listen", freeAddr(t), "--data-dir", dataDir, "--run-dir", runDir,
		"--zone-tag", tag, "--netns-prefix", tag + "-", "--vmm-accel", "tcg"}
	// Whatever happens, the sled's parts go (a dev that did not get to its
	// own removal leaves them).
	t.Cleanup(func() {
		_, errA := os.Stat(dataDir)
		_, errB := os.Stat(dataDirB)
		if errA != nil && errB != nil && !zonenet.NetnsExists(tag+"-rack") {
			return
		}
		cfg := agent.Config{DataDir: dataDir, RunDir: runDir, Runtime: "linux", ZoneTag: tag, NetnsPrefix: tag + "-", VdevDir: filepath.Join(dataDir, "vdev")}
		d := &devLinux{progress: t.Output(), cfg: cfg}
		if err := d.close(false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	// The banner's lines, as a person reads them.
	want := []string{"all 3 zones running after", "time sync: synchronized to " + devReferenceAddr, "storage: 2/2 disks with their pools",
		"guest A: VMM ", "guest B: VMM ", "pushed to both sleds"}
	// A first run is killed (SIGKILL: it removes nothing; its second
	// sled's agent is told to stop as its parent dies, and leaves its
	// zones, its guest and data path); the next one clears what it left,
	// then runs as if it were the first.
	dev, out := startBinary(t, args...)
	waitForLines(t, dev, out, want)
	if err := dev.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	dev.Wait()
	dev, out = startBinary(t, args...)
	waitForLines(t, dev, out, append(want, "did not stop cleanly; removing what it left", "an earlier dev's second sled did not stop cleanly",
		testguest.NetPrefix+"172.30.0.5 router=172.30.0.1", testguest.NetPrefix+"172.30.0.6 router=172.30.0.1",
		"guest A pinged guest B (172.30.0.6) across the sleds: ", "The agent keeps serving"))
	t.Logf("dev --runtime linux after a killed one:\n%s", out)
	if !regexp.MustCompile(`guest A pinged guest B \(172\.30\.0\.6\) across the sleds: ` + testguest.PingPrefix + `172\.30\.0\.6 ok avg=[0-9.]+ms 3 packets transmitted, [1-3] packets received`).MatchString(out.String()) {
		t.Errorf("guest A's ping of guest B was not answered")
	}
	// The sleds are real: sled A's zones' namespaces and its VMM's, sled
	// B's VMM's, and a QEMU of each data dir.
	nss, links, err := zonenet.List(tag+"-", tag)
	if err != nil || len(nss) < 4 || len(links) == 0 {
		t.Errorf("the sleds' namespaces %v, links %v (%v): want sled A's three zones' and its VMM's", nss, links, err)
	}
	if nss, _, err := zonenet.List(tagB+"-", tagB); err != nil || len(nss) != 1 {
		t.Errorf("sled B's namespaces %v (%v): want its VMM's", nss, err)
	}
	for _, dir := range []string{dataDir, dataDirB} {
		if pids := processesOf(t, dir); len(pids) == 0 {
			t.Errorf("no process names the sled's data dir %s while it runs", dir)
		}
	}
	// Each sled's data path, as the banner says to see it: its guest's
	// port, both guests' mappings.
	for _, s := range []struct{ runDir, tag, underlay, ip string }{{runDir, tag, "fd00:1122:3344:101::1", "172.30.0.5"}, {runDirB, tagB, devSledBUnderlay, "172.30.0.6"}} {
		socket := filepath.Join(s.runDir, s.tag+"-vpcd.sock")
		if !strings.Contains(out.String(), "sudo ./sled-agent vpc --socket "+socket) {
			t.Errorf("the banner does not say how to see the data path at %s", socket)
		}
		vpc, vout := startBinary(t, "vpc", "--socket", socket)
		v2p := regexp.MustCompile(`(?s)\nv2p\n.*7777  172\.30\.0\.5 .* fd00:1122:3344:101::1\n.*7777  172\.30\.0\.6 .* ` + devSledBUnderlay + `\n`)
		if err := vpc.Wait(); err != nil || !containsAll(vout.String(), []string{"underlay " + s.underlay, s.ip + " in 172.30.0.0/22", "attached"}) || !v2p.MatchString(vout.String()) {
			t.Errorf("sled-agent vpc --socket %s: %v\n%s", socket, err, vout)
		}
	}

	// Ctrl-C.
	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dev.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev --runtime linux at SIGINT: %v; it said:\n%s", err, out)
		}
	case <-time.After(devTeardownWait + time.Minute):
		t.Fatalf("dev --runtime linux did not exit after SIGINT; it said:\n%s", out)
	}
	if !strings.Contains(out.String(), "removed everything the sleds made") {
		t.Errorf("dev did not say it removed everything; it said:\n%s", out)
	}
	t.Logf("at SIGINT:\n%s", out.String()[strings.Index(out.String(), "stopped"):])

	// Nothing left.
	if nss, links, err := zonenet.List(tag+"-", tag); err != nil || len(nss)+len(links) > 0 {
		t.Errorf("left: namespaces %v, links %v (%v)", nss, links, err)
	}
	if _, links, err := zonenet.List(tagB+"-", tagB); err != nil || len(links) > 0 {
		t.Errorf("left: sled B's links %v (%v)", links, err)
	}
	for _, l := range []string{tag + "ra", tag + "rb", tag + "ul"} {
		if _, err := os.Stat("/sys/class/net/" + l); err == nil {
			t.Errorf("left: the link %s (the reference NTP server's, or sled A's onto the rack)", l)
		}
	}
	for _, dir := range []string{dataDir, dataDirB, runDirB} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("left: %s", dir)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, top) {
			t.Errorf("left: a mount: %s", l)
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range loops {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), top) {
			t.Errorf("left: a loop device of %s", strings.TrimSpace(string(b)))
		}
	}
	if pids := processesOf(t, top); len(pids) > 0 {
		t.Errorf("left: processes %v", pids)
	}
	for _, tg := range []string{tag, tagB} {
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + tg)
		more, _ := filepath.Glob("/sys/fs/cgroup/*/*/" + tg)
		if left := append(cgroups, more...); len(left) > 0 {
			t.Errorf("left: cgroups %v", left)
		}
		if _, err := os.Stat(filepath.Join(agent.HostLockDir, "sled-agent-"+tg+".lock")); err == nil {
			t.Errorf("left: the host lock of tag %s", tg)
		}
	}
}

// waitForLines waits for dev's output to hold every one of want.
func waitForLines(t *testing.T, dev *exec.Cmd, out *syncbuf.Buffer, want []string) {
	t.Helper()
	deadline := time.Now().Add(devLinuxWait)
	for !containsAll(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("dev --runtime linux did not show %q within %s; it said:\n%s", want, devLinuxWait, out)
		}
		if dev.ProcessState != nil {
			t.Fatalf("dev --runtime linux exited: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// processesOf lists the processes (not this one) whose command line names
// a path under dir.
func processesOf(t *testing.T, dir string) []int {
	t.Helper()
	pids, err := processesWhere(func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, dir) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// A console's last lines are shown as text: OVMF's screen clearing and
// cursor moves go.
func TestLastLinesDropsTerminalControl(t *testing.T) {
	console := "\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: loading Boot0001\r\n\r\n" + testguest.ReadyPrefix + "a8:40:25:f0:00:01\r\n\x1b[0m"
	got := lastLines([]byte(console), 5)
	want := []string{"BdsDxe: loading Boot0001", testguest.ReadyPrefix + "a8:40:25:f0:00:01"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lastLines: %q, want %q", got, want)
	}
}
