package bench

// The guest benchmark: a real guest (the test guest, through OVMF under
// TCG) booted through the agent, against the same QEMU command line started
// by hand, the floor.
//
// The agent is the built binary run as `sled-agent run --runtime linux`
// with a zone tag, namespace prefix, data dir and image dir of the
// benchmark's own. Its side of a boot is timed from just before PUT
// /vmms/{id} (followed at once by PUT /vmms/{id}/state running, which the
// agent keeps until the VMM's service is up) to the first byte and to the
// test guest's READY line on the serial console's websocket, read from the
// VMM's service at propolis_addr as Nexus's console proxy reads it: a push,
// so no poll stands between the byte and its timing. The connection is
// retried every 20 ms until the service has its instance, which is long
// before the guest prints (serial_connected_ms says when). A stop is timed
// from PUT state stopped until GET /vmms/{id}/state says destroyed (polled
// every 20 ms): the guest powered off, QEMU exited, the zone torn down.
//
// The floor runs the QEMU command line the VMM service would run for the
// same spec: qemuvm (the service's backend) builds it from the spec and
// hands it to its start hook, which the floor catches instead of starting
// it. The floor then starts it by hand in a network namespace of its own,
// connects to QMP and to com1's socket, sends cont and reads com1; it is
// timed from the start of QEMU, and a stop from system_powerdown until QEMU
// has exited. Both sides' command lines are compared (paths and names
// aside) with the agent's QEMU's /proc/<pid>/cmdline: same_command_line.
//
// Each round runs both sides, alternately first: one VMM, then --at-once
// VMMs together (time until every one shows the marker). Memory is the
// resident set (VmRSS) of the agent's process, of each VMM zone's service,
// supervisor and QEMU, and of the floor's QEMUs, read from /proc while the
// guests run (after the marker).

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/testguest"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
)

// GuestOptions size the guest benchmark.
type GuestOptions struct {
	// Rounds is how many times each side runs (3), alternately first; the
	// summary holds medians.
	Rounds int
	// AtOnce is how many VMMs boot together in each round's second phase;
	// below 2, there is no such phase.
	AtOnce int
	// Image is the test guest's disk image (default: testguest.Build's,
	// built if missing). Guests boot copies of it the benchmark makes.
	Image string
	// Agent is the agent binary (default: this executable); AgentEnv is
	// added to its environment.
	Agent    string
	AgentEnv []string
	// AgentLog, if set, is where the agent's log is kept; otherwise it goes
	// to the run's temporary dir and its end is quoted in errors.
	AgentLog string
	// BootTimeout bounds each boot phase until every marker (4m), and
	// StopTimeout each stop phase (1m).
	BootTimeout, StopTimeout time.Duration
	// Log receives progress (default: discarded).
	Log *slog.Logger
}

// GuestResult is what `bench guest` prints.
type GuestResult struct {
	Machine ZonesMachine `json:"machine"`
	QEMU    string       `json:"qemu"`
	Accel   string       `json:"accel"`
	Rounds  int          `json:"rounds"`
	AtOnce  int          `json:"at_once"`
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run began and ended: what else ran.
	LoadStart string `json:"load_avg_start"`
	LoadEnd   string `json:"load_avg_end"`
	// AgentSerial and Floor say what was timed on each side.
	AgentSerial string `json:"agent_serial"`
	Floor       string `json:"floor"`
	// SameCommandLine: the floor's QEMU command line is the agent's QEMU's,
	// paths and names aside (the run fails otherwise).
	SameCommandLine bool `json:"same_command_line"`
	// One and AtOnceVMMs compare the sides: medians over the rounds.
	One        GuestComparison    `json:"one_vmm"`
	AtOnceVMMs *GuestComparison   `json:"at_once_vmms,omitempty"`
	Memory     GuestMemoryMedians `json:"memory"`
	PerRound   []GuestRound       `json:"per_round"`
}

// GuestComparison holds medians over the rounds, in milliseconds, of the
// time until every VMM of a phase printed its first byte, showed the READY
// marker, and (from the stop request) stopped; ratios are agent/floor of
// the medians.
type GuestComparison struct {
	FloorFirstByteMs float64 `json:"floor_first_byte_ms"`
	AgentFirstByteMs float64 `json:"agent_first_byte_ms"`
	FirstByteRatio   float64 `json:"first_byte_ratio"`
	FloorMarkerMs    float64 `json:"floor_marker_ms"`
	AgentMarkerMs    float64 `json:"agent_marker_ms"`
	MarkerRatio      float64 `json:"marker_ratio"`
	FloorStopMs      float64 `json:"floor_stop_ms"`
	AgentStopMs      float64 `json:"agent_stop_ms"`
	StopRatio        float64 `json:"stop_ratio"`
}

