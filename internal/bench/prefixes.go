package bench

// The prefix benchmark: an agent (sim runtime) keeps its prefixes in a DDM
// simulator on loopback. How long from the PUT that removes an internal DNS
// zone to its prefix being gone from DDM? And from DDM coming back, empty,
// after an outage, to every prefix being there again?

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// PrefixOptions size the prefix benchmark.
type PrefixOptions struct {
	// Withdrawals is how many DNS zone removals are timed (50).
	Withdrawals int
	// Recoveries is how many DDM outages are timed (10).
	Recoveries int
	// Period is the prefix reconciler's period (30s, the default): the
	// withdrawals must not depend on it.
	Period time.Duration
	// Progress, if set, receives a line per phase and a periodic one in
	// the timed loops, for people: the result alone goes to the caller.
	Progress io.Writer
}

// PrefixResult is what `bench prefixes` prints.
type PrefixResult struct {
	Machine ZonesMachine `json:"machine"`
	Period  string       `json:"period"`
	// Withdraw: from the PUT without the DNS zone to its prefix gone.
	Withdraw Latency `json:"withdraw_after_expunge"`
	// Recover: from DDM answering again, empty, after an outage of 1–3 s
	// during which the config changed, to DDM holding exactly the wanted
	// prefixes. (A DDM that restarts empty while nothing changes is
	// repaired at the next period.)
	Recover Latency `json:"converge_after_ddm_returns"`
}

// Prefixes runs the prefix benchmark.
func Prefixes(ctx context.Context, opts PrefixOptions) (*PrefixResult, error) {
	opts.Withdrawals = cmp.Or(opts.Withdrawals, 50)
	opts.Recoveries = cmp.Or(opts.Recoveries, 10)
	if opts.Period <= 0 {
		opts.Period = 30 * time.Second
	}
	dir, err := os.MkdirTemp("", "sled-agent-bench-prefixes-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	d := ddmsim.New(nil)
	if err := d.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer d.Close()
	progress(opts.Progress, "bench prefixes: starting an agent (sim runtime) that keeps its prefixes in a DDM simulator")
	cfg := agent.Config{DataDir: dir, Listen: "127.0.0.1:0", DDMURL: d.URL(), BootstrapPrefix: "fdb0:a840:2504:101::/64", PrefixPeriod: opts.Period,
		SkipTimesync: true} // its zones do not wait for an NTP zone: it has none
	_, c, stop, err := startAgent(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	defer stop()

	dns, crucible := sledconfigtest.InternalDNS(0), sledconfigtest.Crucible(0)
	with, without := []string{"fd00:1122:3344:1::/64", "fd00:1122:3344:101::/64", "fdb0:a840:2504:101::/64"}, []string{"fd00:1122:3344:101::/64", "fdb0:a840:2504:101::/64"}
	gen := uint64(0)
	put := func(withDNS bool) error {
		gen++
		zones := []sledconfig.Zone{crucible}
		if withDNS {
			zones = append(zones, dns)
		}
		doc, err := json.Marshal(sledconfigtest.Config(gen, zones...))
		if err != nil {
			return err
		}
		return c.PutConfig(ctx, doc)
	}
	res := &PrefixResult{Machine: machine(), Period: opts.Period.String()}

	var took []time.Duration
	progress(opts.Progress, "bench prefixes: %d withdrawals of an internal DNS zone's prefix", opts.Withdrawals)
	steps := newLoopProgress(opts.Progress, "bench prefixes: withdrawals", opts.Withdrawals)
	for i := range opts.Withdrawals {
		if err := put(true); err != nil {
			return nil, err
		}
		if _, err := waitDDM(ctx, d, with, time.Time{}); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := put(false); err != nil {
			return nil, err
		}
		dt, err := waitDDM(ctx, d, without, t0)
		if err != nil {
			return nil, err
		}
		took = append(took, dt)
		steps.done(i + 1)
	}
	res.Withdraw = summarize(took)

	took = nil
	progress(opts.Progress, "bench prefixes: %d DDM outages of 1 to 3 s, each followed by its recovery", opts.Recoveries)
	steps = newLoopProgress(opts.Progress, "bench prefixes: recoveries", opts.Recoveries)
	for i := range opts.Recoveries {
		// DDM goes away, empty; the config changes meanwhile (the DNS zone
		// comes or goes), so the agent's passes fail and it retries.
		want := with
		if i%2 == 1 {
			want = without
		}
		if err := d.SetFault(ddmsim.FaultRefuse); err != nil {
			return nil, err
		}
		d.RestartEmpty()
		if err := put(i%2 == 0); err != nil {
			return nil, err
		}
		if err := sleepCtx(ctx, time.Second+rand.N(2*time.Second)); err != nil {
			return nil, err
		}
		if err := d.SetFault(ddmsim.FaultNone); err != nil {
			return nil, err
		}
		dt, err := waitDDM(ctx, d, want, time.Now())
		if err != nil {
			return nil, err
		}
		took = append(took, dt)
		steps.done(i + 1)
	}
	res.Recover = summarize(took)
	return res, nil
}

// waitDDM waits until d originates exactly want, and returns the time
// since t0.
func waitDDM(ctx context.Context, d *ddmsim.Server, want []string, t0 time.Time) (time.Duration, error) {
	var got []string
	dt, err := waitUntil(ctx, t0, func() bool {
		got = got[:0]
		for _, p := range d.Originated() {
			got = append(got, p.String())
		}
		return slices.Equal(got, want)
	})
	if err != nil {
		return 0, fmt.Errorf("DDM originates %v, want %v: %w", got, want, err)
	}
	return dt, nil
}

func machine() ZonesMachine {
	return ZonesMachine{CPUs: runtime.NumCPU(), Kernel: kernel(), Go: runtime.Version()}
}
