package bench

// The config benchmark: a PUT /omicron-config that brings N crucible zones
// up with their storage, through a real agent with the Linux runtime, timed
// until every zone answers, against the runtime alone bringing the same
// number of zones up (the zone benchmark's runtime phase) in the same round.
//
// Each zone has a pool of its own, on a file-backed disk of the round's,
// made beforehand: a first config carries the disks and each pool's "zone"
// dataset, and the timed PUT adds every zone with its root and durable
// datasets (2N datasets and N zones).

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
	"runtime/pprof"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// PutOptions size the config benchmark.
type PutOptions struct {
	// Count is how many crucible zones the PUT brings up (200).
	Count int
	// Rounds is how many times both are timed, each on blank disks (3);
	// the results are medians.
	Rounds int
	// Timeout bounds each wait: the pools made, the zones up (5m).
	Timeout time.Duration
	// Log receives the agent's log (default: discarded).
	Log *slog.Logger
	// CPUProfile, if set, receives the CPU profile of the first round's
	// timed PUT, from the PUT until every zone answers.
	CPUProfile io.Writer
	// Progress, if set, receives a line per round, for people.
	Progress io.Writer
}

// PutResult is what `bench put` prints.
type PutResult struct {
	Machine  ZonesMachine `json:"machine"`
	Zones    int          `json:"zones"`
	Datasets int          `json:"datasets"` // made by the timed PUT
	Rounds   []PutRound   `json:"rounds"`
	// Medians over the rounds, in milliseconds: from the PUT until the
	// agent's inventory reports every zone ok (each answered its
	// readiness check), until its storage reports every dataset ok, and
	// the runtime alone bringing as many zones up.
	PutAllOKMs     float64 `json:"put_all_ok_ms"`
	PutDatasetsMs  float64 `json:"put_datasets_ok_ms"`
	RuntimeAloneMs float64 `json:"runtime_alone_ms"`
	// Ratio is the median of the rounds' put_all_ok_ms / runtime_alone_ms.
	Ratio float64 `json:"ratio"`
}

// PutRound is one round, on blank disks of its own.
type PutRound struct {
	PutAllOKMs     float64 `json:"put_all_ok_ms"`
	PutDatasetsMs  float64 `json:"put_datasets_ok_ms"`
	RuntimeAloneMs float64 `json:"runtime_alone_ms"`
	Ratio          float64 `json:"ratio"`
	// PoolsMs is how long the first config took to make the pools (not
	// part of the comparison).
	PoolsMs float64 `json:"pools_ms"`
}

// Put runs the config benchmark. It needs root, runsv and btrfs-progs.
func Put(ctx context.Context, opts PutOptions) (*PutResult, error) {
	opts.Count = cmp.Or(opts.Count, 200)
	opts.Rounds = cmp.Or(opts.Rounds, 3)
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Count < 1 || opts.Count > 1000 {
		return nil, fmt.Errorf("zone count %d: want 1–1000", opts.Count)
	}
	if opts.Rounds < 1 {
		return nil, fmt.Errorf("rounds %d: want at least 1", opts.Rounds)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("bench put needs root: it makes pools, network namespaces, links and supervised processes")
	}
	res := &PutResult{Machine: machine(), Zones: opts.Count}
	var all, ds, alone, ratios []float64
	for r := range opts.Rounds {
		progress(opts.Progress, "bench put: round %d/%d: a PUT of %d zones, and the runtime alone", r+1, opts.Rounds, opts.Count)
		// The runtime alone first in odd rounds, second in even ones.
		var round PutRound
		var err error
		steps := []func() error{
			func() (err error) { round.RuntimeAloneMs, err = runtimeAlone(ctx, opts); return err },
			func() (err error) { err = putRound(ctx, &opts, &round, &res.Datasets); return err },
		}
		if r%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err = step(); err != nil {
				return nil, fmt.Errorf("round %d: %w", r+1, err)
			}
		}
		if round.RuntimeAloneMs > 0 {
			round.Ratio = round3(round.PutAllOKMs / round.RuntimeAloneMs)
		}
		res.Rounds = append(res.Rounds, round)
		all = append(all, round.PutAllOKMs)
		ds = append(ds, round.PutDatasetsMs)
		alone = append(alone, round.RuntimeAloneMs)
		ratios = append(ratios, round.Ratio)
	}
	res.PutAllOKMs, res.PutDatasetsMs, res.RuntimeAloneMs = median(all), median(ds), median(alone)
	res.Ratio = median(ratios)
	return res, nil
}

// runtimeAlone times the Linux runtime bringing opts.Count zones up at once
// (as `bench zones` does), and takes them down again.
func runtimeAlone(ctx context.Context, opts PutOptions) (ms float64, err error) {
	b, err := newZonesBench(ZonesOptions{Count: opts.Count, Rounds: 1, PhaseTimeout: opts.Timeout})
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := b.cleanup(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up the runtime's zones: %w", cerr))
		}
	}()
	up, _, err := b.measure(ctx, true)
	if err != nil {
		return 0, fmt.Errorf("the runtime alone: %w", err)
	}
	return float64(up.wall.Microseconds()) / 1000, nil
}

