// Package bench measures the agent: API latency under load with a zone whose
// start hangs, and the cost of a reconcile pass that changes nothing.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// Options size the benchmark.
type Options struct {
	// APIZones is the size of the config for the API measurements (1000).
	APIZones int
	// Requests is how many of each request are timed (200).
	Requests int
	// PassZones are the config sizes for the no-op pass measurement.
	PassZones []int
	// Passes is how many no-op passes are timed at each size (50).
	Passes int
	// Progress, if set, receives a line per phase as it begins, for
	// people: the result alone goes to the caller.
	Progress io.Writer
}

// phase says on Progress, if set, what the benchmark does now.
func (o Options) phase(format string, args ...any) { progress(o.Progress, "bench: "+format, args...) }

// progress writes a line for people to w, if set: what a benchmark does
// now, a line per phase or round, never per request.
func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// progressEvery is how often a long loop says how far it got.
const progressEvery = 10 * time.Second

// loopProgress says on w, if set, how far a loop of n timed steps got: a
// line at most every progressEvery, and one when the last step is done.
type loopProgress struct {
	w    io.Writer
	what string
	n    int
	last time.Time
}

func newLoopProgress(w io.Writer, what string, n int) *loopProgress {
	return &loopProgress{w: w, what: what, n: n, last: time.Now()}
}

// done says that step i (from 1) is done.
func (p *loopProgress) done(i int) {
	if p.w == nil {
		return
	}
	if now := time.Now(); i >= p.n || now.Sub(p.last) >= progressEvery {
		p.last = now
		progress(p.w, "%s: %d/%d", p.what, i, p.n)
	}
}

