package bench

// The zone benchmark: how much the Linux runtime (internal/runtime/linux)
// adds to the cost of the bare primitives a zone is made of. The floor does,
// for each zone, only what a zone must have: a named network namespace, a
// veth pair with its addresses and routes (netlink calls, no checks of what
// exists), and one service process with no supervisor, born in the
// namespace as the runtime's supervisor is (zonenet.StartIn), polled with
// the runtime's health check on its schedule (zoneservice.Poller). The
// runtime does the same through Ensure and Destroy. Both run N zones at
// once, as the reconciler does, alternately over a few rounds.
//
// The host forwards what arrives on a zone's host end (zonenet.ForwardFrom),
// in the floor as in the runtime: zones on one host reach each other
// through it, and the kernel's cost of turning that on, which grows with
// the number of zones made at once, is the zone's, not the runtime's.
//
// The floor also waits, as the runtime does, for the kernel to finish the
// network (zonenet.WaitLive, one request per check): without that, a health
// check sent too early is dropped and costs a 1 s retransmission, and the
// floor would measure the kernel's timing luck rather than its cost.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// ZonesOptions size the zone benchmark.
type ZonesOptions struct {
	// Count is how many zones each phase creates and destroys at once (200).
	Count int
	// Rounds is how many times floor and runtime each run (3); the result is
	// the median.
	Rounds int
	// TempDir is where the runtime's data dir is made (default os.TempDir()).
	TempDir string
	// PhaseTimeout bounds each phase: bringing N zones up, or down (2m).
	PhaseTimeout time.Duration
	// RuntimeLog receives the runtime's log (default: discarded).
	RuntimeLog *slog.Logger
	// Calibrate runs the floor in the runtime's place too: the ratios then
	// are what the benchmark reads for equal work on this machine, the
	// noise any runtime/floor ratio carries here.
	Calibrate bool
	// Progress, if set, receives a line per round and kind, for people.
	Progress io.Writer
}

// ZonesResult is what `bench zones` prints.
type ZonesResult struct {
	// Calibration says the floor ran in the runtime's place
	// (ZonesOptions.Calibrate): the runtime's figures are a second floor's.
	Calibration bool         `json:"calibration,omitempty"`
	Machine     ZonesMachine `json:"machine"`
	Zones       int          `json:"zones"`
	Rounds      int          `json:"rounds"`
	Up          Comparison   `json:"up"`
	Down        Comparison   `json:"down"`
	PerRound    []RoundTimes `json:"per_round"`
}

// ZonesMachine describes where the benchmark ran.
type ZonesMachine struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
}

// Comparison compares the runtime with the floor for one direction (up or
// down): medians over the rounds.
type Comparison struct {
	FloorS   float64 `json:"floor_s"`
	RuntimeS float64 `json:"runtime_s"`
	Ratio    float64 `json:"ratio"`
	// FloorCPUS and RuntimeCPUS are the machine's busy CPU time (all
	// processes, kernel included, from /proc/stat) from the phase's start
	// until the machine is idle again, so that what the kernel does
	// after the calls return counts too. On a machine with few cores, the
	// wall-clock ratio follows this one.
	FloorCPUS        float64 `json:"floor_cpu_s"`
	RuntimeCPUS      float64 `json:"runtime_cpu_s"`
	CPURatio         float64 `json:"cpu_ratio"`
	FloorZoneP50ms   float64 `json:"floor_zone_p50_ms"`
	FloorZoneP99ms   float64 `json:"floor_zone_p99_ms"`
	RuntimeZoneP50ms float64 `json:"runtime_zone_p50_ms"`
	RuntimeZoneP99ms float64 `json:"runtime_zone_p99_ms"`
}

// RoundTimes are one round's wall-clock times, in seconds.
type RoundTimes struct {
	First        string  `json:"first"` // "floor" or "runtime": which ran first this round
	FloorUpS     float64 `json:"floor_up_s"`
	RuntimeUpS   float64 `json:"runtime_up_s"`
	FloorDownS   float64 `json:"floor_down_s"`
	RuntimeDownS float64 `json:"runtime_down_s"`
}

// phaseTimes is one phase's outcome: the wall-clock time from the first
// start to the last finish, and each zone's own time.
type phaseTimes struct {
	wall  time.Duration
	cpu   time.Duration // busy CPU time of the whole machine during the phase
	zones []time.Duration
}

