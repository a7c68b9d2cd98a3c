// Package crashtest kills the agent at random moments and checks that a
// restarted agent picks up where the dead one left off. It runs the real
// agent binary with the Linux runtime on a mixed config (crucibles and a
// nexus with a NIC), and on every iteration changes the config or not,
// SIGKILLs the agent a random time later (while zones are being created,
// waited for, torn down, or while nothing happens), or reboots the host
// under it (a share of the iterations, internal/crashtest/reboot: the agent
// and everything it started killed, its namespaces, links, cgroups, mounts,
// loop devices and run dir gone), restarts it, and requires:
//
//   - convergence within a bound: every wanted zone running with its config,
//     and nothing owned and unwanted left (namespaces, links, processes, zone
//     roots);
//   - after a kill, no restart of a zone that was healthy before it and
//     whose config did not change (its service keeps its PID); after a
//     reboot everything restarts;
//   - the ledger intact, at the last generation acknowledged;
//   - VMMs (real guests) in the state last asked, with one QEMU each while
//     they run, and nothing left of a deleted one (vmms.go).
package crashtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/crashtest/reboot"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// Options size a crash test.
type Options struct {
	// Iterations is how many times the agent is killed and restarted (20).
	Iterations int
	// Crucibles is how many crucible zones the first config has (6); a nexus
	// with a NIC comes with them.
	Crucibles int
	// Seed makes the run repeatable; 0 picks one (reported).
	Seed uint64
	// MaxKillDelay: the kill comes at a random time up to MaxKillDelay
	// after the iteration's config change (2s; a third of the kills come in
	// the first 50 ms, a third while services start).
	MaxKillDelay time.Duration
	// ConvergeTimeout bounds each recovery (60s).
	ConvergeTimeout time.Duration
	// ServiceStartDelay is how long each crucible's service takes to start
	// listening (300ms; negative: none), so that kills find zones waiting
	// for their services as often as they find them being made.
	ServiceStartDelay time.Duration
	// RebootShare is the share of iterations that reboot the host rather
	// than kill the agent, drawn at random (0: 0.25; negative: none; 1:
	// all). A run with a positive share has at least one reboot: if none
	// was drawn before the last iteration, the last one reboots.
	RebootShare float64
	// Agent is the agent binary (default: this executable), and AgentEnv
	// what it gets in its environment besides this process's.
	Agent    string
	AgentEnv []string
	// Log receives progress (default: discarded).
	Log *slog.Logger
	// Progress, if set, receives a line per iteration, for people: the
	// result alone goes to the caller.
	Progress io.Writer
}

// Result is what a crash test found.
type Result struct {
	Seed       uint64 `json:"seed"`
	Iterations int    `json:"iterations"`
	// Kills counts the kills of the agent alone by what the iteration did
	// first; Reboots the reboots of the host the same way.
	Kills   map[string]int `json:"kills"`
	Reboots map[string]int `json:"reboots"`
	// Convergence is the time from the restarted agent's start to
	// convergence, in milliseconds, over every iteration; and over the
	// reboots alone, which make every zone again.
	ConvergeP50ms       float64 `json:"converge_p50_ms"`
	ConvergeP99ms       float64 `json:"converge_p99_ms"`
	ConvergeMaxms       float64 `json:"converge_max_ms"`
	RebootConvergeP50ms float64 `json:"reboot_converge_p50_ms"`
	RebootConvergeP99ms float64 `json:"reboot_converge_p99_ms"`
	// Leaks counts iterations that did not converge in time: something
	// wanted missing, or something owned and unwanted left; LeakDetails
	// says what.
	Leaks       int      `json:"leaks"`
	LeakDetails []string `json:"leak_details,omitempty"`
	// HealthyRestarts counts zones restarted although they were healthy
	// before the kill and their config did not change.
	HealthyRestarts int      `json:"healthy_restarts"`
	RestartDetails  []string `json:"restart_details,omitempty"`
	// Restored sums what the restarted agents reported finding: zones
	// adopted as they were, waited for (running but not answering yet),
	// repaired (changed or half-made when the kill came), removed, and
	// leftovers swept. It shows where the kills landed.
	Restored RestoredTotals `json:"restored"`
	// LedgerProblems counts restarts whose ledger was not intact at the last
	// acknowledged generation.
	LedgerProblems int      `json:"ledger_problems"`
	LedgerDetails  []string `json:"ledger_details,omitempty"`
	// DataLost counts restarts after which a durable dataset of a zone
	// still wanted no longer held the file written there (synced) when
	// the zone first ran.
	DataLost        int      `json:"data_lost"`
	DataLostDetails []string `json:"data_lost_details,omitempty"`
	// VMMsFailed lists the VMMs that a kill left failed (their zone
	// half-made, say), with what the agent said; nothing of them may run.
	VMMsFailed []string `json:"vmms_failed,omitempty"`
	// VMMsRebooted counts the VMMs a reboot took down: each was then
	// reported failed with nothing of it running, or gone.
	VMMsRebooted int `json:"vmms_rebooted"`
	// DataPathKills counts the kills that killed the VPC data path too
	// (ports.go).
	DataPathKills int `json:"data_path_kills"`
	// AgentLog is where the agent's log was kept, when the run failed.
	AgentLog string `json:"agent_log,omitempty"`
}

