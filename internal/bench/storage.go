package bench

// The storage benchmark: the storage half of a sled config (the example
// config's 10 disks and 54 datasets, on disks of the run's own, and no
// zones, so that only storage is measured) through a real agent. Each round
// times three things: from blank disks to every disk and dataset ok, a
// storage pass that changes nothing, and a restarted agent adopting it all.

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
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// StorageOptions size the storage benchmark.
type StorageOptions struct {
	// Rounds is how many times the whole is timed, each on blank disks
	// (3); the result is the median.
	Rounds int
	// Passes is how many no-op storage passes are timed in each round (20).
	Passes int
	// Runtime is "linux" (btrfs on file-backed disks; root) or "sim" (the
	// simulated machine in the data dir).
	Runtime string
	// Timeout bounds each wait: the storage ensured, one pass, the
	// adoption (5m).
	Timeout time.Duration
	// Log receives the agents' logs (default: discarded).
	Log *slog.Logger
	// Progress, if set, receives a line per round and phase and a
	// periodic one in the no-op passes, for people: the result alone goes
	// to the caller.
	Progress io.Writer
}

// StorageResult is what `bench storage` prints.
type StorageResult struct {
	Machine  ZonesMachine `json:"machine"`
	Runtime  string       `json:"runtime"`
	Disks    int          `json:"disks"`
	Datasets int          `json:"datasets"`
	// Zones is 0: the config carries no zone, so only storage is measured.
	Zones  int            `json:"zones"`
	Rounds []StorageRound `json:"rounds"`
	// FromNothingMs is the median over the rounds of the time from the
	// config's PUT to a fresh agent on blank disks until its storage
	// status reports every disk and dataset ok (the end of the last
	// disk's pass).
	FromNothingMs float64 `json:"from_nothing_ms"`
	// NoopPass is every round's no-op passes together: from a Poke of the
	// storage reconciler, with everything ensured, to the end of the last
	// disk's pass (a listing of the disks, then each disk's pass at once).
	NoopPass Latency `json:"noop_pass"`
	// RestartAdoptMs is the median over the rounds of the time from a new
	// agent's start on the same data dir until every disk and dataset is
	// ok again.
	RestartAdoptMs float64 `json:"restart_adopt_ms"`
	// The changes the btrfs backend made (linux; it logs each one: a pool
	// made or mounted, quotas enabled, a dataset made or recorded, a quota
	// or compression set, a disk attached, and its warnings), summed over
	// the rounds: in the no-op passes and in the restarts they must be 0.
	// Null with the sim runtime, whose machine logs nothing.
	FromNothingChanges  *int `json:"from_nothing_backend_changes"`
	NoopPassChanges     *int `json:"noop_pass_backend_changes"`
	RestartAdoptChanges *int `json:"restart_adopt_backend_changes"`
}

// StorageRound is one round, on blank disks of its own.
type StorageRound struct {
	FromNothingMs       float64 `json:"from_nothing_ms"`
	NoopPass            Latency `json:"noop_pass"`
	RestartAdoptMs      float64 `json:"restart_adopt_ms"`
	FromNothingChanges  *int    `json:"from_nothing_backend_changes"`
	NoopPassChanges     *int    `json:"noop_pass_backend_changes"`
	RestartAdoptChanges *int    `json:"restart_adopt_backend_changes"`
}

