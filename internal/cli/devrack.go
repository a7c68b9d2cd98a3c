package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// A Linux dev runs a small rack on one host: two sleds, each with its VPC
// data path, whose underlay links meet on a bridge in a network namespace
// of the rack's own (<tag>-rack, bridge br0, MTU 9000), as a rack's sleds
// meet at its switches.
//
// Sled A is dev's own process, in this host's network namespace, as a
// Linux dev sled always was: dev follows its reconciler to print its zones
// converging, its neighbours (DDM, DNS, the switches and Nexus, simulated)
// and the reference NTP server are on this host's loopback and links, and
// the operator commands reach it at [::1]:12345 with no flag. Its link onto
// the rack, <tag>ul, holds its underlay address (a /128) and the route to
// sled B's /64 through sled B's address.
//
// Sled B is a child process, `sled-agent run --netns <tag>-b`, in a
// namespace of its own that plays its host. It cannot be a second agent in
// dev's process: a sled's namespace is its whole process's (internal/sledns
// re-executes the binary from a thread that entered it, so that every
// thread lives there), and moving dev's process would take sled A and its
// neighbours with it. Sled B has its own tag (<tag>-b, which names its
// namespaces <tag>-b-…), data and run dirs (dev's with -b), and underlay
// address (devSledBUnderlay, its link ul0 on the rack's bridge, the rack's
// /48 routed on it); its API listens there, reached from this host across
// the bridge. It runs no sled config's zones and has no neighbours but
// sled A: it hosts guest B and its data path, its time sync is not checked
// (--skip-timesync), and no Nexus is told of its VMM. Its namespace
// forwards IPv6, so that this host reaches guest B's VMM service (its
// console) in sled B's /64.
//
// Nothing of it outlives dev: sled B's agent is stopped, then torn down
// (`sled-agent teardown --netns`, as it must be: its zones' host ends are
// in its namespace), and the namespaces go, with every link in them and
// sled A's link onto the rack. A dev that was killed leaves them; the next
// one clears them first.

const (
	// devSledBUnderlay is sled B's underlay address. Its /64 holds its
	// VMMs' addresses, as a rack's sled's does; sled A's is the file-backed
	// example's, fd00:1122:3344:101::1.
	devSledBUnderlay = "fd00:1122:3344:102::1"
	// devSledBListen is where sled B's agent serves its API.
	devSledBListen = "[" + devSledBUnderlay + "]:12345"
	// devRackUnderlay is the rack's underlay, routed on sled B's link.
	devRackUnderlay = "fd00:1122:3344::/48"
	// devRackMTU is the underlay links' MTU, a rack's: Geneve adds its
	// headers to the guests' 1500-byte frames.
	devRackMTU = "9000"
	// devSledBWait bounds sled B's start, to its data path answering (a
	// hang detector, not a timing).
	devSledBWait = 3 * time.Minute
	// devStopWait bounds sled B's agent's stop at SIGTERM before it is
	// killed.
	devStopWait = 30 * time.Second
)

// devRack is the rack of a Linux dev: sled B, the rack's namespace and
// sled A's link onto it.
type devRack struct {
	progress io.Writer
	log      *slog.Logger
	// bin is the sled-agent binary that runs sled B's agent and its
	// teardown (this one).
	bin, logLevel string
	// a is sled A's config (dev's own agent), b sled B's.
	a, b agent.Config
	// ns is the rack's namespace, link sled A's end on its bridge.
	ns, link string
	// imageB is guest B's disk, in sled B's image dir.
	imageB string
	// agentB is sled B's agent while it runs; exited gets its end.
	agentB *exec.Cmd
	exited chan error
}