const (
	// zonePrefix is the /64 the zones' addresses come from (host 0x10+i,
	// salted: zoneAddr).
	zonePrefix = "fd00:1122:3344:1f0::"
	// zoneSled is the underlay address of the agents whose zones are
	// there: a zone's address is in its sled's /64.
	zoneSled    = zonePrefix + "1"
	servicePort = 32345
	// zoneIfName is the zone end of a floor zone's veth pair.
	zoneIfName = "underlay0"
	// healthTimeout is the runtime's longest health check.
	healthTimeout = time.Second
	// netlinkTimeout bounds every netlink reply.
	netlinkTimeout = 10 * time.Second
	// settle is the pause between phases, so that the kernel's deferred
	// namespace cleanup of one phase mostly lands outside the next.
	settle = time.Second
	// servicePath is the PATH of the floor's service, as the run script
	// the runtime writes gives its service.
	servicePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

var hostLinkLocal = netip.MustParsePrefix("fe80::1/64")

// zonesBench is one run of the benchmark: its unique names and everything
// it created, so that cleanup finds it all.
type zonesBench struct {
	opts    ZonesOptions
	prefix  string // of every namespace and floor link: "bz<6 hex>-"
	tag     string // the runtime's ownership tag: "bz<6 hex>"
	agent   string // the agent binary the floor's services run
	dataDir string // the runtime's data dir, removed at the end
	runDir  string // the runtime's run dir, removed at the end
	rt      *linux.Runtime
	specs   []zone.Spec

	mu    sync.Mutex
	floor []*floorZone // guarded by mu: the floor zones of the current round
}

// Zones runs the zone benchmark. It needs root and runsv.
func Zones(ctx context.Context, opts ZonesOptions) (res *ZonesResult, err error) {
	if opts.Count < 1 || opts.Count > 10000 {
		return nil, fmt.Errorf("zone count %d: want 1–10000", opts.Count)
	}
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("rounds %d: want at least 1", opts.Rounds)
	}
	if opts.PhaseTimeout <= 0 {
		opts.PhaseTimeout = 2 * time.Minute
	}
	b, err := newZonesBench(opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := b.cleanup(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
			res = nil
		}
	}()
	return b.run(ctx)
}

// newZonesBench prepares a run of the zone benchmark: its names, data and
// run dirs, and the runtime. Its cleanup removes all it made.
func newZonesBench(opts ZonesOptions) (*zonesBench, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench zones needs root: it creates network namespaces, links and supervised processes")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		return nil, fmt.Errorf("bench zones needs runsv: %w", err)
	}
	agent, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the agent binary: %w", err)
	}
	var rnd [3]byte
	rand.Read(rnd[:])
	id := "bz" + hex.EncodeToString(rnd[:])
	b := &zonesBench{opts: opts, prefix: id + "-", tag: id, agent: agent}
	if b.dataDir, err = os.MkdirTemp(opts.TempDir, "sled-agent-bench-zones-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			b.cleanup()
		}
	}()
	if err := prepareNetnsDir(); err != nil {
		return nil, err
	}
	// The runtime keeps its per-boot state on a tmpfs, as the agent does
	// (it mounts one on /run/sled-agent when /run is not a tmpfs). /dev/shm
	// is one everywhere, and needs no mount that would outlive the run.
	if b.runDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-zones-"); err != nil {
		return nil, err
	}
	b.rt, err = linux.New(linux.Options{DataDir: b.dataDir, RunDir: b.runDir, Tag: b.tag, Sled: uuid.NewString(), NetnsPrefix: b.prefix, AgentBinary: agent, Log: opts.RuntimeLog})
	if err != nil {
		return nil, err
	}
	for i := range opts.Count {
		z := sledconfigtest.Crucible(i)
		z.ZoneType.Address = netip.AddrPortFrom(zoneAddr(i), servicePort).String()
		b.specs = append(b.specs, zone.SpecFor(&z))
	}
	ok = true
	return b, nil
}

