package bench

// The restart benchmark: an agent with N running zones stops, and a new one
// starts on the same data dir. How long until its inventory reports every
// zone ok, and how many zones were restarted on the way (must be 0)?

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
	"os"
	"path/filepath"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// RestartOptions size the restart benchmark.
type RestartOptions struct {
	// Count is how many zones run when the agent restarts (200).
	Count int
	// Rounds is how many restarts are timed (3); the result is the median.
	Rounds int
	// Runtime is "linux" (real zones; root) or "sim" (its simulated OS in
	// the data dir).
	Runtime string
	// Timeout bounds each wait: all zones up at first, and each recovery (5m).
	Timeout time.Duration
	// Log receives the agents' logs (default: discarded).
	Log *slog.Logger
	// Progress, if set, receives a line per phase and round, for people.
	Progress io.Writer
}

// RestartResult is what `bench restart` prints.
type RestartResult struct {
	Machine ZonesMachine   `json:"machine"`
	Runtime string         `json:"runtime"`
	Zones   int            `json:"zones"`
	Rounds  []RestartRound `json:"rounds"`
	// Medians over the rounds, in milliseconds from the new agent's start
	// (agent.New): answering its API, done restoring its state, and its
	// inventory reporting every zone ok.
	AnsweringMs  float64 `json:"answering_ms"`
	RestoredMs   float64 `json:"restored_ms"`
	AllZonesOKMs float64 `json:"all_zones_ok_ms"`
	// Restarted sums, over the rounds, the zones whose service was
	// restarted (linux: another PID; sim: another incarnation).
	Restarted int `json:"restarted"`
}

// RestartRound is one timed restart.
type RestartRound struct {
	AnsweringMs  float64 `json:"answering_ms"`
	RestoredMs   float64 `json:"restored_ms"`
	AllZonesOKMs float64 `json:"all_zones_ok_ms"`
	Adopted      int     `json:"adopted"`
	Restarted    int     `json:"restarted"`
}

// Restart runs the restart benchmark.
func Restart(ctx context.Context, opts RestartOptions) (res *RestartResult, err error) {
	opts.Count = cmp.Or(opts.Count, 200)
	opts.Rounds = cmp.Or(opts.Rounds, 3)
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.Runtime == "" {
		opts.Runtime = "linux"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Count < 1 || opts.Count > 10000 {
		return nil, fmt.Errorf("zone count %d: want 1–10000", opts.Count)
	}
	var b [3]byte
	rand.Read(b[:])
	tag := "br" + hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp("", "sled-agent-bench-restart-")
	if err != nil {
		return nil, err
	}
	cfg := agent.Config{DataDir: filepath.Join(dir, "data"), Runtime: opts.Runtime, Listen: "127.0.0.1:0", ZoneTag: tag, NetnsPrefix: tag + "-",
		SkipTimesync: true, UnderlayIP: zoneSled} // its zones do not wait for an NTP zone: it has none
	switch opts.Runtime {
	case "linux":
		if os.Geteuid() != 0 {
			os.RemoveAll(dir)
			return nil, errors.New("bench restart --runtime linux needs root")
		}
		if cfg.RunDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-restart-"); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		// Each crucible's pool on a file-backed disk of the benchmark's.
		cfg.VdevDir = filepath.Join(dir, "vdev")
	case "sim":
	default:
		os.RemoveAll(dir)
		return nil, fmt.Errorf("runtime %q: want linux or sim", opts.Runtime)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, terr := agent.Teardown(ctx, cfg, nil); terr != nil {
			err = errors.Join(err, fmt.Errorf("tearing down: %w", terr))
			res = nil
		}
		if cfg.Runtime == "linux" {
			if rerr := btrfs.ReleaseUnder(ctx, dir); rerr != nil {
				err = errors.Join(err, fmt.Errorf("releasing the pools: %w", rerr))
				res = nil
			}
			agent.RemoveHostLock(tag) // best effort: a few bytes in /run/lock
		}
		os.RemoveAll(dir)
		if cfg.RunDir != "" {
			os.RemoveAll(cfg.RunDir)
		}
	}()

	zones := make([]sledconfig.Zone, opts.Count)
	for i := range zones {
		zones[i] = sledconfigtest.OwnPools(tag, sledconfigtest.Crucible(i))[0]
		zones[i].ZoneType.Address = fmt.Sprintf("[%s]:%d", zoneAddr(i), servicePort)
	}
	if cfg.VdevDir != "" {
		if err := btrfs.MakeVdevs(cfg.VdevDir, sledconfigtest.VdevNames(tag+"-", zones...)...); err != nil {
			return nil, err
		}
	}
	doc, err := json.Marshal(sledconfigtest.ConfigOnVdevs(1, tag+"-", zones...))
	if err != nil {
		return nil, err
	}

	// The first agent brings the zones up.
	progress(opts.Progress, "bench restart: bringing %d zones up", opts.Count)
	_, c, stop, err := startAgent(ctx, cfg, opts.Log)
	if err != nil {
		return nil, err
	}
	if err := c.PutConfig(ctx, doc); err != nil {
		stop()
		return nil, err
	}
	if _, err := waitAllOK(ctx, c, opts.Count, time.Now(), opts.Timeout); err != nil {
		stop()
		return nil, fmt.Errorf("bringing %d zones up: %w", opts.Count, err)
	}
	if err := stop(); err != nil {
		return nil, err
	}

	res = &RestartResult{Machine: machine(), Runtime: opts.Runtime, Zones: opts.Count}
	for r := range opts.Rounds {
		progress(opts.Progress, "bench restart: round %d/%d: an agent restarted over %d zones", r+1, opts.Rounds, opts.Count)
		before, err := incarnations(cfg, zones)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		a, c, stop, err := startAgent(ctx, cfg, opts.Log)
		if err != nil {
			return nil, err
		}
		round, err := timeRestart(ctx, a, c, t0, opts)
		if err == nil {
			var after map[string]uint64
			if after, err = incarnations(cfg, zones); err == nil {
				for name, n := range before {
					if after[name] != n {
						round.Restarted++
					}
				}
			}
		}
		if serr := stop(); err == nil {
			err = serr
		}
		if err != nil {
			return nil, err
		}
		res.Rounds = append(res.Rounds, round)
		res.Restarted += round.Restarted
	}
	med := func(f func(RestartRound) float64) float64 {
		xs := make([]float64, len(res.Rounds))
		for i, r := range res.Rounds {
			xs[i] = f(r)
		}
		return median(xs)
	}
	res.AnsweringMs = med(func(r RestartRound) float64 { return r.AnsweringMs })
	res.RestoredMs = med(func(r RestartRound) float64 { return r.RestoredMs })
	res.AllZonesOKMs = med(func(r RestartRound) float64 { return r.AllZonesOKMs })
	return res, nil
}

// startAgent builds and runs an agent; stop ends it (its zones keep running).
func startAgent(ctx context.Context, cfg agent.Config, log *slog.Logger) (*agent.Agent, *client.Client, func() error, error) {
	a, err := agent.New(cfg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := client.New("http://" + a.Addr())
	if err != nil {
		a.Close()
		return nil, nil, nil, err
	}
	c.Timeout = 30 * time.Second
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	stop := func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			return errors.New("the agent did not stop within a minute")
		}
	}
	return a, c, stop, nil
}