// newDevRack names the rack of sled A's config a: its parts are named from
// a's tag, data dir and run dir, so that a later dev finds what a killed
// one left.
func newDevRack(a agent.Config, logLevel string, progress io.Writer, log *slog.Logger) (*devRack, error) {
	tag := a.ZoneTag
	r := &devRack{progress: progress, log: log, logLevel: logLevel, a: a, ns: tag + "-rack", link: tag + "ul"}
	if len(r.link) > 15 || len(tag)+2 > 20 {
		return nil, fmt.Errorf("--zone-tag %q: dev's rack names its link %s and its second sled's tag %s-b; want a tag of at most 13 bytes", tag, r.link, tag)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this binary, which runs the second sled: %w", err)
	}
	r.bin = exe
	tb := tag + "-b"
	r.b = agent.Config{Runtime: "linux", Netns: tb, ZoneTag: tb, NetnsPrefix: tb + "-",
		DataDir: filepath.Clean(a.DataDir) + "-b", RunDir: filepath.Clean(a.RunDir) + "-b",
		UnderlayIP: devSledBUnderlay, Listen: devSledBListen, VMMAccel: a.VMMAccel}
	r.b.VdevDir = filepath.Join(r.b.DataDir, "vdev")
	r.b.VMMImageDir = filepath.Join(r.b.DataDir, "images")
	r.imageB = filepath.Join(r.b.VMMImageDir, devGuestImage)
	return r, nil
}

// clearLeftovers removes what a killed dev's rack left: sled B's agent, if
// it still runs, sled B's parts (a teardown) and dirs, the namespaces and
// sled A's link. A live dev of the tag is never touched: the host lock of
// sled A's tag, which its agent holds, is taken first.
func (r *devRack) clearLeftovers(ctx context.Context) error {
	lock, err := agent.LockHost(r.a.ZoneTag, r.a.DataDir)
	if err != nil {
		return fmt.Errorf("another dev of tag %s runs: %w", r.a.ZoneTag, err)
	}
	defer lock.Close()
	if !emptyOrAbsent(r.b.DataDir) {
		if _, err := os.Stat(filepath.Join(r.b.DataDir, devMark)); err != nil {
			return fmt.Errorf("the second sled's data dir %s is not empty and is no dev sled's (no %s in it): give dev another --data-dir", r.b.DataDir, devMark)
		}
		fmt.Fprintf(r.progress, "dev: %s is there: an earlier dev's second sled did not stop cleanly; removing what it left\n", r.b.DataDir)
		if err := r.stopLeftoverAgents(ctx); err != nil {
			return err
		}
		if err := r.teardownB(ctx); err != nil {
			return fmt.Errorf("clearing the earlier dev's second sled: %w", err)
		}
	}
	return r.removeParts(ctx, false)
}

// make makes the rack: its namespace and bridge, sled B's namespace and
// link, sled A's link; then sled B's dirs and guest image (a copy of
// image), and starts sled B's agent. On error the caller closes the rack.
func (r *devRack) make(ctx context.Context, image string) error {
	b, a := r.b.Netns, r.a.UnderlayIP
	subnetB := sledconfig.SledSubnet(netip.MustParseAddr(devSledBUnderlay)).String()
	steps := [][]string{
		{"netns", "add", r.ns},
		// No multicast snooping: neighbour discovery's solicitations reach
		// every port, as on a switch that does not snoop MLD.
		{"-n", r.ns, "link", "add", "br0", "mtu", devRackMTU, "type", "bridge", "mcast_snooping", "0"},
		{"-n", r.ns, "link", "set", "dev", "br0", "up"},
		{"netns", "add", b},
		{"-n", b, "link", "set", "dev", "lo", "up"},
		{"link", "add", "ul0", "netns", b, "type", "veth", "peer", "name", "sledb", "netns", r.ns},
		{"-n", r.ns, "link", "set", "dev", "sledb", "mtu", devRackMTU, "master", "br0", "up"},
		{"-n", b, "link", "set", "dev", "ul0", "mtu", devRackMTU, "up"},
		{"-n", b, "addr", "add", devSledBUnderlay + "/64", "dev", "ul0", "nodad"},
		{"-n", b, "route", "add", devRackUnderlay, "dev", "ul0"},
		{"link", "add", r.link, "mtu", devRackMTU, "type", "veth", "peer", "name", "sleda", "netns", r.ns},
		{"-n", r.ns, "link", "set", "dev", "sleda", "mtu", devRackMTU, "master", "br0", "up"},
		{"link", "set", "dev", r.link, "up"},
		{"addr", "add", a + "/128", "dev", r.link, "nodad"},
		{"route", "add", devSledBUnderlay + "/128", "dev", r.link},
		{"route", "add", subnetB, "via", devSledBUnderlay, "dev", r.link},
	}
	fmt.Fprintf(r.progress, "dev: making the rack: bridge br0 in namespace %s; sled A (this host, %s) on it by link %s; sled B (%s) in namespace %s on it by ul0\n", r.ns, a, r.link, devSledBUnderlay, b)
	for _, s := range steps {
		if err := runIP(ctx, s...); err != nil {
			return err
		}
	}
	// This host reaches sled B's VMMs through sled B's host: it forwards.
	if err := zonenet.RunInPath(zonenet.NetnsPath(b), func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("letting sled B's namespace forward IPv6: %w", err)
	}
	for _, dir := range []string{r.b.DataDir, r.b.VdevDir, r.b.VMMImageDir, r.b.RunDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(r.b.DataDir, devMark), []byte("the data dir of sled-agent dev --runtime linux's second sled, removed when it stops\n"), 0o600); err != nil {
		return err
	}
	if err := testguest.CopyTo(r.imageB, image); err != nil {
		return fmt.Errorf("copying the test guest's image for sled B: %w", err)
	}
	return r.startB()
}