// GuestMemoryMedians are medians of resident sets, in KiB, over every
// sample of the rounds.
type GuestMemoryMedians struct {
	AgentIdleKiB   int `json:"agent_idle_rss_kib"`    // with no VMM, before a phase
	AgentOneKiB    int `json:"agent_rss_kib_one"`     // with one guest running
	AgentAtOnceKiB int `json:"agent_rss_kib_at_once"` // with AtOnce guests running
	ServiceKiB     int `json:"service_rss_kib"`       // a VMM zone's service
	SupervisorKiB  int `json:"supervisor_rss_kib"`    // its runsv
	AgentQEMUKiB   int `json:"agent_qemu_rss_kib"`    // a QEMU in a VMM zone
	FloorQEMUKiB   int `json:"floor_qemu_rss_kib"`    // a QEMU of the floor
}

// GuestRound is one round: each side with one VMM, then with AtOnce.
type GuestRound struct {
	First       string    `json:"first"` // "floor" or "agent"
	Floor       GuestRun  `json:"floor"`
	Agent       GuestRun  `json:"agent"`
	FloorAtOnce *GuestRun `json:"floor_at_once,omitempty"`
	AgentAtOnce *GuestRun `json:"agent_at_once,omitempty"`
}

// GuestRun is one phase of one side: per VMM, milliseconds from the
// phase's start.
type GuestRun struct {
	// SerialConnectedMs: when the agent side's console websocket was
	// connected (before the first byte, or that byte was history).
	SerialConnectedMs []float64 `json:"serial_connected_ms,omitempty"`
	FirstByteMs       []float64 `json:"first_byte_ms"`
	MarkerMs          []float64 `json:"marker_ms"`
	// StopMs is from the stop request until every VMM stopped.
	StopMs float64 `json:"stop_ms"`
	// ForcedStops counts the agent's VMMs whose stop it had to force.
	ForcedStops int `json:"forced_stops,omitempty"`
	// Detail is what the agent said of its first VMM while it ran (how
	// its QEMU runs).
	Detail string `json:"agent_detail,omitempty"`
	// History is the agent's record of its first VMM, ms from the phase's
	// start to each event (the first of each name), and StopHistory from
	// the stop request.
	History     map[string]float64 `json:"agent_history_ms,omitempty"`
	StopHistory map[string]float64 `json:"agent_stop_history_ms,omitempty"`
	Memory      GuestMemory        `json:"memory"`
}

// GuestMemory is one sample of resident sets, in KiB, while the guests ran.
type GuestMemory struct {
	// AgentIdleKiB is the agent's before the phase, with no VMM.
	AgentIdleKiB  int   `json:"agent_idle_rss_kib,omitempty"`
	AgentKiB      int   `json:"agent_rss_kib,omitempty"`
	ServiceKiB    []int `json:"service_rss_kib,omitempty"`
	SupervisorKiB []int `json:"supervisor_rss_kib,omitempty"`
	QEMUKiB       []int `json:"qemu_rss_kib"`
}

// phase is one side's run of n guests at once, as measured.
type phase struct {
	connected, firstByte, marker []time.Duration
	stop                         time.Duration
	forced                       int
	history, stopHistory         map[string]float64
	detail                       string
	mem                          GuestMemory
	argv                         []string // the first QEMU's command line, normalised
}

// marker is what the test guest prints once booted, with vmmtest's MAC.
const marker = testguest.ReadyPrefix + vmmtest.MAC

