package bench

// The NAT benchmark: an agent (sim runtime) with NAT zones finds its switch
// daemons through a DNS server on loopback. How long from a switch daemon
// appearing in DNS to this sled's entries being on it?

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// NATOptions size the NAT benchmark.
type NATOptions struct {
	// Appearances is how many switch appearances are timed (10).
	Appearances int
	// Period is the NAT reconciler's period (10s, the default).
	Period time.Duration
	// Progress, if set, receives a line per phase and a periodic one in
	// the timed loop, for people: the result alone goes to the caller.
	Progress io.Writer
}

// NATResult is what `bench nat` prints.
type NATResult struct {
	Machine ZonesMachine `json:"machine"`
	Period  string       `json:"period"`
	Entries int          `json:"entries"`
	// Appear: from a switch daemon being named in DNS to this sled's
	// entries being on it.
	Appear Latency `json:"switch_appears_to_entries_present"`
}

// NAT runs the NAT benchmark.
func NAT(ctx context.Context, opts NATOptions) (*NATResult, error) {
	opts.Appearances = cmp.Or(opts.Appearances, 10)
	if opts.Period <= 0 {
		opts.Period = 10 * time.Second
	}
	dir, err := os.MkdirTemp("", "sled-agent-bench-nat-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	server := dns.NewServer(nil)
	if err := server.Start("[::1]:0"); err != nil {
		return nil, err
	}
	defer server.Close()
	first := dpdsim.New(nil, 0)
	if err := first.Start("[::1]:0"); err != nil {
		return nil, err
	}
	defer first.Close()
	publish := func(ds ...*dpdsim.Server) error {
		var addrs []netip.AddrPort
		for _, d := range ds {
			addrs = append(addrs, netip.MustParseAddrPort(d.Addr()))
		}
		return server.SetRecords(dns.SwitchRecords(addrs...))
	}
	if err := publish(first); err != nil {
		return nil, err
	}
	progress(opts.Progress, "bench nat: starting an agent (sim runtime) that finds its switch daemons through DNS")
	// The example config's sled: its zones are in that /64.
	const exampleSled = "fd00:1122:3344:103::1"
	cfg := agent.Config{DataDir: dir, Listen: "127.0.0.1:0", DNSServers: []string{server.Addr().String()}, NATPeriod: opts.Period,
		SkipTimesync: true, UnderlayIP: exampleSled} // its zones do not wait for an NTP zone: it has none
	_, c, stop, err := startAgent(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	defer stop()
	// The real example config: a nexus and an external DNS zone, two entries.
	doc := sledconfig.Example()
	if err := c.PutConfig(ctx, doc); err != nil {
		return nil, err
	}
	underlay := netip.MustParseAddr(exampleSled)
	ours := func(d *dpdsim.Server) int {
		n := 0
		for _, e := range d.Entries() {
			if e.Target.InternalIP == underlay {
				n++
			}
		}
		return n
	}
	const want = 2
	progress(opts.Progress, "bench nat: the example config put; waiting for its %d NAT entries on the first switch", want)
	if _, err := waitUntil(ctx, time.Now(), func() bool { return ours(first) == want }); err != nil {
		return nil, fmt.Errorf("the first switch: %w", err)
	}
	res := &NATResult{Machine: machine(), Period: opts.Period.String(), Entries: want}
	var took []time.Duration
	progress(opts.Progress, "bench nat: %d switch appearances, each at a random moment of the %s period", opts.Appearances, opts.Period)
	steps := newLoopProgress(opts.Progress, "bench nat: switch appearances", opts.Appearances)
	for i := range opts.Appearances {
		d := dpdsim.New(nil, 1)
		if err := d.Start("[::1]:0"); err != nil {
			return nil, err
		}
		// At a random moment of the period: a switch appears when it
		// does, not just after the agent looked.
		if err := sleepCtx(ctx, rand.N(opts.Period)); err != nil {
			d.Close()
			return nil, err
		}
		t0 := time.Now()
		if err := publish(first, d); err != nil {
			d.Close()
			return nil, err
		}
		dt, err := waitUntil(ctx, t0, func() bool { return ours(d) == want })
		d.Close()
		if err != nil {
			return nil, err
		}
		took = append(took, dt)
		steps.done(i + 1)
	}
	res.Appear = summarize(took)
	return res, nil
}

// waitUntil polls cond every millisecond, for at most a minute, and returns
// the time since t0 when it holds.
func waitUntil(ctx context.Context, t0 time.Time, cond func() bool) (time.Duration, error) {
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not done within a minute")
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}