// Storage runs the storage benchmark.
func Storage(ctx context.Context, opts StorageOptions) (*StorageResult, error) {
	opts.Rounds = cmp.Or(opts.Rounds, 3)
	opts.Passes = cmp.Or(opts.Passes, 20)
	opts.Runtime = cmp.Or(opts.Runtime, "linux")
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Rounds < 1 || opts.Passes < 1 {
		return nil, fmt.Errorf("rounds %d, passes %d: want at least 1 of each", opts.Rounds, opts.Passes)
	}
	switch opts.Runtime {
	case "linux":
		if os.Geteuid() != 0 {
			return nil, errors.New("bench storage --runtime linux needs root")
		}
	case "sim":
	default:
		return nil, fmt.Errorf("runtime %q: want linux or sim", opts.Runtime)
	}
	var b [3]byte
	rand.Read(b[:])
	tag := "bs" + hex.EncodeToString(b[:])

	res := &StorageResult{Machine: machine(), Runtime: opts.Runtime}
	var passes []time.Duration
	var fromNothing, adopt []float64
	for r := range opts.Rounds {
		sc, err := exampleStorage(tag + "-")
		if err != nil {
			return nil, err
		}
		res.Disks, res.Datasets = sc.disks, sc.datasets
		round, took, err := storageRound(ctx, opts, tag, sc, fmt.Sprintf("bench storage: round %d/%d", r+1, opts.Rounds))
		if err != nil {
			return nil, err
		}
		res.Rounds = append(res.Rounds, round)
		passes = append(passes, took...)
		fromNothing = append(fromNothing, round.FromNothingMs)
		adopt = append(adopt, round.RestartAdoptMs)
		res.FromNothingChanges = addCount(res.FromNothingChanges, round.FromNothingChanges)
		res.NoopPassChanges = addCount(res.NoopPassChanges, round.NoopPassChanges)
		res.RestartAdoptChanges = addCount(res.RestartAdoptChanges, round.RestartAdoptChanges)
	}
	res.FromNothingMs, res.RestartAdoptMs = median(fromNothing), median(adopt)
	res.NoopPass = summarize(passes)
	return res, nil
}

func addCount(sum, n *int) *int {
	if n == nil {
		return sum
	}
	s := *n
	if sum != nil {
		s += *sum
	}
	return &s
}

