package qemuvm

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// probeEnv carries what the fake QEMU tries (probes) before it serves QMP.
const probeEnv = "QEMUVM_TEST_PROBE"

// probes are what a guest escaped into QEMU would try.
type probes struct {
	Dial  []target // connections to open
	Read  []string // files to read
	Write []string // directories to make a file in (named File)
	Stat  []string // paths to look at
	File  string   // the name of the file written
}

type target struct{ Name, Network, Addr string }

// probe runs the probes p (JSON) and writes each result on a line of its
// own to stderr, which the test reads as QEMU's output:
// "PROBE <what> <subject>: <result>".
func probe(p string) {
	var pr probes
	if err := json.Unmarshal([]byte(p), &pr); err != nil {
		fmt.Fprintf(os.Stderr, "PROBE bad: %v\n", err)
		return
	}
	say := func(what, subject, result string) { fmt.Fprintf(os.Stderr, "PROBE %s %s: %s\n", what, subject, result) }
	for _, d := range pr.Dial {
		c, err := net.DialTimeout(d.Network, d.Addr, 2*time.Second)
		if err == nil {
			c.Close()
			say("dial", d.Name, "reached")
		} else {
			say("dial", d.Name, "not reached: "+err.Error())
		}
	}
	for _, f := range pr.Read {
		if _, err := os.ReadFile(f); err == nil {
			say("read", f, "read")
		} else {
			say("read", f, "not read: "+err.Error())
		}
	}
	for _, d := range pr.Write {
		if err := os.WriteFile(filepath.Join(d, pr.File), []byte("x"), 0o644); err == nil {
			say("write", d, "written")
		} else {
			say("write", d, "not written: "+err.Error())
		}
	}
	for _, s := range pr.Stat {
		if _, err := os.Lstat(s); err == nil {
			say("stat", s, "seen")
		} else {
			say("stat", s, "not seen: "+err.Error())
		}
	}
	ents, _ := os.ReadDir("/")
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	say("list", "/", strings.Join(names, " "))
	ifs, err := net.Interfaces()
	var links []string
	for _, i := range ifs {
		links = append(links, i.Name+"("+i.Flags.String()+")")
	}
	say("links", "", fmt.Sprint(strings.Join(links, " "), " ", err))
}