// timeRestart times a restarted agent's recovery.
func timeRestart(ctx context.Context, a *agent.Agent, c *client.Client, t0 time.Time, opts RestartOptions) (RestartRound, error) {
	var round RestartRound
	ms := func() float64 { return float64(time.Since(t0).Microseconds()) / 1000 }
	deadline := time.Now().Add(opts.Timeout)
	for {
		if _, err := c.ZoneStates(ctx); err == nil {
			round.AnsweringMs = ms()
			break
		}
		if time.Now().After(deadline) {
			return round, errors.New("the restarted agent did not answer")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-a.Reconciler().Restored():
		round.RestoredMs = ms()
	case <-time.After(time.Until(deadline)):
		return round, errors.New("the restarted agent did not restore its state")
	}
	ok, err := waitAllOK(ctx, c, opts.Count, t0, opts.Timeout)
	if err != nil {
		return round, err
	}
	round.AllZonesOKMs = ok
	rs, err := c.Restore(ctx)
	if err != nil {
		return round, err
	}
	round.Adopted = rs.Adopted
	return round, nil
}

// waitAllOK polls the inventory every 5 ms until its last reconciliation
// reports n zones, every one ok, and returns the milliseconds since t0.
func waitAllOK(ctx context.Context, c *client.Client, n int, t0 time.Time, timeout time.Duration) (float64, error) {
	return waitAllOKEvery(ctx, c, n, t0, timeout, 5*time.Millisecond)
}

// waitAllOKEvery is waitAllOK polling every poll.
func waitAllOKEvery(ctx context.Context, c *client.Client, n int, t0 time.Time, timeout, poll time.Duration) (float64, error) {
	deadline := time.Now().Add(timeout)
	last := "no inventory"
	for {
		inv, err := c.Inventory(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case inv.LastReconciliation == nil:
			last = "no reconciliation yet"
		default:
			ok := 0
			for _, r := range inv.LastReconciliation.Zones {
				if r.Result == "ok" {
					ok++
				}
			}
			if ok == n && len(inv.LastReconciliation.Zones) == n {
				return float64(time.Since(t0).Microseconds()) / 1000, nil
			}
			last = fmt.Sprintf("%d of %d zones ok", ok, n)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not every zone ok within %s: %s", timeout, last)
		}
		if err := sleepCtx(ctx, poll); err != nil {
			return 0, err
		}
	}
}

// incarnations identifies each zone's running service while no agent runs:
// its PID (linux), or its incarnation in the simulated OS (sim).
func incarnations(cfg agent.Config, zones []sledconfig.Zone) (map[string]uint64, error) {
	out := map[string]uint64{}
	var simOS *sim.Runtime
	if cfg.Runtime == "sim" {
		var err error
		if simOS, err = sim.Open(sim.Options{StateFile: filepath.Join(cfg.DataDir, agent.SimStateFile)}); err != nil {
			return nil, err
		}
	}
	for _, z := range zones {
		name := z.Name()
		if simOS != nil {
			out[name], _ = simOS.Incarnation(name)
			continue
		}
		st, err := supervise.Status(filepath.Join(cfg.RunDir, cfg.ZoneTag, name))
		if err != nil {
			return nil, err
		}
		out[name] = uint64(st.PID)
	}
	return out, nil
}