func (b *zonesBench) run(ctx context.Context) (*ZonesResult, error) {
	var ups, downs [2][]phaseTimes // [0] floor, [1] runtime
	var rounds []RoundTimes
	for r := range b.opts.Rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0} // alternate which goes first
		}
		for _, which := range order {
			progress(b.opts.Progress, "bench zones: round %d/%d: %d zones up and down, %s", r+1, b.opts.Rounds, b.opts.Count, kindName(which))
			up, down, err := b.measure(ctx, which == 1)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, kindName(which), err)
			}
			ups[which] = append(ups[which], up)
			downs[which] = append(downs[which], down)
		}
		rounds = append(rounds, RoundTimes{
			First:        kindName(order[0]),
			FloorUpS:     seconds(ups[0][r].wall),
			RuntimeUpS:   seconds(ups[1][r].wall),
			FloorDownS:   seconds(downs[0][r].wall),
			RuntimeDownS: seconds(downs[1][r].wall),
		})
	}
	res := &ZonesResult{Calibration: b.opts.Calibrate, Zones: b.opts.Count, Rounds: b.opts.Rounds, PerRound: rounds}
	res.Machine = ZonesMachine{CPUs: runtime.NumCPU(), Kernel: kernel(), Go: runtime.Version()}
	res.Up = compare(ups[0], ups[1])
	res.Down = compare(downs[0], downs[1])
	return res, nil
}

func kindName(which int) string { return [...]string{"floor", "runtime"}[which] }

// measure brings every zone up and then down, through the runtime or as the
// floor (always, when calibrating), each phase under its own deadline.
func (b *zonesBench) measure(ctx context.Context, viaRuntime bool) (up, down phaseTimes, err error) {
	upFn, downFn := b.floorUp, b.floorDown
	if viaRuntime && !b.opts.Calibrate {
		upFn, downFn = b.runtimeUp, b.runtimeDown
	}
	for _, p := range []struct {
		f   func(context.Context, int) error
		out *phaseTimes
	}{{upFn, &up}, {downFn, &down}} {
		if err := sleepCtx(ctx, settle); err != nil {
			return up, down, err
		}
		pctx, cancel := context.WithTimeout(ctx, b.opts.PhaseTimeout)
		*p.out, err = b.phase(pctx, p.f)
		cancel()
		if err != nil {
			return up, down, err
		}
	}
	return up, down, nil
}

// phase runs f for every zone at once and times it. It returns only when
// every call has returned.
func (b *zonesBench) phase(ctx context.Context, f func(context.Context, int) error) (phaseTimes, error) {
	n := b.opts.Count
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	cpu0 := busyCPU()
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			t := time.Now()
			errs[i] = f(ctx, i)
			took[i] = time.Since(t)
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	cpu := untilQuiet(ctx) - cpu0
	if err := firstErrors(errs, 3); err != nil {
		return phaseTimes{}, err
	}
	return phaseTimes{wall: wall, cpu: cpu, zones: took}, nil
}

// untilQuiet waits until the machine is idle again after a phase (at most
// one CPU tick busy in quietStep; quietMax at most) and returns the busy CPU
// time then. Work the kernel defers, destroying namespaces above all, so
// counts for the phase that caused it, not for whichever ran long enough to
// absorb it.
func untilQuiet(ctx context.Context) time.Duration {
	last := busyCPU()
	for deadline := time.Now().Add(quietMax); time.Now().Before(deadline); {
		if sleepCtx(ctx, quietStep) != nil {
			break
		}
		now := busyCPU()
		if now-last <= time.Second/clockTicks {
			return now
		}
		last = now
	}
	return busyCPU()
}

const (
	quietStep = 200 * time.Millisecond
	quietMax  = 10 * time.Second
)

// firstErrors joins up to max of errs, saying how many there were.
func firstErrors(errs []error, max int) error {
	var some []error
	count := 0
	for _, err := range errs {
		if err != nil {
			count++
			if len(some) < max {
				some = append(some, err)
			}
		}
	}
	if count == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d zones failed: %w", count, len(errs), errors.Join(some...))
}

// The runtime.

func (b *zonesBench) runtimeUp(ctx context.Context, i int) error {
	return b.rt.Ensure(ctx, b.specs[i])
}

func (b *zonesBench) runtimeDown(ctx context.Context, i int) error {
	return b.rt.Destroy(ctx, b.specs[i].Name)
}

// The floor.