// storageRound runs one round in a data dir of its own, and removes
// everything it made.
// Its progress lines begin with say.
func storageRound(ctx context.Context, opts StorageOptions, tag string, sc exampleConfig, say string) (round StorageRound, passes []time.Duration, err error) {
	dir, err := os.MkdirTemp("", "sled-agent-bench-storage-")
	if err != nil {
		return round, nil, err
	}
	cfg := agent.Config{DataDir: filepath.Join(dir, "data"), Runtime: opts.Runtime, Listen: "127.0.0.1:0", ZoneTag: tag, NetnsPrefix: tag + "-",
		SkipTimesync: true, NTPNoClock: true} // no zones, and so no NTP zone
	if opts.Runtime == "linux" {
		if cfg.RunDir, err = os.MkdirTemp("/dev/shm", "sled-agent-bench-storage-"); err != nil {
			os.RemoveAll(dir)
			return round, nil, err
		}
		cfg.VdevDir = filepath.Join(dir, "vdev")
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, terr := agent.Teardown(ctx, cfg, nil); terr != nil {
			err = errors.Join(err, fmt.Errorf("tearing down: %w", terr))
		}
		if cfg.Runtime == "linux" {
			if rerr := btrfs.ReleaseUnder(ctx, dir); rerr != nil {
				err = errors.Join(err, fmt.Errorf("releasing the pools: %w", rerr))
			}
			agent.RemoveHostLock(tag) // best effort: a few bytes in /run/lock
		}
		os.RemoveAll(dir)
		if cfg.RunDir != "" {
			os.RemoveAll(cfg.RunDir)
		}
	}()
	if cfg.VdevDir != "" {
		if err := btrfs.MakeVdevs(cfg.VdevDir, sc.vdevs...); err != nil {
			return round, nil, err
		}
	}
	var changes atomic.Int64
	log := slog.New(&backendChanges{next: opts.Log.Handler(), n: &changes})
	count := func(since int64) *int {
		if cfg.Runtime != "linux" {
			return nil
		}
		n := int(changes.Load() - since)
		return &n
	}

	// From nothing: a fresh agent on blank disks, once it has looked at
	// them (attaching the file-backed ones), is given the config.
	progress(opts.Progress, "%s: %d disks and %d datasets from blank disks (%s runtime)", say, sc.disks, sc.datasets, opts.Runtime)
	a, c, stop, err := startAgent(ctx, cfg, log)
	if err != nil {
		return round, nil, err
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	if err := waitListed(ctx, a, opts.Timeout); err != nil {
		return round, nil, err
	}
	base := changes.Load()
	t0 := time.Now()
	if err := c.PutConfig(ctx, sc.doc); err != nil {
		return round, nil, err
	}
	st, end, err := waitStorageOK(ctx, a.Storage(), sc, t0, opts.Timeout, time.Millisecond)
	if err != nil {
		return round, nil, fmt.Errorf("from nothing: %w", err)
	}
	round.FromNothingMs = msBetween(t0, end)
	round.FromNothingChanges = count(base)
	ids := datasetIDs(st)
	if len(st.Observed.Pools) != sc.disks || len(ids) != sc.datasets {
		return round, nil, fmt.Errorf("from nothing: %d pools and %d datasets observed, want %d and %d", len(st.Observed.Pools), len(ids), sc.disks, sc.datasets)
	}

	// No-op passes: everything is ensured; each Poke asks for a pass of
	// every disk, as the period would. (A periodic pass falling inside
	// the run would end one of them early: the period is 30s, a run of
	// passes takes well under a second on btrfs.)
	base = changes.Load()
	progress(opts.Progress, "%s: %d no-op storage passes", say, opts.Passes)
	steps := newLoopProgress(opts.Progress, say+": no-op passes", opts.Passes)
	for i := range opts.Passes {
		t0 := time.Now()
		a.Storage().Poke()
		_, end, err := waitStorageOK(ctx, a.Storage(), sc, t0, opts.Timeout, time.Millisecond)
		if err != nil {
			return round, nil, fmt.Errorf("no-op pass: %w", err)
		}
		passes = append(passes, end.Sub(t0))
		steps.done(i + 1)
	}
	round.NoopPass = summarize(passes)
	round.NoopPassChanges = count(base)
	err = stop()
	stop = nil
	if err != nil {
		return round, nil, err
	}

	// Restart: a new agent on the same data dir adopts the pools and the
	// datasets as they are (the pools stay mounted while no agent runs).
	progress(opts.Progress, "%s: a new agent adopting them", say)
	base = changes.Load()
	t0 = time.Now()
	a, _, stop, err = startAgent(ctx, cfg, log)
	if err != nil {
		return round, nil, err
	}
	st, end, err = waitStorageOK(ctx, a.Storage(), sc, t0, opts.Timeout, time.Millisecond)
	if err != nil {
		return round, nil, fmt.Errorf("restart: %w", err)
	}
	round.RestartAdoptMs = msBetween(t0, end)
	round.RestartAdoptChanges = count(base)
	after := datasetIDs(st)
	for name, id := range ids {
		if after[name] != id {
			return round, nil, fmt.Errorf("restart: dataset %s has id %q, %q before: it was not adopted as it was", name, after[name], id)
		}
	}
	err = stop()
	stop = nil
	return round, passes, err
}

func msBetween(t0, t1 time.Time) float64 { return float64(t1.Sub(t0).Microseconds()) / 1000 }

// datasetIDs returns the observed datasets' ids, by name.
func datasetIDs(st storage.Status) map[string]string {
	out := map[string]string{}
	for _, d := range st.Observed.Datasets {
		out[d.Dataset.Name] = d.Dataset.ID
	}
	return out
}

// waitListed waits until a started agent's storage reconciler runs (the
// zones are restored) and has listed the disks.
func waitListed(ctx context.Context, a *agent.Agent, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for a.Storage().Status().ListedAt == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not list its disks within %s", timeout)
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// waitStorageOK polls the storage status until it reports every configured
// disk and dataset ok, from passes that ended at or after since, and
// returns that status and the end of its latest pass. Passes are timed by
// their end as the reconciler records it (CheckedAt), not by when a poll
// saw it, so a poll every `every` costs no precision.
func waitStorageOK(ctx context.Context, s *storage.Reconciler, sc exampleConfig, since time.Time, timeout, every time.Duration) (storage.Status, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		st := s.Status()
		end, why := storageOK(st, sc, since)
		if why == "" {
			return st, end, nil
		}
		if time.Now().After(deadline) {
			return st, time.Time{}, fmt.Errorf("storage not ok within %s: %s", timeout, why)
		}
		if err := sleepCtx(ctx, every); err != nil {
			return st, time.Time{}, err
		}
	}
}

// storageOK says why st is not yet every disk and dataset of sc ok, from
// passes that ended at or after since ("" if it is), and when the latest
// of those passes ended.
func storageOK(st storage.Status, sc exampleConfig, since time.Time) (time.Time, string) {
	if !st.Configured {
		return time.Time{}, "no storage config yet"
	}
	if len(st.Disks) != sc.disks || len(st.Datasets) != sc.datasets {
		return time.Time{}, fmt.Sprintf("%d disks and %d datasets configured, want %d and %d", len(st.Disks), len(st.Datasets), sc.disks, sc.datasets)
	}
	var end time.Time
	for _, d := range st.Disks {
		switch {
		case d.CheckedAt == nil || d.CheckedAt.Before(since):
			return time.Time{}, fmt.Sprintf("disk %s: its pass has not ended yet", d.ID)
		case !d.Result.OK:
			return time.Time{}, fmt.Sprintf("disk %s: %s", d.ID, d.Result.Message)
		}
		if d.CheckedAt.After(end) {
			end = *d.CheckedAt
		}
	}
	for _, d := range st.Datasets {
		if !d.Result.OK {
			return time.Time{}, fmt.Sprintf("dataset %s: %s", d.Name, d.Result.Message)
		}
	}
	return end, ""
}

// exampleConfig is the storage half of the example sled config on the
// run's own disks.
type exampleConfig struct {
	doc             []byte
	vdevs           []string // the synthetic disks' names (u2_<name>.vdev)
	disks, datasets int
}

// exampleStorage returns the example config's disks and datasets, and no
// zone, with each disk replaced by a synthetic one named prefix<index>
// (serial synthetic-serial-<prefix><index>, as sledconfigtest.ConfigOnVdevs
// names them) and each pool id by a new one: two filesystems of the same id
// are one to btrfs, and other runs, tests among them, use the example's
// ids. Datasets keep their ids, kinds and properties, on their disk's new
// pool.
func exampleStorage(prefix string) (exampleConfig, error) {
	ex, err := sledconfig.Parse(sledconfig.Example())
	if err != nil {
		return exampleConfig{}, fmt.Errorf("the example config: %w", err)
	}
	c := sledconfig.Config{
		Generation:            1,
		Disks:                 map[string]json.RawMessage{},
		Datasets:              map[string]json.RawMessage{},
		Zones:                 map[string]sledconfig.Zone{},
		Measurements:          ex.Measurements,
		RemoveMupdateOverride: ex.RemoveMupdateOverride,
		HostPhase2:            ex.HostPhase2,
	}
	var out exampleConfig
	disks := ex.DiskConfigs()
	keys := slices.Sorted(maps.Keys(disks))
	pools := map[string]string{} // the example's pool name: ours
	for i, k := range keys {
		d := disks[k]
		name := fmt.Sprintf("%s%d", prefix, i)
		pool := uuid.NewString()
		pools[storage.PoolName(d.PoolID)] = storage.PoolName(pool)
		d.Identity = sledconfig.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "synthetic-serial-" + name}
		d.PoolID = pool
		if c.Disks[k], err = json.Marshal(d); err != nil {
			return out, err
		}
		out.vdevs = append(out.vdevs, name)
	}
	for k, ds := range ex.DatasetConfigs() {
		p, ok := pools[ds.Name.PoolName]
		if !ok {
			return out, fmt.Errorf("the example config's dataset %s is on pool %s, which no disk carries", k, ds.Name.PoolName)
		}
		ds.Name.PoolName = p
		if c.Datasets[k], err = json.Marshal(ds); err != nil {
			return out, err
		}
	}
	if out.doc, err = json.Marshal(&c); err != nil {
		return out, err
	}
	out.disks, out.datasets = len(c.Disks), len(c.Datasets)
	return out, nil
}

// backendChanges is a log handler that counts the records the btrfs
// backend logs (component "storage-btrfs") at info level or above: it logs
// every change it makes, and nothing else but its warnings. It passes
// every record on to next.
type backendChanges struct {
	next slog.Handler
	n    *atomic.Int64
	// backend: this handler's logger is the backend's.
	backend bool
}

var _ slog.Handler = (*backendChanges)(nil)

func (h *backendChanges) Enabled(ctx context.Context, l slog.Level) bool {
	return h.backend && l >= slog.LevelInfo || h.next.Enabled(ctx, l)
}

func (h *backendChanges) Handle(ctx context.Context, r slog.Record) error {
	if h.backend && r.Level >= slog.LevelInfo {
		h.n.Add(1)
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *backendChanges) WithAttrs(attrs []slog.Attr) slog.Handler {
	backend := h.backend
	for _, a := range attrs {
		if a.Key == "component" {
			backend = a.Value.String() == "storage-btrfs"
		}
	}
	return &backendChanges{next: h.next.WithAttrs(attrs), n: h.n, backend: backend}
}

func (h *backendChanges) WithGroup(name string) slog.Handler {
	return &backendChanges{next: h.next.WithGroup(name), n: h.n, backend: h.backend}
}