// RestoredTotals sums restore reports over the iterations.
type RestoredTotals struct {
	Adopted   int `json:"adopted"`
	Waited    int `json:"waited"`
	Repaired  int `json:"repaired"`
	Removed   int `json:"removed"`
	Leftovers int `json:"leftovers_swept"`
}

// OK reports whether the run found no leak, no restart of a healthy zone and
// no ledger problem.
func (r *Result) OK() bool {
	return r.Leaks == 0 && r.HealthyRestarts == 0 && r.LedgerProblems == 0 && r.DataLost == 0
}

// run is one crash test: its unique names, the agent process, the state.
type run struct {
	opts    Options
	rnd     *mrand.Rand
	rndBoot *mrand.Rand // draws the reboots, apart from rnd, so that a seed's kills stay as they were
	rndVPC  *mrand.Rand // draws the kills of the data path, apart from both
	tag     string
	prefix  string
	dir     string // temp dir: data/, agent.log
	runDir  string // on a tmpfs
	listen  string
	cfg     agent.Config // how the agent is run, for the observer and teardown
	obs     *linux.Runtime
	c       *client.Client
	proc    *exec.Cmd
	exited  chan struct{}
	gen     uint64
	zones   []sledconfig.Zone // the last acknowledged config's zones
	nextIdx int               // next crucible index to add
	data    map[string]string // zone id → what its durable dataset holds (keepData)
	vmms    map[string]*ctVMM // the VMMs made and not known gone (vmms.go)
	vmmSeq  int               // numbers the VMMs' addresses
	// vmmsFailed says which VMMs a kill failed, and why.
	vmmsFailed []string
	// vmmsRebooted counts the VMMs a reboot took down.
	vmmsRebooted int
}