// Latency summarises timed operations, in milliseconds.
type Latency struct {
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// PassCost is the cost of a reconcile pass that changes nothing.
type PassCost struct {
	Zones int `json:"zones"`
	Latency
}

// Result is what the bench command prints.
type Result struct {
	Machine struct {
		CPUs   int    `json:"cpus"`
		GOOS   string `json:"goos"`
		GOARCH string `json:"goarch"`
		Go     string `json:"go"`
	} `json:"machine"`
	APIZones      int        `json:"api_zones"`
	HangingZones  int        `json:"hanging_zones"`
	PutConfig     Latency    `json:"put_omicron_config"`
	GetInventory  Latency    `json:"get_inventory"`
	InventoryKiB  int        `json:"inventory_kib"`
	NoopPass      []PassCost `json:"noop_reconcile_pass"`
	TotalDuration string     `json:"total_duration"`
}

// Run runs the benchmarks.
func Run(ctx context.Context, opts Options) (*Result, error) {
	t0 := time.Now()
	res := &Result{APIZones: opts.APIZones, HangingZones: 1}
	res.Machine.CPUs = runtime.NumCPU()
	res.Machine.GOOS, res.Machine.GOARCH, res.Machine.Go = runtime.GOOS, runtime.GOARCH, runtime.Version()
	if err := benchAPI(ctx, opts, res); err != nil {
		return nil, fmt.Errorf("API benchmark: %w", err)
	}
	for _, n := range opts.PassZones {
		opts.phase("%d no-op passes at %d zones", opts.Passes, n)
		pc, err := benchNoopPass(ctx, n, opts.Passes)
		if err != nil {
			return nil, fmt.Errorf("no-op pass at %d zones: %w", n, err)
		}
		res.NoopPass = append(res.NoopPass, *pc)
	}
	res.TotalDuration = time.Since(t0).Round(time.Millisecond).String()
	return res, nil
}

// configDoc is an n-zone config document of the given generation.
func configDoc(gen uint64, zones []sledconfig.Zone) []byte {
	b, err := json.Marshal(sledconfigtest.Config(gen, zones...))
	if err != nil {
		panic(err)
	}
	return b
}

func benchAPI(ctx context.Context, opts Options, res *Result) error {
	dir, err := os.MkdirTemp("", "sled-agent-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a, err := agent.New(agent.Config{Listen: "127.0.0.1:0", DataDir: dir, SkipTimesync: true /* no NTP zone */}, nil)
	if err != nil {
		return err
	}
	zones := sledconfigtest.Crucibles(opts.APIZones)
	if err := a.Sim().SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{zones[0].ID: {Start: "hang"}}}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	defer func() { cancel(); <-errc }()

	c, err := client.New("http://" + a.Addr())
	if err != nil {
		return err
	}
	opts.phase("starting %d zones, one of them hanging", len(zones))
	if err := c.PutConfig(ctx, configDoc(1, zones)); err != nil {
		return err
	}
	// Wait (bounded) for every zone but the hanging one to run.
	deadline := time.Now().Add(time.Minute)
	for len(a.Reconciler().RunningZones()) < len(zones)-1 {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d zones running after a minute", len(a.Reconciler().RunningZones()), len(zones)-1)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Pre-encode the documents so only the request is timed.
	docs := make([][]byte, opts.Requests)
	for i := range docs {
		docs[i] = configDoc(uint64(i+2), zones)
	}
	var put, get []time.Duration
	opts.phase("%d config puts at %d zones", opts.Requests, len(zones))
	for _, doc := range docs {
		t := time.Now()
		if err := c.PutConfig(ctx, doc); err != nil {
			return err
		}
		put = append(put, time.Since(t))
	}
	// The answers are read into one buffer: the bench's client shares the
	// agent's process and collector, and a fresh 5 MB per answer would
	// have the collector run, and the client assist it, every few
	// requests, timing the harness's garbage rather than the agent.
	var raw []byte
	opts.phase("%d inventory reads at %d zones", opts.Requests, len(zones))
	for range opts.Requests {
		t := time.Now()
		raw, err = c.InventoryRawInto(ctx, raw)
		if err != nil {
			return err
		}
		get = append(get, time.Since(t))
		res.InventoryKiB = len(raw) / 1024
	}
	if zs, _ := a.Reconciler().Zone(zones[0].Name()); zs.State != reconciler.StateStarting {
		return fmt.Errorf("the hanging zone is %q, not starting: the measurement did not run beside a hang", zs.State)
	}
	res.PutConfig, res.GetInventory = summarize(put), summarize(get)
	return nil
}

// benchNoopPass times passes over a config in which every zone already runs.
func benchNoopPass(ctx context.Context, n, passes int) (*PassCost, error) {
	rt := sim.New(sim.Options{})
	r := reconciler.New(rt, nil, reconciler.Options{RelistPeriod: time.Hour})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	zones := sledconfigtest.Crucibles(n)
	cfgs := make([]*sledconfig.Config, passes+1)
	for i := range cfgs {
		cfgs[i] = sledconfigtest.Config(uint64(i+1), zones...)
	}
	wait := func(passes uint64) (reconciler.Status, error) {
		deadline := time.Now().Add(time.Minute)
		for {
			st := r.Status()
			if st.Passes >= passes && st.Phase == reconciler.PhaseIdle {
				return st, nil
			}
			if time.Now().After(deadline) {
				return st, fmt.Errorf("pass %d did not complete within a minute", passes)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	r.Update(cfgs[0])
	st, err := wait(1)
	if err != nil {
		return nil, err
	}
	if got := len(r.RunningZones()); got != n {
		return nil, fmt.Errorf("%d of %d zones running", got, n)
	}
	var took []time.Duration
	for i := 1; i <= passes; i++ {
		r.Update(cfgs[i])
		if st, err = wait(st.Passes + 1); err != nil {
			return nil, err
		}
		took = append(took, st.RanFor)
	}
	return &PassCost{Zones: n, Latency: summarize(took)}, nil
}

func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	// Milliseconds to a tenth of a microsecond: round trips of tens of
	// microseconds are compared.
	ms := func(d time.Duration) float64 { return float64(d/100) / 1e4 }
	pick := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return Latency{N: len(s), P50ms: ms(pick(0.50)), P99ms: ms(pick(0.99)), MaxMs: ms(s[len(s)-1])}
}