// Guest runs the guest benchmark. It needs root, QEMU and OVMF.
func Guest(ctx context.Context, opts GuestOptions) (res *GuestResult, err error) {
	opts.Rounds = cmp.Or(opts.Rounds, 3)
	opts.BootTimeout = cmp.Or(opts.BootTimeout, 4*time.Minute)
	opts.StopTimeout = cmp.Or(opts.StopTimeout, time.Minute)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("rounds %d: want at least 1", opts.Rounds)
	}
	if opts.AtOnce > 16 {
		return nil, fmt.Errorf("at once %d: want at most 16", opts.AtOnce)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("bench guest needs root: it runs the agent with the linux runtime, and QEMU in network namespaces")
	}
	if _, err := exec.LookPath(testguest.QEMU); err != nil {
		return nil, fmt.Errorf("bench guest needs %s (Debian's qemu-system-x86; scripts/setup installs it): %w", testguest.QEMU, err)
	}
	for _, f := range []string{ovmfCode, ovmfVars} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("bench guest needs OVMF as the VMM service uses it (Debian's ovmf; scripts/setup installs it): %w", err)
		}
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		return nil, fmt.Errorf("bench guest needs runsv (the linux runtime's supervisor; scripts/setup installs runit): %w", err)
	}
	if opts.Image == "" {
		if opts.Image, err = testguest.Build(func(f string, args ...any) { opts.Log.Info(fmt.Sprintf(f, args...)) }); err != nil {
			return nil, fmt.Errorf("the test guest: %w", err)
		}
	}
	if opts.Agent == "" {
		if opts.Agent, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	b, err := newGuestBench(opts)
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

// guestBench is one run: its names, dirs, agent and floor.
type guestBench struct {
	opts   GuestOptions
	log    *slog.Logger
	tag    string // "bg<6 hex>": the agent's zone tag
	prefix string // tag + "-": every namespace's
	dir    string // temporary: data/, images/, floor/, agent.log
	runDir string // the runtime's, on /dev/shm
	images string // --vmm-image-dir
	floors string // the floor's VM dirs and disks
	agent  *guestAgent
	seq    int // numbers VMMs, floor VMs and namespaces

	reg     registry    // what exists now, for cleanup
	argvs   [2][]string // [0] floor, [1] agent: a normalised QEMU command line
	qemuVer string      // as the floor's QEMU says it
}

// run runs the rounds and sums them up.
func (b *guestBench) run(ctx context.Context) (*GuestResult, error) {
	res := &GuestResult{
		Machine: machine(), Accel: "tcg", Rounds: b.opts.Rounds, AtOnce: max(b.opts.AtOnce, 1), LoadStart: loadAvg(),
		AgentSerial: "websocket GET /instance/serial?from_start=0 at propolis_addr (propolisapi client), connected before the guest runs",
		Floor:       "the VMM service's QEMU command line for the same spec (qemuvm, start hook caught), started by hand in a network namespace; QMP cont; com1's socket read directly; timed from QEMU's start",
	}
	if err := b.startAgent(ctx); err != nil {
		return nil, err
	}
	var ones, many [2][]phase // [0] floor, [1] agent
	for r := range b.opts.Rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		round := GuestRound{First: sideName(order[0])}
		for _, side := range order {
			p, err := b.measure(ctx, side, 1)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s, one VMM: %w", r+1, sideName(side), err)
			}
			ones[side] = append(ones[side], p)
			round.set(side, false, p.run())
			if b.opts.AtOnce >= 2 {
				p, err := b.measure(ctx, side, b.opts.AtOnce)
				if err != nil {
					return nil, fmt.Errorf("round %d, %s, %d VMMs at once: %w", r+1, sideName(side), b.opts.AtOnce, err)
				}
				many[side] = append(many[side], p)
				round.set(side, true, p.run())
			}
		}
		res.PerRound = append(res.PerRound, round)
		if r == 0 {
			if !slices.Equal(b.argvs[0], b.argvs[1]) {
				return nil, fmt.Errorf("the floor's QEMU command line is not the agent's QEMU's:\n floor: %s\n agent: %s",
					strings.Join(b.argvs[0], " "), strings.Join(b.argvs[1], " "))
			}
			res.SameCommandLine = true
		}
	}
	res.QEMU = b.qemuVer
	res.One = comparePhases(ones)
	if b.opts.AtOnce >= 2 {
		c := comparePhases(many)
		res.AtOnceVMMs = &c
	}
	res.Memory = memoryMedians(ones, many)
	res.LoadEnd = loadAvg()
	return res, nil
}

// set puts a side's run of a phase in the round.
func (r *GuestRound) set(side int, atOnce bool, run GuestRun) {
	switch {
	case side == 0 && !atOnce:
		r.Floor = run
	case side == 1 && !atOnce:
		r.Agent = run
	case side == 0:
		r.FloorAtOnce = &run
	default:
		r.AgentAtOnce = &run
	}
}

func sideName(side int) string { return [...]string{"floor", "agent"}[side] }

// measure boots n guests at once on one side, until every one shows the
// marker, samples memory, and stops them all; then it removes what the
// phase made, and lets the machine settle.
func (b *guestBench) measure(ctx context.Context, side, n int) (phase, error) {
	b.log.Info("boot", "side", sideName(side), "vmms", n)
	var p phase
	var err error
	if side == 0 {
		p, err = b.floorPhase(ctx, n)
	} else {
		p, err = b.agentPhase(ctx, n)
	}
	if err != nil {
		return p, err
	}
	if p.argv != nil {
		b.argvs[side] = p.argv
	}
	b.log.Info("booted and stopped", "side", sideName(side), "vmms", n,
		"marker_ms", msOf(slices.Max(p.marker)), "stop_ms", msOf(p.stop))
	return p, sleepCtx(ctx, settle)
}