// floorZone is a zone made of the bare primitives.
type floorZone struct {
	netns     string // namespace name; also the zone's name
	host      string // host end of its veth pair
	hostIndex int
	addr      netip.Addr
	id        string
	cmd       *exec.Cmd
	stderr    bytes.Buffer
	exited    chan struct{} // closed when cmd has been waited for
}

func (b *zonesBench) newFloorZone(i int) *floorZone {
	z := &floorZone{
		netns: b.prefix + "f" + strconv.Itoa(i),
		host:  b.prefix + "f" + strconv.Itoa(i), // ≤ 15 bytes: "bz" + 6 hex + "-f" + ≤ 4 digits
		addr:  zoneAddr(i),
		id:    sledconfigtest.ZoneID(i),
	}
	b.mu.Lock()
	if b.floor == nil {
		b.floor = make([]*floorZone, b.opts.Count)
	}
	b.floor[i] = z
	b.mu.Unlock()
	return z
}

func (b *zonesBench) floorZone(i int) *floorZone {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.floor[i]
}

// floorUp creates zone i from the bare primitives and returns once its
// service answers its health check.
func (b *zonesBench) floorUp(ctx context.Context, i int) error {
	z := b.newFloorZone(i)
	path := netnsPath(z.netns)
	ns, zh, err := newNetns(path)
	if err != nil {
		return fmt.Errorf("zone %s: %w", z.netns, err)
	}
	defer ns.Close()
	defer zh.Close()
	hh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("zone %s: netlink: %w", z.netns, err)
	}
	defer hh.Close()
	if err := hh.SetSocketTimeout(netlinkTimeout); err != nil {
		return fmt.Errorf("zone %s: netlink: %w", z.netns, err)
	}

	attrs := netlink.NewLinkAttrs()
	attrs.Name = z.host
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: zoneIfName, PeerNamespace: netlink.NsFd(ns)}
	if err := hh.LinkAdd(veth); err != nil { // sets veth.Index
		return fmt.Errorf("zone %s: creating veth: %w", z.netns, err)
	}
	z.hostIndex = veth.Index
	zl, err := zh.LinkByName(zoneIfName)
	if err != nil {
		return fmt.Errorf("zone %s: %w", z.netns, err)
	}
	// The loopback of a new namespace is always index 1.
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1, Name: "lo"}}
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"lo up", func() error { return zh.LinkSetUp(lo) }},
		{"zone address", func() error { return zh.AddrAdd(zl, nodadAddr(netip.PrefixFrom(z.addr, 128))) }},
		{"zone end up", func() error { return zh.LinkSetUp(zl) }},
		{"host address", func() error { return hh.AddrAdd(veth, nodadAddr(hostLinkLocal)) }},
		{"host end up", func() error { return hh.LinkSetUp(veth) }},
		{"forwarding from the host end", func() error { return zonenet.ForwardFrom(z.host) }},
		{"host route", func() error {
			return hh.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Dst: ipNet(netip.PrefixFrom(z.addr, 128))})
		}},
		{"zone default route", func() error {
			return zh.RouteAdd(&netlink.Route{LinkIndex: zl.Attrs().Index, Gw: hostLinkLocal.Addr().AsSlice(), Dst: ipNet(netip.MustParsePrefix("::/0"))})
		}},
	} {
		if err := step.do(); err != nil {
			return fmt.Errorf("zone %s: %s: %w", z.netns, step.what, err)
		}
	}

	listen := netip.AddrPortFrom(z.addr, servicePort).String()
	z.cmd = exec.Command(b.agent, "zone-service",
		"--listen", listen, "--zone", z.netns, "--id", z.id, "--kind", "crucible")
	z.cmd.Env = []string{servicePath}
	z.cmd.Stderr = &z.stderr
	z.exited = make(chan struct{})
	if err := zonenet.StartIn(z.netns, z.cmd); err != nil {
		z.cmd = nil
		return fmt.Errorf("zone %s: starting its service: %w", z.netns, err)
	}
	go func() {
		z.cmd.Wait()
		close(z.exited)
	}()
	if err := zonenet.WaitLive(ctx, hh, zh, veth, zl, z.addr); err != nil {
		return fmt.Errorf("zone %s: %w", z.netns, err)
	}
	if err := waitServing(ctx, listen, z.exited); err != nil {
		select {
		case <-z.exited: // z.stderr is complete
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(z.stderr.Bytes()))
		default:
		}
		return fmt.Errorf("zone %s: %w", z.netns, err)
	}
	return nil
}