// putRound makes the pools through a fresh agent, then times the PUT that
// brings the zones up, and removes everything it made.
func putRound(ctx context.Context, opts *PutOptions, round *PutRound, datasets *int) (err error) {
	var b [3]byte
	rand.Read(b[:])
	tag := "bp" + hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp("", "sled-agent-bench-put-")
	if err != nil {
		return err
	}
	cfg := agent.Config{DataDir: filepath.Join(dir, "data"), Runtime: "linux", Listen: "127.0.0.1:0", ZoneTag: tag, NetnsPrefix: tag + "-",
		SkipTimesync: true, // its zones do not wait for an NTP zone: it has none
		VdevDir:      filepath.Join(dir, "vdev"), UnderlayIP: zoneSled}
	if cfg.RunDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-put-"); err != nil {
		os.RemoveAll(dir)
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, terr := agent.Teardown(ctx, cfg, nil); terr != nil {
			err = errors.Join(err, fmt.Errorf("tearing down: %w", terr))
		}
		if rerr := btrfs.ReleaseUnder(ctx, dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("releasing the pools: %w", rerr))
		}
		agent.RemoveHostLock(tag) // best effort: a few bytes in /run/lock
		os.RemoveAll(dir)
		os.RemoveAll(cfg.RunDir)
	}()

	zones := make([]sledconfig.Zone, opts.Count)
	for i := range zones {
		zones[i] = sledconfigtest.OwnPools(tag, sledconfigtest.Crucible(i))[0]
		zones[i].ZoneType.Address = fmt.Sprintf("[%s]:%d", zoneAddr(i), servicePort)
	}
	if err := btrfs.MakeVdevs(cfg.VdevDir, sledconfigtest.VdevNames(tag+"-", zones...)...); err != nil {
		return err
	}
	full := sledconfigtest.ConfigOnVdevs(2, tag+"-", zones...)
	pools, err := poolsOnly(full)
	if err != nil {
		return err
	}
	*datasets = len(full.Datasets) - len(pools.Datasets)
	poolsDoc, err := json.Marshal(pools)
	if err != nil {
		return err
	}
	fullDoc, err := json.Marshal(full)
	if err != nil {
		return err
	}

	a, c, stop, err := startAgent(ctx, cfg, opts.Log)
	if err != nil {
		return err
	}
	defer func() {
		if serr := stop(); err == nil {
			err = serr
		}
	}()
	if err := waitListed(ctx, a, opts.Timeout); err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.PutConfig(ctx, poolsDoc); err != nil {
		return err
	}
	poolsOK := exampleConfig{disks: len(pools.Disks), datasets: len(pools.Datasets)}
	_, end, err := waitStorageOK(ctx, a.Storage(), poolsOK, t0, opts.Timeout, time.Millisecond)
	if err != nil {
		return fmt.Errorf("making the pools: %w", err)
	}
	round.PoolsMs = msBetween(t0, end)

	// The timed PUT. The storage status is watched meanwhile, to say how
	// much of the time the datasets took.
	fullOK := exampleConfig{disks: len(full.Disks), datasets: len(full.Datasets)}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dsDone := make(chan float64, 1)
	t0 = time.Now()
	go func() {
		// Every 20 ms, as the inventory below: what is timed is the
		// agent's, not the watchers'.
		_, end, err := waitStorageOK(wctx, a.Storage(), fullOK, t0, opts.Timeout, 20*time.Millisecond)
		if err != nil {
			dsDone <- -1
			return
		}
		dsDone <- msBetween(t0, end)
	}()
	if opts.CPUProfile != nil {
		if err := pprof.StartCPUProfile(opts.CPUProfile); err != nil {
			return err
		}
		opts.CPUProfile = nil
		defer pprof.StopCPUProfile()
	}
	if err := c.PutConfig(ctx, fullDoc); err != nil {
		return err
	}
	// Every 20 ms: a 200-zone inventory read and decoded every 5 ms would
	// take a tenth of the machine's CPU from what is timed.
	round.PutAllOKMs, err = waitAllOKEvery(ctx, c, opts.Count, t0, opts.Timeout, 20*time.Millisecond)
	pprof.StopCPUProfile()
	if err != nil {
		return fmt.Errorf("bringing %d zones up: %w", opts.Count, err)
	}
	if round.PutDatasetsMs = <-dsDone; round.PutDatasetsMs < 0 { // waitStorageOK has its deadline
		return errors.New("the storage status never reported every dataset ok")
	}
	return nil
}

// poolsOnly returns c's disks and each pool's "zone" dataset, and no zone,
// at the generation before c's.
func poolsOnly(c *sledconfig.Config) (*sledconfig.Config, error) {
	// A new config, not a copy: one that came from Parse marshals back to
	// the document it came from.
	out := sledconfig.Config{
		Generation: c.Generation - 1, Disks: c.Disks, Datasets: map[string]json.RawMessage{}, Zones: map[string]sledconfig.Zone{},
		Measurements: c.Measurements, RemoveMupdateOverride: c.RemoveMupdateOverride, HostPhase2: c.HostPhase2,
	}
	for k, raw := range c.Datasets {
		var ds sledconfig.DatasetConfig
		if err := json.Unmarshal(raw, &ds); err != nil {
			return nil, fmt.Errorf("dataset %s: %w", k, err)
		}
		if ds.Name.Kind == "zone" {
			out.Datasets[k] = raw
		}
	}
	return &out, nil
}