// Run runs a crash test. It needs root and runsv; everything it
// creates carries a unique tag and is removed at the end.
func Run(ctx context.Context, opts Options) (res *Result, err error) {
	opts.Iterations = cmp.Or(opts.Iterations, 20)
	opts.Crucibles = cmp.Or(opts.Crucibles, 6)
	opts.MaxKillDelay = cmp.Or(opts.MaxKillDelay, 2*time.Second)
	opts.ConvergeTimeout = cmp.Or(opts.ConvergeTimeout, time.Minute)
	opts.ServiceStartDelay = cmp.Or(opts.ServiceStartDelay, 300*time.Millisecond)
	opts.RebootShare = cmp.Or(opts.RebootShare, 0.25)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.RebootShare > 1 {
		return nil, fmt.Errorf("reboot share %g: want at most 1", opts.RebootShare)
	}
	if opts.Crucibles < 2 || opts.Crucibles > 200 {
		return nil, fmt.Errorf("crucibles %d: want 2–200", opts.Crucibles)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the crash test needs root: it runs the agent with the linux runtime")
	}
	if _, err := exec.LookPath("runsv"); err != nil {
		return nil, fmt.Errorf("the crash test needs runsv: %w", err)
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return nil, fmt.Errorf("the crash test needs btrfs-progs (zones' datasets are on btrfs pools): %w", err)
	}
	if opts.Agent == "" {
		if opts.Agent, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if opts.Seed == 0 {
		opts.Seed = mrand.Uint64()
	}
	var b [3]byte
	rand.Read(b[:])
	r := &run{opts: opts, rnd: mrand.New(mrand.NewPCG(opts.Seed, 0)), rndBoot: mrand.New(mrand.NewPCG(opts.Seed, 1)), rndVPC: mrand.New(mrand.NewPCG(opts.Seed, 2)), tag: "ct" + hex.EncodeToString(b[:]), data: map[string]string{}, vmms: map[string]*ctVMM{}}
	r.prefix = r.tag + "-"
	if r.dir, err = os.MkdirTemp("", "sled-agent-crashtest-"); err != nil {
		return nil, err
	}
	if r.runDir, err = os.MkdirTemp("/dev/shm", "sled-agent-crashtest-"); err != nil {
		os.RemoveAll(r.dir)
		return nil, err
	}
	defer func() {
		keep := err != nil || (res != nil && !res.OK())
		if cerr := r.cleanup(keep); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
		switch {
		case keep && err != nil:
			err = fmt.Errorf("%w (agent log kept in %s)", err, filepath.Join(r.dir, "agent.log"))
		case keep && res != nil:
			res.AgentLog = filepath.Join(r.dir, "agent.log")
		}
	}()
	if r.listen, err = freePort(); err != nil {
		return nil, err
	}
	r.cfg = agent.Config{DataDir: filepath.Join(r.dir, "data"), RunDir: r.runDir, Runtime: "linux", ZoneTag: r.tag, NetnsPrefix: r.prefix, SledID: uuid.NewString(),
		VdevDir: filepath.Join(r.dir, "vdev"), UnderlayIP: "fd00:1122:3344:1cf::1"} // its zones' and VMMs' /64
	if err := os.MkdirAll(r.cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	if err := r.writeAgentConfig(); err != nil {
		return nil, err
	}
	if r.obs, err = linux.New(linux.Options{DataDir: r.cfg.DataDir, RunDir: r.runDir, Tag: r.tag, Sled: r.cfg.SledID, NetnsPrefix: r.prefix, VPC: true}); err != nil {
		return nil, err
	}
	if r.c, err = client.New("http://" + r.listen); err != nil {
		return nil, err
	}
	r.c.Timeout = 5 * time.Second
	return r.loop(ctx)
}

func (r *run) loop(ctx context.Context) (*Result, error) {
	res := &Result{Seed: r.opts.Seed, Iterations: r.opts.Iterations, Kills: map[string]int{}, Reboots: map[string]int{}}
	// The first config, realised before the first kill.
	for i := range r.opts.Crucibles {
		r.zones = append(r.zones, r.crucible(i, 32345))
	}
	r.nextIdx = r.opts.Crucibles
	r.zones = append(r.zones, r.nexus())
	if err := r.startAgent(ctx); err != nil {
		return nil, err
	}
	if err := r.put(ctx, r.zones); err != nil {
		return nil, err
	}
	if err := r.pushServiceRules(ctx); err != nil {
		return nil, err
	}
	if _, problem := r.converge(ctx); problem != "" {
		return nil, fmt.Errorf("the first config did not converge: %s", problem)
	}
	if err := r.keepData(); err != nil {
		return nil, err
	}
	var took, tookReboot []time.Duration
	reboots := 0
	for i := range r.opts.Iterations {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		action, next := r.mutate()
		if next != nil {
			if err := r.put(ctx, next); err != nil {
				return nil, fmt.Errorf("iteration %d: %w", i+1, err)
			}
		}
		switch vaction, err := r.vmmMutate(ctx); {
		case err != nil:
			return nil, fmt.Errorf("iteration %d: %s: %w", i+1, vaction, err)
		case vaction != "" && next == nil:
			action = vaction
		case vaction != "":
			action += ", " + vaction
		}
		// A third of the kills land in the first 50 ms, while zones are
		// torn down and made; a third while services start; the rest
		// anywhere up to MaxKillDelay, mostly once things have settled.
		window := r.opts.MaxKillDelay
		switch r.rnd.IntN(3) {
		case 0:
			window = min(window, 50*time.Millisecond)
		case 1:
			window = min(window, max(r.opts.ServiceStartDelay, 0)+200*time.Millisecond)
		}
		delay := time.Duration(r.rnd.Int64N(int64(window)))
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
		boot := r.opts.RebootShare > 0 && (r.rndBoot.Float64() < r.opts.RebootShare || reboots == 0 && i == r.opts.Iterations-1)
		healthy := map[string]int{}
		if !boot {
			healthy = r.healthyPIDs(ctx)
		}
		if !boot && (res.DataPathKills == 0 || r.rndVPC.IntN(3) == 0) { // the first kill, and a third of the others
			if err := r.killDataPath(); err != nil {
				return nil, fmt.Errorf("iteration %d: %w", i+1, err)
			}
			res.DataPathKills++
		}
		if err := r.kill(); err != nil {
			return nil, fmt.Errorf("iteration %d: %w", i+1, err)
		}
		if boot {
			if err := r.reboot(ctx); err != nil {
				return nil, fmt.Errorf("iteration %d: %w", i+1, err)
			}
			reboots++
			res.Reboots[action]++
		} else {
			res.Kills[action]++
		}
		t0 := time.Now()
		if err := r.startAgent(ctx); err != nil {
			return nil, fmt.Errorf("iteration %d: %w", i+1, err)
		}
		if err := r.vmmRecover(ctx); err != nil {
			return nil, fmt.Errorf("iteration %d: %w", i+1, err)
		}
		d, problem := r.converge(ctx)
		if problem != "" {
			res.Leaks++
			res.LeakDetails = append(res.LeakDetails, fmt.Sprintf("iteration %d (%s, %s after %s): %s", i+1, action, what(boot), delay.Round(time.Millisecond), problem))
		} else {
			took = append(took, time.Since(t0))
			if boot {
				tookReboot = append(tookReboot, time.Since(t0))
			}
		}
		if lost := r.lostData(); lost != "" {
			res.DataLost++
			res.DataLostDetails = append(res.DataLostDetails, fmt.Sprintf("iteration %d (%s, %s): %s", i+1, action, what(boot), lost))
		}
		if problem == "" {
			if err := r.keepData(); err != nil {
				return nil, fmt.Errorf("iteration %d: %w", i+1, err)
			}
		}
		if r.opts.Progress != nil {
			outcome := "converged in " + d.Round(time.Millisecond).String()
			if problem != "" {
				outcome = "PROBLEM: " + problem
			}
			fmt.Fprintf(r.opts.Progress, "crashtest: iteration %d/%d: %s, %s after %s; %s\n", i+1, r.opts.Iterations, action, what(boot), delay.Round(time.Millisecond), outcome)
		}
		r.opts.Log.Info("crash test iteration", "n", i+1, "action", action, "reboot", boot, "killed_after", delay.Round(time.Millisecond), "converged_in", d.Round(time.Millisecond), "problem", problem)
		for name, pid := range healthy {
			if now := r.pid(name); now != pid {
				res.HealthyRestarts++
				res.RestartDetails = append(res.RestartDetails, fmt.Sprintf("iteration %d (%s): zone %s pid %d → %d", i+1, action, name, pid, now))
			}
		}
		if rs, err := r.c.Restore(ctx); err == nil {
			res.Restored.Adopted += rs.Adopted
			res.Restored.Waited += rs.Waited
			res.Restored.Repaired += rs.Repair
			res.Restored.Removed += rs.Remove
			res.Restored.Leftovers += len(rs.Leftovers)
		}
		if problem := r.ledgerProblem(ctx); problem != "" {
			res.LedgerProblems++
			res.LedgerDetails = append(res.LedgerDetails, fmt.Sprintf("iteration %d: %s", i+1, problem))
		}
	}
	if err := r.kill(); err != nil {
		return nil, err
	}
	res.VMMsFailed, res.VMMsRebooted = r.vmmsFailed, r.vmmsRebooted
	p50, p99, mx := percentiles(took)
	res.ConvergeP50ms, res.ConvergeP99ms, res.ConvergeMaxms = p50, p99, mx
	res.RebootConvergeP50ms, res.RebootConvergeP99ms, _ = percentiles(tookReboot)
	return res, nil
}

func what(boot bool) string {
	if boot {
		return "rebooted"
	}
	return "killed"
}

// reboot takes down what a host reboot takes down, the agent being dead
// already: every process of its zones, its namespaces, links, cgroups,
// mounts, loop devices and run dir. Its data dir and vdev files stay.
// The VMMs' guests are gone with it.
func (r *run) reboot(ctx context.Context) error {
	done, err := reboot.Reboot(ctx, r.host())
	r.opts.Log.Info("host rebooted", "removed", done, "err", err)
	if err != nil {
		return fmt.Errorf("rebooting: %w", err)
	}
	// Nothing of the run lives on: no namespace, link, process or QEMU,
	// no zone running; zone roots stay, on their datasets.
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	owned, err := r.obs.Owned(octx)
	cancel()
	if err != nil {
		return fmt.Errorf("after the reboot: %w", err)
	}
	if n := len(owned.Namespaces) + len(owned.Links) + len(owned.Processes); n > 0 {
		return fmt.Errorf("left after the reboot: namespaces %v, links %+v, processes %+v", owned.Namespaces, owned.Links, owned.Processes)
	}
	for _, z := range owned.Zones {
		if z.Running {
			return fmt.Errorf("zone %s still runs after the reboot", z.Name)
		}
	}
	if q := qemuProcesses(r.dir); len(q) > 0 {
		return fmt.Errorf("QEMUs %v left after the reboot", q)
	}
	if m := btrfs.Mounts(r.dir); len(m) > 0 {
		return fmt.Errorf("mounts %v left after the reboot", m)
	}
	for _, v := range r.vmms {
		if !v.deleting {
			v.rebooted = true
		}
	}
	return nil
}

// host is what of the machine is the run's, for reboot.
func (r *run) host() reboot.Host {
	return reboot.Host{Tag: r.tag, NetnsPrefix: r.prefix, RunDir: r.runDir, PoolRoot: filepath.Join(r.cfg.DataDir, "storage"), VdevDir: r.cfg.VdevDir,
		Services: []string{agent.VPCServiceDir(r.cfg)}}
}

// mutate picks what the iteration does before the kill, and the config that
// follows (nil: no change).
func (r *run) mutate() (string, []sledconfig.Zone) {
	next := slices.Clone(r.zones)
	crucibles := len(next) - 1 // the nexus is last
	switch r.rnd.IntN(4) {
	case 0:
		return "no change", nil
	case 1:
		if crucibles <= 2 {
			break
		}
		i := r.rnd.IntN(crucibles)
		return "remove a zone", slices.Delete(next, i, i+1)
	case 2:
		i := r.rnd.IntN(crucibles)
		port := 32345
		if next[i].ZoneType.Address == r.crucibleAddr(next[i], 32345) {
			port = 32346
		}
		next[i].ZoneType.Address = r.crucibleAddr(next[i], port)
		return "change a zone", next
	}
	for range 1 + r.rnd.IntN(3) {
		next = slices.Insert(next, len(next)-1, r.crucible(r.nextIdx, 32345))
		r.nextIdx++
	}
	return "add zones", next
}

// crucible returns crucible zone i on the crash test's own /64, on a pool
// of its own.
func (r *run) crucible(i, port int) sledconfig.Zone {
	z := sledconfigtest.OwnPools(r.tag, sledconfigtest.Crucible(i))[0]
	z.ZoneType.Address = fmt.Sprintf("[%s::%x]:%d", r.addrs("1cf"), i+0x10, port)
	return z
}

// addrs starts the addresses of the run's zones in the crash test's /64
// fd00:1122:3344:<subnet>::/64: their interface ids carry the run's tag, so
// that two runs on one host (each zone's host route is a /128) never take
// each other's routes.
func (r *run) addrs(subnet string) string {
	h := strings.TrimPrefix(r.tag, "ct")
	return fmt.Sprintf("fd00:1122:3344:%s:%s:%s", subnet, h[:4], h[4:])
}

func (r *run) crucibleAddr(z sledconfig.Zone, port int) string {
	a, _ := z.ServiceAddr()
	return net.JoinHostPort(a.Addr().String(), fmt.Sprint(port))
}

// nexus is a zone with a NIC, so the crash test covers the second link.
func (r *run) nexus() sledconfig.Zone {
	return sledconfigtest.OwnPools(r.tag, sledconfigtest.Nexus(999, "["+r.addrs("1cf")+"::7]:12221"))[0]
}

// put ledgers zones as the next generation, with the storage they need:
// a vdev for each of their pools (made if it is new) and their datasets.
func (r *run) put(ctx context.Context, zones []sledconfig.Zone) error {
	if err := btrfs.MakeVdevs(r.cfg.VdevDir, sledconfigtest.VdevNames(r.prefix, zones...)...); err != nil {
		return err
	}
	doc, err := json.Marshal(sledconfigtest.ConfigOnVdevs(r.gen+1, r.prefix, zones...))
	if err != nil {
		return err
	}
	if err := r.c.PutConfig(ctx, doc); err != nil {
		return fmt.Errorf("PUT /omicron-config: %w", err)
	}
	r.gen++
	r.zones = zones
	return nil
}

// startAgent runs the agent binary and waits until it answers.
func (r *run) startAgent(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(r.dir, "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(r.opts.Agent, "run", "--config", filepath.Join(r.dir, "agent.json"), "--runtime", "linux", "--data-dir", r.cfg.DataDir, "--run-dir", r.runDir,
		"--listen", r.listen, "--vdev-dir", r.cfg.VdevDir, "--skip-timesync", // no NTP zone
		"--zone-tag", r.tag, "--netns-prefix", r.prefix, "--sled-id", r.cfg.SledID, "--underlay-ip", r.cfg.UnderlayIP, "--log-level", "info",
		"--vpc-data-path") // ports (ports.go)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), r.opts.AgentEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	r.proc, r.exited = cmd, exited
	deadline := time.Now().Add(20 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := r.c.ZoneStates(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the agent exited at start (see %s)", filepath.Join(r.dir, "agent.log"))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not answer within 20s: %w", err)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// writeAgentConfig writes the agent's config file: crucibles run the
// default image with a start delay, ready when it answers GET /health.
func (r *run) writeAgentConfig() error {
	img := linux.Image{
		Command: append(slices.Clone(linux.DefaultImage.Command), "--start-delay", max(r.opts.ServiceStartDelay, 0).String()),
		Ready:   linux.Ready{HTTP: &linux.HTTPReady{Path: "/health"}},
	}
	doc, err := json.Marshal(map[string]any{"images": linux.Images{"crucible": img}})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dir, "agent.json"), doc, 0o600)
}

// kill SIGKILLs the agent and waits for it to be gone. Its zones live on.
func (r *run) kill() error {
	if r.proc == nil {
		return nil
	}
	r.proc.Process.Signal(syscall.SIGKILL)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		return errors.New("the agent did not die within 10s of SIGKILL")
	}
	r.proc = nil
	return nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func percentiles(ds []time.Duration) (p50, p99, max float64) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s)-1) + 0.5)
		return float64(s[i].Microseconds()) / 1000
	}
	return at(0.5), at(0.99), float64(s[len(s)-1].Microseconds()) / 1000
}