// waitServing polls the service at addr on the runtime's schedule, until it
// answers, it exits, or ctx ends.
func waitServing(ctx context.Context, addr string, exited <-chan struct{}) error {
	poll := zoneservice.NewPoller(healthTimeout)
	for {
		select {
		case <-exited:
			return errors.New("its service exited while starting")
		default:
		}
		err := poll.Check(ctx, addr)
		if err == nil {
			return nil
		}
		t := time.NewTimer(poll.Pause())
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("not ready: %v: %w", err, ctx.Err())
		case <-exited:
			t.Stop()
		case <-t.C:
		}
	}
}

// floorDown stops zone i's service and removes its link and namespace.
func (b *zonesBench) floorDown(ctx context.Context, i int) error {
	z := b.floorZone(i)
	if z.cmd != nil {
		z.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-z.exited:
		case <-ctx.Done():
			return fmt.Errorf("zone %s: service did not stop: %w", z.netns, ctx.Err())
		}
	}
	hh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("zone %s: netlink: %w", z.netns, err)
	}
	defer hh.Close()
	if err := hh.SetSocketTimeout(netlinkTimeout); err != nil {
		return fmt.Errorf("zone %s: netlink: %w", z.netns, err)
	}
	if err := hh.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: z.host, Index: z.hostIndex}}); err != nil {
		return fmt.Errorf("zone %s: deleting its link: %w", z.netns, err)
	}
	return removeNetns(netnsPath(z.netns))
}

// newNetns creates a network namespace bound at path, as `ip netns add`
// does, and returns it with a netlink handle inside it.
func newNetns(path string) (netns.NsHandle, *netlink.Handle, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return netns.None(), nil, fmt.Errorf("creating namespace file: %w", err)
	}
	f.Close()
	type result struct {
		ns  netns.NsHandle
		h   *netlink.Handle
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- result{err: err}
			return // the thread is discarded
		}
		defer orig.Close()
		done <- func() result {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return result{err: fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			}
			self := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
			if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
				return result{err: fmt.Errorf("bind-mounting the namespace on %s: %w", path, err)}
			}
			ns, err := netns.Get()
			if err != nil {
				return result{err: err}
			}
			h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err == nil {
				err = h.SetSocketTimeout(netlinkTimeout)
			}
			if err != nil {
				ns.Close()
				return result{err: fmt.Errorf("netlink in the namespace: %w", err)}
			}
			return result{ns: ns, h: h}
		}()
		// Only a thread back in its own namespace goes back to the pool.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	r := <-done
	if r.err != nil {
		removeNetns(path)
		return netns.None(), nil, r.err
	}
	return r.ns, r.h, nil
}

// prepareNetnsDir makes /run/netns exist as a shared mount point, as
// iproute2 does.
func prepareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself: %w", netnsDir, err)
		}
		err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", netnsDir, err)
	}
	return nil
}

const netnsDir = "/run/netns"

func netnsPath(name string) string { return netnsDir + "/" + name }

// removeNetns unmounts and deletes a namespace file, as `ip netns delete`
// does. A missing one is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

