package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// The outside check of several sleds on one host: two agents, each run
// with --netns in a namespace of its own that plays its host, with the same
// listen address, the same underlay address and a zone of the same id and
// address, each under its own tag. Both zones run; each agent and its
// zone's host end live in its own namespace, not the host's; a teardown of
// one sled, run with its --netns, removes its zone and leaves the other's
// running.
func TestTwoSledsInNamespacesOnOneHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces and runs the agent with the linux runtime")
	}
	for _, bin := range []string{"runsv", "mkfs.btrfs", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (scripts/setup installs it)", bin)
		}
	}
	b := make([]byte, 3)
	rand.Read(b)
	base := "zt" + hex.EncodeToString(b)
	const underlay = "fd00:1122:3344:1fa::1"
	z := sledconfigtest.Crucible(0x76)
	z.ZoneType.Address = "[fd00:1122:3344:1fa::76]:32345"

	type sled struct {
		ns, tag, dataDir, runDir string
		agent                    *exec.Cmd
		zone                     string // its zone's namespace: its prefix and the zone's name
		svc                      string // its zone's service directory
	}
	sleds := []*sled{{tag: base + "a"}, {tag: base + "b"}}
	for _, s := range sleds {
		s.ns, s.dataDir, s.runDir = s.tag+"-host", t.TempDir(), t.TempDir()
		name := sledconfigtest.OwnPools(s.tag, z)[0].Name()
		s.zone, s.svc = s.tag+"-"+name, filepath.Join(s.runDir, s.tag, name)
		ip(t, "netns", "add", s.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", s.ns).Run() })
		ip(t, "-n", s.ns, "link", "set", "lo", "up")
	}
	flags := func(s *sled) []string {
		return []string{"--runtime", "linux", "--netns", s.ns, "--zone-tag", s.tag, "--netns-prefix", s.tag + "-",
			"--data-dir", s.dataDir, "--run-dir", s.runDir, "--vdev-dir", filepath.Join(s.dataDir, "vdev")}
	}
	// Registered before the agents start, so run after they stopped.
	t.Cleanup(func() {
		for _, s := range sleds {
			if cmd, out := startBinary(t, append([]string{"teardown", "--yes"}, flags(s)...)...); cmd.Wait() != nil {
				t.Errorf("cleanup: teardown of %s: %s", s.tag, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := btrfs.ReleaseUnder(ctx, s.dataDir); err != nil {
				t.Errorf("cleanup: %v", err)
			}
			cancel()
			if err := agent.RemoveHostLock(s.tag); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})

	for _, s := range sleds {
		zs := sledconfigtest.OwnPools(s.tag, z)
		if err := btrfs.MakeVdevs(filepath.Join(s.dataDir, "vdev"), sledconfigtest.VdevNames(s.tag+"-", zs...)...); err != nil {
			t.Fatal(err)
		}
		doc, err := json.Marshal(sledconfigtest.ConfigOnVdevs(1, s.tag+"-", zs...))
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(file, doc, 0o600); err != nil {
			t.Fatal(err)
		}
		var out interface{ String() string }
		s.agent, out = startBinary(t, append([]string{"run", "--listen", "[::1]:12345", "--underlay-ip", underlay, "--ddm-url", "", "--skip-timesync"}, flags(s)...)...)
		// The operator commands reach it from inside its namespace.
		svc := s.svc
		deadline := time.Now().Add(waitDeadline)
		for {
			put := exec.Command("ip", "netns", "exec", s.ns, exe(t), "config", "put", file, "--url", "http://[::1]:12345")
			put.Env = append(os.Environ(), runAgentEnv+"=1")
			putOut, err := put.CombinedOutput()
			if st, serr := supervise.Status(svc); err == nil && serr == nil && st.Up {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sled %s: its zone did not come up: %v %s\n%s", s.tag, err, putOut, out)
			}
			time.Sleep(waitInterval)
		}
	}

	for i, s := range sleds {
		other := sleds[1-i]
		if !zonenet.NetnsExists(s.zone) {
			t.Errorf("sled %s: no zone namespace %s", s.tag, s.zone)
		}
		if got, want := nsInode(t, "/proc/"+strconv.Itoa(s.agent.Process.Pid)+"/ns/net"), nsInode(t, "/run/netns/"+s.ns); got != want {
			t.Errorf("sled %s: its agent is not in %s", s.tag, s.ns)
		}
		link, _ := zonenet.LinkNames(s.tag, z.ID)
		if !hasLink(t, s.ns, link) {
			t.Errorf("sled %s: its zone's host end %s is not in %s", s.tag, link, s.ns)
		}
		if hasLink(t, "", link) || hasLink(t, other.ns, link) {
			t.Errorf("sled %s: its zone's host end %s is outside its namespace", s.tag, link)
		}
	}

	// A teardown of the first sled, from its namespace, leaves the second's.
	a, bSled := sleds[0], sleds[1]
	a.agent.Process.Signal(unix.SIGTERM)
	a.agent.Wait()
	if cmd, out := startBinary(t, append([]string{"teardown", "--yes"}, flags(a)...)...); cmd.Wait() != nil {
		t.Fatalf("teardown of %s: %s", a.tag, out)
	}
	if zonenet.NetnsExists(a.zone) {
		t.Errorf("the teardown of %s left its zone's namespace", a.tag)
	}
	if st, err := supervise.Status(bSled.svc); err != nil || !st.Up || !zonenet.NetnsExists(bSled.zone) {
		t.Errorf("the teardown of %s touched %s's zone: %+v %v", a.tag, bSled.tag, st, err)
	}
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func exe(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// hasLink reports whether the network namespace ns ("" for this process's)
// has a link called name.
func hasLink(t *testing.T, ns, name string) bool {
	t.Helper()
	h := &netlink.Handle{}
	if ns != "" {
		nh, err := netns.GetFromName(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer nh.Close()
		if h, err = netlink.NewHandleAt(nh); err != nil {
			t.Fatal(err)
		}
		defer h.Close()
	}
	_, err := h.LinkByName(name)
	return err == nil
}