// run is the phase as printed.
func (p phase) run() GuestRun {
	r := GuestRun{StopMs: msOf(p.stop), ForcedStops: p.forced, Detail: p.detail, History: p.history, StopHistory: p.stopHistory, Memory: p.mem}
	for _, d := range p.connected {
		r.SerialConnectedMs = append(r.SerialConnectedMs, msOf(d))
	}
	for i := range p.marker {
		r.FirstByteMs = append(r.FirstByteMs, msOf(p.firstByte[i]))
		r.MarkerMs = append(r.MarkerMs, msOf(p.marker[i]))
	}
	return r
}

// comparePhases compares the sides' phases: medians over the rounds of the
// time until every VMM had done each thing.
func comparePhases(ps [2][]phase) GuestComparison {
	med := func(side int, f func(phase) time.Duration) float64 {
		var xs []float64
		for _, p := range ps[side] {
			xs = append(xs, msOf(f(p)))
		}
		return median(xs)
	}
	first := func(p phase) time.Duration { return slices.Max(p.firstByte) }
	mark := func(p phase) time.Duration { return slices.Max(p.marker) }
	stop := func(p phase) time.Duration { return p.stop }
	ratio := func(a, f float64) float64 {
		if f <= 0 {
			return 0
		}
		return round3(a / f)
	}
	c := GuestComparison{
		FloorFirstByteMs: med(0, first), AgentFirstByteMs: med(1, first),
		FloorMarkerMs: med(0, mark), AgentMarkerMs: med(1, mark),
		FloorStopMs: med(0, stop), AgentStopMs: med(1, stop),
	}
	c.FirstByteRatio = ratio(c.AgentFirstByteMs, c.FloorFirstByteMs)
	c.MarkerRatio = ratio(c.AgentMarkerMs, c.FloorMarkerMs)
	c.StopRatio = ratio(c.AgentStopMs, c.FloorStopMs)
	return c
}

// memoryMedians sums the memory samples up.
func memoryMedians(ones, many [2][]phase) GuestMemoryMedians {
	med := func(xs []int) int {
		fs := make([]float64, len(xs))
		for i, x := range xs {
			fs[i] = float64(x)
		}
		return int(median(fs))
	}
	var idle, agentOne, agentMany, svc, sup, aq, fq []int
	for _, p := range ones[1] {
		agentOne = append(agentOne, p.mem.AgentKiB)
	}
	for _, p := range many[1] {
		agentMany = append(agentMany, p.mem.AgentKiB)
	}
	for _, p := range slices.Concat(ones[1], many[1]) {
		idle = append(idle, p.mem.AgentIdleKiB)
		svc = append(svc, p.mem.ServiceKiB...)
		sup = append(sup, p.mem.SupervisorKiB...)
		aq = append(aq, p.mem.QEMUKiB...)
	}
	for _, p := range slices.Concat(ones[0], many[0]) {
		fq = append(fq, p.mem.QEMUKiB...)
	}
	return GuestMemoryMedians{AgentIdleKiB: med(idle), AgentOneKiB: med(agentOne), AgentAtOnceKiB: med(agentMany),
		ServiceKiB: med(svc), SupervisorKiB: med(sup), AgentQEMUKiB: med(aq), FloorQEMUKiB: med(fq)}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// newGuestBench makes the run's names and dirs.
func newGuestBench(opts GuestOptions) (*guestBench, error) {
	var rnd [3]byte
	rand.Read(rnd[:])
	tag := "bg" + hex.EncodeToString(rnd[:])
	b := &guestBench{opts: opts, log: opts.Log, tag: tag, prefix: tag + "-"}
	var err error
	if b.dir, err = os.MkdirTemp("", "sled-agent-bench-guest-"); err != nil {
		return nil, err
	}
	if b.runDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-guest-"); err != nil {
		os.RemoveAll(b.dir)
		return nil, err
	}
	b.images, b.floors = b.dir+"/images", b.dir+"/floor"
	for _, d := range []string{b.images, b.floors} {
		if err := os.Mkdir(d, 0o700); err != nil {
			b.cleanup()
			return nil, err
		}
	}
	if err := prepareNetnsDir(); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}