// listen serves connections on ln (closing each at once) until the test
// ends, and returns its address.
func listen(t *testing.T, ln net.Listener) string {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// A guest that escapes into QEMU reaches nothing: QEMU, started as the
// VMM service starts it (its ids, its cgroup, its zone's namespace; the
// test binary in QEMU's place), can connect neither to the agent (a
// listener on the host's loopback) nor to anything of its zone (its
// loopback, an address of the zone standing in for another VMM's service,
// an abstract unix socket), read no file outside what it is shown, write
// nothing of the host's, and has a /tmp and /dev/shm of its own. And each
// of the zone's listeners is reached from the zone: the probes can tell.
func TestQEMUReachesNothing(t *testing.T) {
	var b [4]byte
	rand.Read(b[:])
	file := "qemuvm-probe-" + hex.EncodeToString(b[:])
	g, c := newConfinedGuest(t, nil, func(o *Options) { o.Binary = fakeBinary(t) })

	// The agent: a listener on the host's loopback.
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dial := []target{{"agent", "tcp", listen(t, hostLn)}}
	// The zone: its loopback up, an underlay-like address, an abstract
	// unix socket.
	const vmmAddr = "fd9e:26a3:1c00::7"
	err = zonenet.RunIn(g.netns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		// On its loopback: the zone reaches it as it reaches its
		// underlay address.
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(vmmAddr), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		for _, l := range []struct{ name, network, addr string }{
			{"zone-loopback", "tcp", "127.0.0.1:0"},
			{"another-vmm", "tcp", "[" + vmmAddr + "]:0"},
			{"abstract-unix", "unix", "@" + file},
		} {
			ln, err := net.Listen(l.network, l.addr)
			if err != nil {
				return err
			}
			dial = append(dial, target{l.name, l.network, listen(t, ln)})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The zone's own listeners answer in the zone (once the kernel has
	// routed the new address: moments after the loopback is up).
	for _, d := range dial[1:] {
		deadline := time.Now().Add(10 * time.Second)
		for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
			err := zonenet.RunIn(g.netns, func() error {
				c, err := net.DialTimeout(d.Network, d.Addr, 2*time.Second)
				if err == nil {
					c.Close()
				}
				return err
			})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s at %s not reached from the zone: %v", d.Name, d.Addr, err)
			}
			time.Sleep(delay)
		}
	}

	// A file anyone may read, outside the VM's directory.
	secretDir, err := os.MkdirTemp("", "qemuvm-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(secretDir) })
	secret := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(secretDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Whatever the probe writes, should it reach the host's /tmp.
	t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), file)) })
	pr, _ := json.Marshal(probes{
		Dial:  dial,
		Read:  []string{secret, "/etc/passwd", "/proc/self/status"},
		Write: []string{"/tmp", "/dev/shm", "/", "/usr/lib"},
		Stat:  []string{g.vm.opts.Dir, filepath.Dir(g.disk), "/proc/self", "/sys/fs/cgroup", "/etc/passwd", "/home", "/usr/bin/sh", "/dev/null"},
		File:  file,
	})
	t.Setenv(probeEnv, string(pr))

	g.ensureAndRun(t, false)
	pid := g.pid()
	out := g.vm.proc.Stderr()
	t.Logf("QEMU %d said:\n%s", pid, out)
	results := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(l, "PROBE "), ": "); ok && strings.HasPrefix(l, "PROBE ") {
			results[k] = v
		}
	}
	want := func(key, prefix string) {
		t.Helper()
		if got, ok := results[key]; !ok || !strings.HasPrefix(got, prefix) {
			t.Errorf("%s: %q, want %s", key, got, prefix)
		}
	}
	for _, d := range dial {
		want("dial "+d.Name, "not reached")
	}
	want("read "+secret, "not read")
	want("read /etc/passwd", "not read")
	want("read /proc/self/status", "not read")
	want("write /tmp", "written")
	want("write /dev/shm", "written")
	want("write /", "not written")
	want("write /usr/lib", "not written")
	for _, p := range []string{g.vm.opts.Dir, filepath.Dir(g.disk), "/proc/self", "/sys/fs/cgroup", "/etc/passwd", "/home", "/usr/bin/sh"} {
		want("stat "+p, "not seen")
	}
	want("stat /dev/null", "seen")
	if l := results["links "]; !strings.HasPrefix(l, "lo(loopback) ") {
		t.Errorf("QEMU's links: %q, want its loopback alone, down", l)
	}
	// Its /tmp is its own: the file it wrote there is not the host's.
	if _, err := os.Stat(filepath.Join(os.TempDir(), file)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("QEMU's file in /tmp is in the host's: %v", err)
	}

	// Its namespaces are neither the host's nor the zone's.
	zoneNet := nsID(t, zonenet.NetnsPath(g.netns))
	for _, ns := range []string{"net", "mnt", "ipc"} {
		mine := nsID(t, fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if mine == nsID(t, "/proc/self/ns/"+ns) || ns == "net" && mine == zoneNet {
			t.Errorf("QEMU's %s namespace is the host's or its zone's", ns)
		}
	}
	// It runs as its own user, with no capabilities, in its cgroup with
	// a limit on its tasks.
	for _, field := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"} {
		if got := procStatus(t, pid, field); got != "0000000000000000" {
			t.Errorf("QEMU's %s %s, want none", field, got)
		}
	}
	if got := procStatus(t, pid, "NoNewPrivs"); got != "1" {
		t.Errorf("NoNewPrivs %s, want 1", got)
	}
	if uid := strings.Fields(procStatus(t, pid, "Uid"))[0]; uid == "0" {
		t.Errorf("QEMU runs as root")
	}
	var tasks []string
	for _, d := range c.dirs() {
		if _, err := os.Stat(filepath.Join(d, "pids.max")); err != nil {
			continue
		}
		tasks = append(tasks, d)
		if got, want := readTrim(t, filepath.Join(d, "pids.max")), strconv.FormatInt(c.limits.Pids, 10); got != want {
			t.Errorf("%s/pids.max = %s, want %s", d, got, want)
		}
		if procs := strings.Fields(readTrim(t, filepath.Join(d, "cgroup.procs"))); !slices.Equal(procs, []string{strconv.Itoa(pid)}) {
			t.Errorf("%s holds %v, want QEMU (%d)", d, procs, pid)
		}
	}
	if len(tasks) != 1 {
		t.Errorf("pids.max in %v: want it in one place", tasks)
	}
	// The shut-in start's descriptors are QEMU's alone: 0, 1, 2 and
	// what it was handed (the fake adds its own).
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		t.Logf("QEMU holds %d descriptors", len(ents))
	}
}

// fakeBinary is a copy of the test binary (the fake QEMU) that any user
// may run, as QEMU's binary is: the go tool's build directory is root's
// alone.
func fakeBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qemuvm-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// nsID is the identity of the namespace file path.
func nsID(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}