// runIP runs ip(8) with args, under a deadline.
func runIP(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// flagsB are the flags that name sled B's places, for run and teardown.
func (r *devRack) flagsB() []string {
	return []string{"--runtime", "linux", "--zone-tag", r.b.ZoneTag, "--netns-prefix", r.b.NetnsPrefix,
		"--data-dir", r.b.DataDir, "--run-dir", r.b.RunDir, "--vdev-dir", r.b.VdevDir}
}

// startB starts sled B's agent. It is told to stop (SIGTERM) if dev's
// process ends without stopping it (killed): its parts are then the next
// dev's to clear.
func (r *devRack) startB() error {
	args := append([]string{"run", "--netns", r.b.Netns, "--listen", r.b.Listen, "--underlay-ip", r.b.UnderlayIP,
		"--ddm-url=", "--skip-timesync", "--vpc-data-path", "--vmm-image-dir", r.b.VMMImageDir, "--log-level", r.logLevel}, r.flagsB()...)
	if r.a.VMMAccel != "" {
		args = append(args, "--vmm-accel", r.a.VMMAccel)
	}
	if r.a.VMMQEMUIDs != "" {
		args = append(args, "--vmm-qemu-ids", r.a.VMMQEMUIDs)
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Stdout, cmd.Stderr = r.progress, r.progress
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	r.exited = make(chan error, 1)
	go func() {
		// The parent-death signal follows the thread that started the
		// child, not the process: this one is kept until the child ends.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		r.exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting sled B's agent: %w", err)
	}
	r.agentB = cmd
	fmt.Fprintf(r.progress, "dev: started sled B's agent (pid %d): %s %s\n", cmd.Process.Pid, filepath.Base(r.bin), strings.Join(args, " "))
	return nil
}

// clientB is a client of sled B's API.
func (r *devRack) clientB() *client.Client {
	c, err := client.New("http://" + r.b.Listen)
	if err != nil {
		panic(err) // a constant address
	}
	return c
}

// waitSleds waits for sled B's agent to answer and for both sleds' data
// paths (Nexus's pushes before a data path answers are refused).
func (r *devRack) waitSleds(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, devSledBWait)
	defer cancel()
	cb := r.clientB()
	for _, s := range []struct {
		what  string
		ready func(context.Context) error
	}{
		{"sled B's agent", func(ctx context.Context) error { _, err := cb.AgentInventory(ctx); return err }},
		{"sled A's data path", func(ctx context.Context) error { _, err := vpcd.NewClient(agent.VPCSocket(r.a)).Boot(ctx); return err }},
		{"sled B's data path", func(ctx context.Context) error { _, err := vpcd.NewClient(agent.VPCSocket(r.b)).Boot(ctx); return err }},
	} {
		for {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.ready(cctx)
			ccancel()
			if err == nil {
				break
			}
			select {
			case err := <-r.exited:
				r.exited <- err
				return fmt.Errorf("sled B's agent exited: %v", err)
			case <-ctx.Done():
				return fmt.Errorf("%s did not answer within %s: %w", s.what, devSledBWait, err)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// close stops sled B's agent, tears sled B down and removes the rack's
// namespaces and links and sled B's run dir, and its data dir unless keep.
func (r *devRack) close(ctx context.Context, keep bool) error {
	if r.agentB != nil {
		r.agentB.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(devStopWait):
			fmt.Fprintf(r.progress, "dev: sled B's agent did not stop within %s of SIGTERM; killing it\n", devStopWait)
			r.agentB.Process.Kill()
			<-r.exited
		}
		r.agentB = nil
	}
	// Another process's sled B (a live dev's) is never taken apart.
	lock, err := agent.LockHost(r.b.ZoneTag, r.b.DataDir)
	if err != nil {
		return fmt.Errorf("sled B: %w", err)
	}
	lock.Close()
	if !emptyOrAbsent(r.b.DataDir) {
		err = r.teardownB(ctx)
	}
	err = errors.Join(err, r.removeParts(ctx, keep))
	if err == nil {
		// Nothing of the tag is left to lock.
		err = agent.RemoveHostLock(r.b.ZoneTag)
	}
	return err
}

// teardownB is `sled-agent teardown` of sled B, in its namespace when it
// is there (its zones' host ends are in it; without it, they went with
// it), then the release of whatever is still mounted or attached under its
// data dir, and its host lock.
func (r *devRack) teardownB(ctx context.Context) error {
	args := append([]string{"teardown", "--yes"}, r.flagsB()...)
	if zonenet.NetnsExists(r.b.Netns) {
		args = append(args, "--netns", r.b.Netns)
	}
	tctx, cancel := context.WithTimeout(ctx, devTeardownWait)
	defer cancel()
	cmd := exec.CommandContext(tctx, r.bin, args...)
	out, err := cmd.CombinedOutput()
	removed := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		switch l := strings.TrimSpace(sc.Text()); {
		case strings.HasPrefix(l, "left "):
			fmt.Fprintln(r.progress, "dev: sled B:", l)
		case strings.HasPrefix(l, "removed "):
			removed++
		}
	}
	if err != nil {
		return fmt.Errorf("sled-agent teardown of sled B: %w: %s", err, bytes.TrimSpace(out))
	}
	fmt.Fprintf(r.progress, "dev: sled B: removed %d parts (zones, the data path's service, leftovers, the run dir)\n", removed)
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := btrfs.ReleaseUnder(rctx, r.b.DataDir); err != nil {
		return err
	}
	return agent.RemoveHostLock(r.b.ZoneTag)
}

// removeParts removes the namespaces (with every link in them, and their
// peers: sled A's link), sled A's link if it is still there, and sled B's
// run dir and, unless keep, its data dir.
func (r *devRack) removeParts(ctx context.Context, keep bool) error {
	var errs []error
	for _, ns := range []string{r.b.Netns, r.ns} {
		if zonenet.NetnsExists(ns) {
			errs = append(errs, zonenet.RemoveNetns(ns))
		}
	}
	if _, err := os.Stat("/sys/class/net/" + r.link); err == nil {
		errs = append(errs, runIP(ctx, "link", "del", "dev", r.link))
	}
	errs = append(errs, os.RemoveAll(r.b.RunDir))
	if !keep {
		errs = append(errs, os.RemoveAll(r.b.DataDir))
	}
	return errors.Join(errs...)
}

// stopLeftoverAgents stops a killed dev's sled B agent that still runs (its
// parent-death SIGTERM may be under way): SIGTERM, then SIGKILL if it does
// not end within devStopWait.
func (r *devRack) stopLeftoverAgents(ctx context.Context) error {
	pids := agentsOf(r.b.DataDir)
	if len(pids) == 0 {
		return nil
	}
	fmt.Fprintf(r.progress, "dev: the earlier dev's second sled's agent still runs (pids %v); stopping it\n", pids)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for _, p := range pids {
			syscall.Kill(p, sig)
		}
		deadline := time.Now().Add(devStopWait)
		for pids = agentsOf(r.b.DataDir); len(pids) > 0 && time.Now().Before(deadline); pids = agentsOf(r.b.DataDir) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		if len(pids) == 0 {
			return nil
		}
	}
	return fmt.Errorf("the earlier dev's second sled's agent (pids %v) does not end", pids)
}

// agentsOf lists the processes that run `sled-agent run` with --data-dir
// dir.
func agentsOf(dir string) []int {
	pids, _ := processesWhere(func(args []string) bool {
		i := slices.Index(args, "--data-dir")
		return len(args) > 1 && args[1] == "run" && i >= 0 && i+1 < len(args) && args[i+1] == dir
	})
	return pids
}

// processesWhere lists the processes (not this one) whose command line,
// its arguments, match says yes to; a process gone meanwhile is not.
func processesWhere(match func(args []string) bool) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if match(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
