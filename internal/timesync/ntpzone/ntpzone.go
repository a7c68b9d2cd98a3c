// Package ntpzone is the service an NTP zone runs on Linux (`sled-agent
// ntp-zone`): chronyd configured from the zone's config and kept running,
// ntp-admin's GET /timesync on the zone's address, and the zone service's
// GET /health that the zone runtime waits for.
package ntpzone

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/backoff"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// Options say which zone to serve and how.
type Options struct {
	// Listen is the TCP address of GET /health: the zone's service
	// address, "[addr]:port".
	Listen string
	// Root is the zone root: its mark (zone.json) says what to run, and
	// chronyd's files go in Root/chrony.
	Root string
	// Tag is the zone runtime's tag (default "sled-agent"): the mark must
	// carry it, and the command socket is in chrony.SocketDir(Tag, id).
	Tag string
	// NoClock makes chronyd only track (-x), never set the clock.
	NoClock bool
	// Binaries are chronyd and chronyc; zero is chrony.Find's, looked for
	// at every start of chronyd until found.
	Binaries chrony.Binaries
	Log      *slog.Logger
}

// Schedules of the service.
var (
	// restarts are the delays before chronyd is started again after it
	// exited; a run longer than steadyRun starts the count again.
	restarts  = backoff.Backoff{Initial: time.Second, Max: 30 * time.Second}
	steadyRun = time.Minute
	// retries are the delays before the names of ntp_servers are looked
	// up again after some failed.
	retries = backoff.Backoff{Initial: time.Second, Max: time.Minute}
	// refresh is how often names that resolved are looked up again
	// (upstream's "pool … refresh 120").
	refresh = 2 * time.Minute
	// lookupTimeout bounds the lookup of one name across all DNS servers.
	lookupTimeout = 10 * time.Second
)

// Run serves the NTP zone at opts.Root until ctx ends: it reads the zone's
// mark, listens for /health on opts.Listen and for ntp-admin on the zone's
// address at timesync.AdminPort, and runs chronyd, restarted with capped
// backoff whenever it exits. A boundary zone's chronyd starts once one of
// its ntp_servers is known (addresses at once, names once resolved with
// its dns_servers) and serves the rack on the zone's address; an internal
// zone's starts at once with the servers of its sources file, which the
// agent keeps current from the host (chrony.SetServers through the socket
// in chrony.SocketDir). When ctx ends, chronyd is stopped (SIGTERM, then
// SIGKILL after its stop timeout) and the listeners shut down; Run returns
// nil. It returns an error if the mark is not an NTP zone's (wrapping
// ErrBadZone) or a listener fails.
func Run(ctx context.Context, opts Options) error {
	opts.Tag = cmp.Or(opts.Tag, "sled-agent")
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Root == "" {
		return errors.New("ntp zone: no zone root")
	}
	info, err := readZone(opts.Root, opts.Tag, !opts.NoClock)
	if err != nil {
		return err
	}
	log := opts.Log.With("component", "ntp-zone", "zone", info.name, "kind", info.kind)
	z := newZone(info, opts.Binaries, log, dnsLookup(info.dns))

	var lc net.ListenConfig
	adminAddr := netip.AddrPortFrom(info.addr.Addr(), timesync.AdminPort).String()
	adminLn, err := lc.Listen(ctx, "tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("ntp zone: ntp-admin: %w", err)
	}
	healthLn, err := lc.Listen(ctx, "tcp", opts.Listen)
	if err != nil {
		adminLn.Close()
		return fmt.Errorf("ntp zone: health: %w", err)
	}
	log.Info("ntp zone starting", "ntp_admin", adminAddr, "health", opts.Listen,
		"servers", info.literals, "names", info.names, "dns_servers", info.dns, "set_clock", !opts.NoClock)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := zoneservice.ServeListener(ctx, healthLn, zoneservice.Info{Name: info.name, ID: info.id, Kind: info.kind}); err != nil && ctx.Err() == nil {
			errc <- err
		}
	})
	wg.Go(func() {
		if err := zoneservice.ServeHandler(ctx, adminLn, timesync.NewHandler(z, timesync.HandlerOptions{Log: log}), "ntp-admin"); err != nil && ctx.Err() == nil {
			errc <- err
		}
	})
	if len(info.names) > 0 {
		wg.Go(func() { z.followNames(ctx) })
	}
	wg.Go(func() { supervise(ctx, log, z.runOnce) })
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
		log.Error("ntp zone: a listener failed: stopping", "err", err)
	}
	cancel()
	wg.Wait()
	return err
}

// zone is the running service's state.
type zone struct {
	info   zoneInfo
	log    *slog.Logger
	lookup lookupFunc

	mu sync.Mutex
	// bins are chronyd's and chronyc's paths, once found.
	bins chrony.Binaries
	// servers are a boundary zone's: its literal ntp_servers and the
	// addresses its names last resolved to.
	servers []netip.Addr
	// known is closed once a boundary zone has a server (at once for an
	// internal zone): chronyd starts no sooner.
	known     chan struct{}
	knownOnce sync.Once // closes known
	// cur is the chronyd of the latest start, nil before the first.
	cur *chrony.Daemon
	// why says why there is no chronyd to ask (before the first start).
	why string
}

