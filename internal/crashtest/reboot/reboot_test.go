package reboot_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/crashtest/reboot"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
)

// sled is what a host's agent left on this machine: a zone's namespace
// with its links and a process born in it, a process in the zone's cgroup
// and one in its guest's, a file in the run dir, an NTP socket dir, a mount
// under the pool root and a loop device of a vdev file.
type sled struct {
	host   reboot.Host
	ns     string
	zoneID string
	procs  map[string]*exec.Cmd
	exited map[string]chan struct{}
	vdev   string
	loop   string
	sock   string
}

func makeSled(t *testing.T, underlay string) *sled {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	tag := "rb" + hex.EncodeToString(b[:])
	dir := t.TempDir()
	s := &sled{
		host: reboot.Host{Tag: tag, NetnsPrefix: tag + "-", RunDir: filepath.Join(dir, "run"),
			PoolRoot: filepath.Join(dir, "storage"), VdevDir: filepath.Join(dir, "vdev")},
		zoneID: uuid.NewString(),
		procs:  map[string]*exec.Cmd{},
		exited: map[string]chan struct{}{},
	}
	// Whatever the test leaves is taken down as a reboot would.
	t.Cleanup(func() {
		if _, err := reboot.Reboot(context.Background(), s.host); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	zone := "oxz_crucible_" + s.zoneID
	s.ns = s.host.NetnsPrefix + zone
	if err := zonenet.Ensure(t.Context(), zonenet.Config{Netns: s.ns, Tag: tag, ZoneID: s.zoneID, Underlay: netip.MustParseAddr(underlay)}); err != nil {
		t.Fatal(err)
	}
	s.start(t, "in the namespace", func(cmd *exec.Cmd) error { return zonenet.StartIn(s.ns, cmd) })
	h := guestcg.Detect()
	if h.V2 == "" {
		t.Skip("needs a cgroup v2 file system")
	}
	zoneCg := filepath.Join(h.V2, "sled-agent", tag, zone)
	guestCg := filepath.Join(h.V2, guestcg.Name(tag, zone))
	for what, cg := range map[string]string{"in the zone's cgroup": zoneCg, "in the guest's cgroup": guestCg} {
		if err := os.MkdirAll(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		s.start(t, what, func(cmd *exec.Cmd) error {
			if err := cmd.Start(); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0)
		})
	}
	if err := os.MkdirAll(filepath.Join(s.host.RunDir, tag, zone), 0o700); err != nil {
		t.Fatal(err)
	}
	s.sock = chrony.SocketDir(tag, s.zoneID)
	if err := os.MkdirAll(s.sock, 0o700); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(s.host.PoolRoot, "ext", uuid.NewString())
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.MakeVdevs(s.host.VdevDir, tag); err != nil {
		t.Fatal(err)
	}
	s.vdev = filepath.Join(s.host.VdevDir, "u2_"+tag+".vdev")
	out, err := exec.Command("losetup", "--find", "--show", s.vdev).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	s.loop = strings.TrimSpace(string(out))
	return s
}

// start starts a long sleep as what, and reaps it when it dies.
func (s *sled) start(t *testing.T, what string, start func(*exec.Cmd) error) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := start(cmd); err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		t.Fatalf("starting a process %s: %v", what, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	s.procs[what], s.exited[what] = cmd, done
}

// alive reports what of the sled is still there, by what it is.
func (s *sled) alive(t *testing.T) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for what, done := range s.exited {
		select {
		case <-done:
		case <-time.After(2 * time.Second): // a process killed is reaped well within that
			got["process "+what] = true
		}
	}
	nss, links, err := zonenet.List(s.host.NetnsPrefix, s.host.Tag)
	if err != nil {
		t.Fatal(err)
	}
	got["namespace"], got["links"] = len(nss) > 0, len(links) > 0
	_, err = os.Stat(filepath.Join(guestcg.Detect().V2, "sled-agent", s.host.Tag))
	got["cgroups"] = err == nil
	ents, _ := os.ReadDir(s.host.RunDir)
	got["run dir entries"] = len(ents) > 0
	_, err = os.Stat(s.sock)
	got["NTP socket dir"] = err == nil
	got["mounts"] = len(btrfs.Mounts(s.host.PoolRoot)) > 0
	got["loop device"] = len(btrfs.LoopsBackedBy(s.host.VdevDir)) > 0
	_, err = os.Stat(s.vdev)
	got["vdev file"] = err == nil
	return got
}

// A reboot takes away everything of its host's but the vdev files, and
// nothing of another host's (another tag and prefix) on the same machine.
func TestRebootTakesDownOneHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes namespaces, links, cgroups, mounts and loop devices")
	}
	for _, tool := range []string{"losetup", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	// A /64 no other test uses.
	ours, other := makeSled(t, "fd00:1122:3344:1d8::5"), makeSled(t, "fd00:1122:3344:1d8::6")
	everything := ours.alive(t)
	for what, there := range everything {
		if !there {
			t.Fatalf("before the reboot, no %s", what)
		}
	}
	done, err := reboot.Reboot(t.Context(), ours.host)
	t.Logf("rebooted: %v", done)
	if err != nil {
		t.Fatal(err)
	}
	for what, there := range ours.alive(t) {
		if want := what == "vdev file"; there != want {
			t.Errorf("after the reboot, %s there: %v, want %v", what, there, want)
		}
	}
	for what, there := range other.alive(t) {
		if !there {
			t.Errorf("the other host's %s went with the reboot", what)
		}
	}
}

// A reboot refuses a host that does not name objects of its own.
func TestRebootRefusesHostsNotOfOnesOwn(t *testing.T) {
	good := reboot.Host{Tag: "rbtest", NetnsPrefix: "rbtest-", RunDir: "/nonexistent/run", PoolRoot: "/nonexistent/storage", VdevDir: "/nonexistent/vdev"}
	for name, mutate := range map[string]func(*reboot.Host){
		"default tag":   func(h *reboot.Host) { h.Tag = "sled-agent" },
		"no tag":        func(h *reboot.Host) { h.Tag = "" },
		"no prefix":     func(h *reboot.Host) { h.NetnsPrefix = "" },
		"prefix o":      func(h *reboot.Host) { h.NetnsPrefix = "o" },
		"prefix oxz_":   func(h *reboot.Host) { h.NetnsPrefix = "oxz_crucible" },
		"root run dir":  func(h *reboot.Host) { h.RunDir = "/" },
		"relative pool": func(h *reboot.Host) { h.PoolRoot = "storage" },
		"no vdev dir":   func(h *reboot.Host) { h.VdevDir = "" },
	} {
		h := good
		mutate(&h)
		if _, err := reboot.Reboot(t.Context(), h); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