func nodadAddr(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addrSalt makes this process's zone addresses its own: two benchmarks
// running on one host at once (or a test beside one) never ask for a host
// route to the same address.
var addrSalt = func() (b [4]byte) {
	rand.Read(b[:])
	return b
}()

// zoneAddr is zone i's address: host 0x10+i of the benchmark's /64, with
// the process's salt in the interface id's upper half.
func zoneAddr(i int) netip.Addr {
	a := netip.MustParseAddr(zonePrefix).As16()
	copy(a[8:12], addrSalt[:])
	v := uint32(0x10 + i)
	a[12], a[13], a[14], a[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	return netip.AddrFrom16(a)
}

// Cleanup.

// cleanup removes everything the run created, whatever state it was left
// in: floor services, runtime zones, then by name any process, link and
// namespace that is still there, and the data dir.
func (b *zonesBench) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.PhaseTimeout)
	defer cancel()
	var errs []error
	b.mu.Lock()
	floor := slices.Clone(b.floor)
	b.mu.Unlock()
	for _, z := range floor {
		if z != nil && z.cmd != nil {
			z.cmd.Process.Kill()
		}
	}
	for _, z := range floor {
		if z != nil && z.cmd != nil {
			select {
			case <-z.exited:
			case <-ctx.Done():
				errs = append(errs, fmt.Errorf("service of %s (pid %d) did not exit", z.netns, z.cmd.Process.Pid))
			}
		}
	}
	if b.rt != nil {
		obs, err := b.rt.List(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		derrs := make([]error, len(obs))
		var wg sync.WaitGroup
		for i, o := range obs {
			wg.Go(func() { derrs[i] = b.rt.Destroy(ctx, o.Name) })
		}
		wg.Wait()
		errs = append(errs, derrs...)
	}
	if err := b.sweep(ctx); err != nil {
		errs = append(errs, err)
	}
	if b.rt != nil {
		b.rt.RemoveEmptyDirs()
	}
	for _, d := range []string{b.dataDir, b.runDir} {
		if d == "" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweep kills every process in one of the run's namespaces or supervised
// from its data dir, and removes the run's links and namespaces.
func (b *zonesBench) sweep(ctx context.Context) error {
	var errs []error
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	var nsPaths []string
	nsIDs := map[string]bool{} // "net:[inode]", as /proc/PID/ns/net reads
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), b.prefix) {
			p := netnsPath(e.Name())
			nsPaths = append(nsPaths, p)
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil {
				nsIDs["net:["+strconv.FormatUint(st.Ino, 10)+"]"] = true
			}
		}
	}
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		pids := b.leftoverProcs(nsIDs)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		if sleepCtx(ctx, delay) != nil {
			errs = append(errs, fmt.Errorf("processes %v did not exit", pids))
			break
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		a := l.Attrs()
		if strings.HasPrefix(a.Name, b.prefix) || strings.HasPrefix(a.Alias, b.tag+":") {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting link %s: %w", a.Name, err))
			}
		}
	}
	for _, p := range nsPaths {
		if err := removeNetns(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// leftoverProcs lists the processes in one of the namespaces nsIDs, the
// runsvs working in the data dir, and the processes carrying the mark of a
// service dir under it.
func (b *zonesBench) leftoverProcs(nsIDs map[string]bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	under := b.runDir + "/"
	mark := []byte("SLED_AGENT_SUPERVISE_DIR=" + under)
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dir := "/proc/" + e.Name()
		if l, err := os.Readlink(dir + "/ns/net"); err == nil && nsIDs[l] {
			out = append(out, pid)
			continue
		}
		if cwd, err := os.Readlink(dir + "/cwd"); err == nil && strings.HasPrefix(cwd, under) {
			out = append(out, pid)
			continue
		}
		if env, err := os.ReadFile(dir + "/environ"); err == nil && bytes.Contains(env, mark) {
			out = append(out, pid)
		}
	}
	return out
}

// Summaries.

func compare(floor, rt []phaseTimes) Comparison {
	med := func(ps []phaseTimes, f func(phaseTimes) float64) float64 {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = f(p)
		}
		return median(xs)
	}
	wall := func(p phaseTimes) float64 { return seconds(p.wall) }
	cpu := func(p phaseTimes) float64 { return seconds(p.cpu) }
	p50 := func(p phaseTimes) float64 { return summarize(p.zones).P50ms }
	p99 := func(p phaseTimes) float64 { return summarize(p.zones).P99ms }
	c := Comparison{
		FloorS:           med(floor, wall),
		RuntimeS:         med(rt, wall),
		FloorCPUS:        med(floor, cpu),
		RuntimeCPUS:      med(rt, cpu),
		FloorZoneP50ms:   med(floor, p50),
		FloorZoneP99ms:   med(floor, p99),
		RuntimeZoneP50ms: med(rt, p50),
		RuntimeZoneP99ms: med(rt, p99),
	}
	if c.FloorS > 0 {
		c.Ratio = round3(c.RuntimeS / c.FloorS)
	}
	if c.FloorCPUS > 0 {
		c.CPURatio = round3(c.RuntimeCPUS / c.FloorCPUS)
	}
	return c
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func seconds(d time.Duration) float64 { return round3(d.Seconds()) }

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// busyCPU returns the CPU time the whole machine has spent busy since boot
// (user, nice, system, irq and softirq time of all CPUs, from /proc/stat), or
// 0 if it cannot be read.
func busyCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system (idle iowait) irq softirq
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

func kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