var _ timesync.Tracker = (*zone)(nil)

func newZone(info zoneInfo, bins chrony.Binaries, log *slog.Logger, lookup lookupFunc) *zone {
	z := &zone{info: info, bins: bins, log: log, lookup: lookup, known: make(chan struct{}), servers: slices.Clone(info.literals)}
	if info.base.Kind == chrony.Internal || len(info.literals) > 0 {
		z.markServersKnown()
	}
	return z
}

func (z *zone) markServersKnown() { z.knownOnce.Do(func() { close(z.known) }) }

// Tracking is the tracking line of the zone's chronyd, for ntp-admin.
func (z *zone) Tracking(ctx context.Context) (string, error) {
	z.mu.Lock()
	d, why := z.cur, z.why
	z.mu.Unlock()
	if d == nil {
		return "", fmt.Errorf("chronyd not started: %s: %w", cmp.Or(why, "starting"), chrony.ErrNotRunning)
	}
	return d.Tracking(ctx)
}

// setWhy says why chronyd has not started yet.
func (z *zone) setWhy(why string) {
	z.mu.Lock()
	z.why = why
	z.mu.Unlock()
}

// runOnce starts chronyd once servers are known and runs it until ctx
// ends or it exits.
func (z *zone) runOnce(ctx context.Context) error {
	select {
	case <-z.known:
	case <-ctx.Done():
		return nil
	}
	z.mu.Lock()
	bins := z.bins
	z.mu.Unlock()
	if bins == (chrony.Binaries{}) {
		b, err := chrony.Find()
		if err != nil {
			z.setWhy(err.Error())
			return err
		}
		bins = b
	}
	cfg := z.info.base
	if cfg.Kind == chrony.Internal {
		// The agent's servers, as it last set them from the host.
		servers, port, err := readSources(cfg.Paths().Sources)
		if err != nil {
			z.log.Warn("ntp zone: starting without the servers of the sources file", "err", err)
		}
		cfg.Servers, cfg.ServerPort = servers, port
	}
	// The daemon is made and published under the lock that guards the
	// servers: a boundary zone's names resolving meanwhile are given to
	// this daemon (setServers), never lost to an older one.
	z.mu.Lock()
	if cfg.Kind == chrony.Boundary {
		cfg.Servers = slices.Clone(z.servers)
	}
	d, err := chrony.New(cfg, chrony.Options{Binaries: bins, Log: z.log})
	if err == nil {
		z.bins, z.cur = bins, d
	} else {
		z.why = err.Error()
	}
	z.mu.Unlock()
	if err != nil {
		return err
	}
	z.log.Info("starting chronyd", "servers", cfg.Servers)
	return d.Run(ctx)
}

// supervise runs run until ctx ends, again after each return, after a
// delay that doubles with each consecutive failure (restarts), counted
// afresh after a run of steadyRun or longer.
func supervise(ctx context.Context, log *slog.Logger, run func(context.Context) error) {
	fails := 0
	for {
		start := time.Now()
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) >= steadyRun {
			fails = 0
		}
		fails++
		delay := restarts.Delay(fails)
		log.Warn("ntp zone: chronyd is not running: starting it again", "err", err, "in", delay, "failures", fails)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// followNames looks a boundary zone's ntp_servers names up with its DNS
// servers, again after refresh, or sooner (retries) while any fails, and
// makes the addresses found (with the literal ones) chronyd's servers. A
// name that fails keeps the addresses it last resolved to.
func (z *zone) followNames(ctx context.Context) {
	last := map[string][]netip.Addr{}
	fails := 0
	for {
		failed := 0
		for _, name := range z.info.names {
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			addrs, err := z.lookup(lctx, name)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				failed++
				z.log.Warn("ntp zone: NTP server name did not resolve", "name", name, "err", err, "keeping", last[name])
				continue
			}
			if !slices.Equal(addrs, last[name]) {
				z.log.Info("ntp zone: NTP server name resolved", "name", name, "addrs", addrs)
			}
			last[name] = addrs
		}
		servers := slices.Clone(z.info.literals)
		for _, name := range z.info.names {
			for _, a := range last[name] {
				servers = appendNew(servers, a)
			}
		}
		if len(servers) == 0 {
			z.setWhy("no server of ntp_servers is an address or resolved yet")
		} else {
			z.setServers(ctx, servers)
		}
		wait := refresh
		if failed > 0 {
			fails++
			wait = retries.Delay(fails)
		} else {
			fails = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// setServers makes servers the boundary zone's, for the running chronyd
// and every later start.
func (z *zone) setServers(ctx context.Context, servers []netip.Addr) {
	z.mu.Lock()
	same := slices.Equal(servers, z.servers)
	z.servers = slices.Clone(servers)
	d := z.cur
	z.mu.Unlock()
	z.markServersKnown()
	if same || d == nil {
		return
	}
	if err := d.SetServers(ctx, servers); err != nil && !errors.Is(err, chrony.ErrNotRunning) {
		z.log.Warn("ntp zone: chronyd did not take the new servers (its next start will)", "servers", servers, "err", err)
	}
}
