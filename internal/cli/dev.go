package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/examples"
	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/dns"
	nexusclient "github.com/sled-agent/sled-agent/internal/nexus"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/dpdsim"
	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/zone"
)

func newDevCmd() *cobra.Command {
	var (
		d            = newDaemonFlags()
		sledConfig   string
		keep         bool
		exitWhenDone bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole sled on this machine: simulated on loopback, or real with --runtime linux",
		Long: `Run the agent on loopback with the sim runtime, put a realistic sled config
(a real one from a rack, unless --sled-config names another), show the zones
converging, and keep serving so the operator commands can be tried:

  sled-agent zones
  sled-agent inventory
  sled-agent zone show <zone name or id>
  sled-agent config put <file>

Ctrl-C stops it.

With --runtime linux (as root: sudo ./scripts/dev --linux) the sled is real:
its disks are files (` + devLinuxDataDir + `/vdev), its zones network
namespaces with their services under runit on btrfs pools, its NTP zone a
chronyd following a reference NTP server on this host (it never sets the
clock). It is one of a small rack on this host: a second sled, an agent run
as a sled in a network namespace of its own, their underlay links joined by
a bridge in the rack's namespace, each sled with its VPC data path. Once the
first sled's zones run, dev plays Nexus: it boots the test guest under QEMU
on each sled, on one VPC, each taking its address by DHCP, has the first
ping the second and shows the answer. DDM, the switches, DNS and Nexus are
simulated as with sim. Ctrl-C removes everything it made: both sleds'
zones, guests and data paths, the namespaces, links, mounts, loop devices,
processes, and the data dirs unless --keep.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg, err := d.resolve(cmd)
			if err != nil {
				return err
			}
			changed := cmd.Flags().Changed
			var linux *devLinux
			switch cfg.Runtime {
			case "sim":
				if !changed("data-dir") {
					dir, err := os.MkdirTemp("", "sled-agent-dev-")
					if err != nil {
						return err
					}
					cfg.DataDir = dir
					if !keep {
						defer os.RemoveAll(dir)
					}
				}
				cfg.SimStartDelay = devStartDelay
			case "linux":
				if !changed("underlay-ip") {
					cfg.UnderlayIP = agent.DefaultUnderlayIP // the file-backed example's sled
				}
				// Its NTP zone only tracks time: dev never sets the
				// host's clock.
				cfg.NTPNoClock = true
			default:
				return fmt.Errorf("--runtime %q: dev runs sim or linux", cfg.Runtime)
			}
			log, err := newLogger(d.logLevel)
			if err != nil {
				return err
			}
			if cfg.Runtime == "linux" {
				ctx, cancel := signalContext()
				linux, err = prepareDevLinux(ctx, &cfg, devLinuxOptions{dataDirGiven: changed("data-dir"), runDirGiven: changed("run-dir"), logLevel: d.logLevel}, cmd.ErrOrStderr(), log)
				cancel()
				if err != nil {
					return err
				}
				defer func() { err = errors.Join(err, linux.close(keep)) }()
			}
			// The neighbours, simulated on loopback, unless pointed
			// elsewhere.
			if !changed("ddm-url") {
				d := ddmsim.New(log.With("component", "ddm-sim"))
				if err := d.Start("127.0.0.1:0"); err != nil {
					return fmt.Errorf("starting the DDM simulator: %w", err)
				}
				defer d.Close()
				cfg.DDMURL = d.URL()
			}
			var nexus *nexussim.Server
			if !changed("dns-server") && !changed("switch") {
				var extra dns.Records
				if linux != nil {
					extra = linux.dnsRecords()
				}
				stop, n, err := devNeighbours(&cfg, log, !changed("nexus"), extra)
				if err != nil {
					return err
				}
				defer stop()
				nexus = n
			}
			doc := sledconfig.Example()
			if linux != nil {
				doc = examples.SledConfigVdev
			}
			if sledConfig != "" {
				if doc, err = os.ReadFile(sledConfig); err != nil {
					return fmt.Errorf("reading sled config: %w", err)
				}
			}
			if linux != nil {
				if doc, err = linux.disks(doc); err != nil {
					return err
				}
			}
			run := devRun{out: cmd.OutOrStdout(), cfg: cfg, log: log, doc: doc, exitWhenDone: exitWhenDone, nexus: nexus}
			if linux != nil {
				run.guest = linux.guests
			}
			return run.run(cmd.Context())
		},
	}
	devFlags(cmd, d)
	cmd.Flags().StringVar(&sledConfig, "sled-config", "", "sled config to put at start (default: the built-in real example; with --runtime linux examples/sled-config-vdev.json, whose disks it makes as files)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the data dir (with --runtime linux both sleds' data dirs; their zones, mounts and loop devices go all the same)")
	cmd.Flags().BoolVar(&exitWhenDone, "exit-when-converged", false, "stop once every zone is running, and with --runtime linux once the guests pinged (for scripts and CI)")
	return cmd
}

// devFlags gives dev the daemon flags that mean something for a dev sled,
// with dev's own defaults: those it gives the agent when they are not set
// (a config file's value sets them).
func devFlags(cmd *cobra.Command, d *daemonFlags) {
	// Dev makes a Linux sled's disks, pools and image dir, and its NTP
	// zone never sets the clock.
	d.add(cmd, d.except("vdev-dir", "pool-root", "ntp-no-clock", "vmm-image-dir", "netns")...)
	d.setDefault("runtime", "sim", "sim: simulated zones on loopback; linux: real zones, storage, time sync and a guest (needs root: sudo ./scripts/dev --linux)")
	d.setDefault("data-dir", "", "where the agent keeps its state (default: a temporary dir; with --runtime linux "+devLinuxDataDir+"; removed at the end unless --keep)")
	d.setDefault("run-dir", "", "the linux runtime's per-boot state (default "+devLinuxRunDir+")")
	d.setDefault("underlay-ip", devUnderlayIP, "this sled's underlay IPv6 address (the example config's sled; with --runtime linux "+agent.DefaultUnderlayIP+", the file-backed example's)")
	d.setDefault("bootstrap-prefix", devBootstrapPrefix, "the sled's bootstrap /64, advertised in DDM with the underlay /64")
	d.setDefault("ddm-url", "", `the routing daemon's (DDM) admin API, where the sled's prefixes are kept right (default: a DDM simulator on loopback; "" for none)`)
	d.setDefault("log-level", "warn", "")
	d.all.Lookup("dns-server").Usage = "internal DNS server that names the switch daemons, [addr]:port (repeatable; default: one on loopback naming two dpd simulators and, unless --nexus, a Nexus simulator)"
	d.all.Lookup("switch").Usage = "switch daemon (dpd) address, [addr]:port, used when DNS is unreachable or names none (repeatable; with it, no simulated DNS, dpd or Nexus)"
	d.all.Lookup("nexus").Usage = "Nexus internal API address, [addr]:port, told of the sled and its VMMs' states (repeatable; default: a Nexus simulator, named in the simulated DNS)"
}

// dev's sled: the example config's (sledconfig.Example).
const (
	devUnderlayIP      = "fd00:1122:3344:103::1"
	devBootstrapPrefix = "fdb0:a840:2504:103::/64"
)

// devNeighbours starts the rack's switch daemons, simulated, on IPv6
// loopback (two dpd simulators, slots 0 and 1), with a simulated Nexus
// when withNexus, and an internal DNS server that names them and holds
// extra, and points
// cfg at the DNS server. stop ends them.
func devNeighbours(cfg *agent.Config, log *slog.Logger, withNexus bool, extra dns.Records) (stop func(), nexus *nexussim.Server, err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	server := dns.NewServer(log.With("component", "dns-sim"))
	if err := server.Start("[::1]:0"); err != nil {
		return nil, nil, fmt.Errorf("starting the DNS server: %w", err)
	}
	stops = append(stops, func() { server.Close() })
	var daemons []netip.AddrPort
	for slot := range uint16(2) {
		d := dpdsim.New(log.With("component", "dpd-sim", "slot", slot), slot)
		if err := d.Start("[::1]:0"); err != nil {
			return nil, nil, fmt.Errorf("starting a dpd simulator: %w", err)
		}
		stops = append(stops, func() { d.Close() })
		daemons = append(daemons, netip.MustParseAddrPort(d.Addr()))
	}
	records := dns.SwitchRecords(daemons...)
	if withNexus {
		nexus = nexussim.New(nexussim.Config{Log: log.With("component", "nexus-sim")})
		if err := nexus.Start("[::1]:0"); err != nil {
			return nil, nil, fmt.Errorf("starting the Nexus simulator: %w", err)
		}
		stops = append(stops, func() { nexus.Close() })
		records.Merge(dns.ServiceRecords(nexusclient.Service, netip.MustParseAddrPort(nexus.Addr())))
	}
	records.Merge(extra)
	if err := server.SetRecords(records); err != nil {
		return nil, nil, err
	}
	cfg.DNSServers = []string{server.Addr().String()}
	return stop, nexus, nil
}

// devStartDelay makes each simulated zone take between 0.3 s and 3 s to
// start, fixed per zone, so convergence is something a person can follow.
func devStartDelay(s zone.Spec) time.Duration {
	h := fnv.New32a()
	h.Write([]byte(s.ID))
	return 300*time.Millisecond + time.Duration(h.Sum32()%2700)*time.Millisecond
}

// devRun is a dev sled's run: the agent of cfg, the sled config doc it is
// put, and, for a Linux sled, the guest booted once the zones run.
type devRun struct {
	out          io.Writer
	cfg          agent.Config
	log          *slog.Logger
	doc          []byte
	exitWhenDone bool
	nexus        *nexussim.Server
	// guest, if set, boots a guest after the first convergence, and says
	// how to reach it.
	guest func(ctx context.Context, out io.Writer, c *client.Client) error
}

// run runs the agent, puts the sled config over HTTP as the control plane
// would, and prints every zone's progress until interrupted.
func (r devRun) run(parent context.Context) error {
	out, cfg, log, nexus := r.out, r.cfg, r.log, r.nexus
	ctx, cancel := signalContext()
	defer cancel()
	if parent != nil {
		stop := context.AfterFunc(parent, cancel)
		defer stop()
	}
	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	url := "http://" + a.Addr()
	fmt.Fprintf(out, "sled %s: agent API on %s (%s runtime; data in %s)\n", a.SledID(), url, cfg.Runtime, cfg.DataDir)
	if cfg.DDMURL != "" {
		fmt.Fprintf(out, "routing prefixes kept in DDM at %s\n", cfg.DDMURL)
	}
	if len(cfg.DNSServers) > 0 {
		fmt.Fprintf(out, "switches found through internal DNS at %v\n", cfg.DNSServers)
	}
	if nexus != nil {
		fmt.Fprintf(out, "Nexus (simulated) at %s, found through internal DNS\n", nexus.Addr())
	}
	nexusNews := newNexusWatch(nexus, a.SledID())

	c, err := client.New(url)
	if err != nil {
		cancel()
		<-errc
		return err
	}
	putCtx, putCancel := context.WithTimeout(ctx, 30*time.Second)
	err = c.PutConfig(putCtx, r.doc)
	putCancel()
	if err != nil {
		cancel()
		<-errc
		return fmt.Errorf("putting the sled config: %w", err)
	}
	if cur := a.Store().Current(); cur != nil {
		fmt.Fprintf(out, "put sled config generation %d: %d zones; reconciling\n", cur.Generation, len(cur.Zones))
	}

	start := time.Now()
	progress := newDevProgress(out, start)
	if cur := a.Store().Current(); cur != nil {
		progress.gen = cur.Generation
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			err := <-errc
			fmt.Fprintln(out, "stopped")
			return err
		case err := <-errc:
			// Run also returns when ctx ends; this case may win the race.
			if ctx.Err() != nil {
				fmt.Fprintln(out, "stopped")
			}
			return err
		case <-tick.C:
		}
		for _, line := range nexusNews() {
			fmt.Fprintln(out, line)
		}
		var gen, passGen uint64
		if cur := a.Store().Current(); cur != nil {
			gen = cur.Generation
		}
		st := a.Reconciler().Status()
		if st.Last != nil && st.Last.Config != nil {
			passGen = st.Last.Config.Generation
		}
		if !progress.step(gen, passGen, st.Phase == reconciler.PhaseIdle, a.Reconciler().Zones()) {
			continue
		}
		// The first convergence: the banner, once.
		wanted := progress.wanted
		fmt.Fprintf(out, "all %d zones running after %s\n", wanted, time.Since(start).Round(10*time.Millisecond))
		if p := a.Prefixes(); p != nil {
			st := p.Status()
			if st.InSync {
				fmt.Fprintf(out, "DDM originates %v\n", st.Desired)
			} else {
				fmt.Fprintf(out, "DDM not yet in sync (%s); wanted %v\n", cmp.Or(st.LastError, "first pass pending"), st.Desired)
			}
		}
		if s := a.Storage(); s != nil {
			fmt.Fprintln(out, storageLine(s.Status()))
		}
		fmt.Fprintln(out, timeSyncLine(a.TimeSync().Status(), start))
		if n := a.NAT(); n != nil {
			for _, sw := range n.Status().Switches {
				fmt.Fprintf(out, "switch %s (found by %s): %d/%d NAT entries %s\n", sw.Address, sw.FoundBy, sw.Present, sw.Desired, cmp.Or(sw.LastError, "in place"))
			}
		}
		if r.guest != nil {
			if err := r.guest(ctx, out, c); err != nil {
				if ctx.Err() == nil {
					fmt.Fprintf(out, "the guests: %v\n", err)
				}
			}
		}
		fmt.Fprintln(out)
		bin, gone := "go run ./cmd/sled-agent", "zones are simulated, so they go with it"
		if cfg.Runtime == "linux" {
			bin, gone = "./sled-agent", "and removes every zone, guest, mount and loop device the sleds made, and the rack"
		}
		fmt.Fprintf(out, "The agent keeps serving. Try, in another terminal:\n"+
			"  %[1]s zones\n"+
			"  %[1]s inventory\n"+
			"  %[1]s zone show <zone name or id>\n"+
			"  %[1]s vmm list\n"+
			"  curl -s %[2]s/agent/inventory | head -c 600\n"+
			"Ctrl-C stops it (%[3]s).\n", bin, url, gone)
		if r.exitWhenDone {
			cancel()
		}
	}
}

// devProgress prints dev's progress: a line for each zone whose state (or
// why it waits) changed, and, once every wanted zone runs, a line for what
// was done: the first convergence (the caller then prints its banner, once),
// a config generation put and converged, zones repaired.
type devProgress struct {
	out   io.Writer
	start time.Time
	// seen is what was last printed of each zone: its state, and why it
	// waits, if it does (a new reason is worth a line of its own).
	seen map[string]devShown
	// gen is the ledgered generation last announced; putAt when it was
	// seen.
	gen   uint64
	putAt time.Time
	// converged: every wanted zone ran at the last step, after a pass of
	// generation convergedGen. bannered: the first convergence was
	// announced.
	converged    bool
	convergedGen uint64
	bannered     bool
	// broken are the zones that stopped running since the last
	// convergence, to be named when they run again.
	broken map[string]struct{}
	// wanted is how many zones the config wants, at the last step.
	wanted int
}

type devShown struct {
	state reconciler.State
	why   string
}

func newDevProgress(out io.Writer, start time.Time) *devProgress {
	return &devProgress{out: out, start: start, putAt: start, seen: map[string]devShown{}, broken: map[string]struct{}{}}
}

// step prints what changed since the last step, given the ledgered
// generation, the generation of the last completed pass, whether the
// reconciler is idle, and every zone's status. It reports whether this is
// the first convergence, for which the caller prints its banner.
func (p *devProgress) step(gen, passGen uint64, idle bool, zones []reconciler.ZoneStatus) (first bool) {
	now := time.Now()
	if gen != p.gen {
		p.gen, p.putAt = gen, now
		fmt.Fprintf(p.out, "  %6.1fs  config generation %d put; reconciling\n", now.Sub(p.start).Seconds(), gen)
	}
	running, wanted := 0, 0
	for _, z := range zones {
		if z.Wanted {
			wanted++
			if z.State == reconciler.StateRunning {
				running++
			} else if p.bannered {
				p.broken[z.Name] = struct{}{}
			}
		}
	}
	p.wanted = wanted
	for _, z := range zones {
		now := devShown{z.State, z.WaitingFor}
		if p.seen[z.Name] == now {
			continue
		}
		p.seen[z.Name] = now
		detail := ""
		switch z.State {
		case reconciler.StateFailed:
			detail = "  " + z.LastError
		case reconciler.StateWaiting:
			detail = "  " + z.WaitingFor
		}
		fmt.Fprintf(p.out, "  %6.1fs  %-58s %-9s %d/%d running%s\n", time.Since(p.start).Seconds(), z.Name, z.State, running, wanted, detail)
	}
	if running < wanted || !idle || passGen != gen {
		p.converged = false
		return false
	}
	if p.converged && p.convergedGen == gen {
		return false
	}
	prevGen := p.convergedGen
	p.converged, p.convergedGen = true, gen
	at := now.Sub(p.start).Seconds()
	switch {
	case !p.bannered:
		p.bannered = true
		clear(p.broken)
		return true
	case gen != prevGen:
		fmt.Fprintf(p.out, "  %6.1fs  config generation %d converged: all %d zones running after %s\n", at, gen, wanted, now.Sub(p.putAt).Round(10*time.Millisecond))
	default:
		// Zones that went with their config are not repaired.
		var names []string
		for n := range p.broken {
			if s, ok := p.seen[n]; ok && s.state == reconciler.StateRunning {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		what := "all zones running again"
		if len(names) > 0 {
			what = fmt.Sprintf("repaired %s", strings.Join(names, ", "))
		}
		fmt.Fprintf(p.out, "  %6.1fs  %s: all %d zones running\n", at, what, wanted)
	}
	clear(p.broken)
	return false
}

// timeSyncLine says whether the sled's time is synchronized, as the NTP
// zone said, and when that began relative to start.
func timeSyncLine(st timesync.Status, start time.Time) string {
	switch {
	case st.Skipped:
		return "time sync: not checked (--skip-timesync)"
	case !st.Synced:
		return "time sync: not synchronized: " + st.Reason
	}
	return fmt.Sprintf("time sync: synchronized to %s (stratum %d, offset %.6f s) %s after the start; the zones that need it waited for it",
		st.Source, st.Stratum, st.Offset, st.ReleasedAt.Sub(start).Round(10*time.Millisecond))
}

// storageLine says how far the storage half of the config is realised.
func storageLine(st storage.Status) string {
	disks, datasets := 0, 0
	for _, d := range st.Disks {
		if d.Result.OK {
			disks++
		}
	}
	for _, d := range st.Datasets {
		if d.Result.OK {
			datasets++
		}
	}
	return fmt.Sprintf("storage: %d/%d disks with their pools, %d/%d datasets ensured", disks, len(st.Disks), datasets, len(st.Datasets))
}

// newNexusWatch returns what the simulated Nexus learned since it was last
// asked, as lines for people: the sled's record when its generation
// changes, and each VMM state it received. No Nexus: nothing.
func newNexusWatch(n *nexussim.Server, sledID string) func() []string {
	var gen nexussim.Generation
	told := map[string]int{} // VMM → states already shown
	return func() []string {
		if n == nil {
			return nil
		}
		var lines []string
		if rec, ok := n.Sled(sledID); ok && rec.Generation != gen {
			gen = rec.Generation
			lines = append(lines, fmt.Sprintf("Nexus knows sled %s (generation %d): %s at %s, %d threads, reservoir %d MiB", sledID, gen, rec.Role, rec.SAAddress, rec.UsableHardwareThreads, rec.ReservoirSize>>20))
		}
		vmms := n.VMMs()
		for _, id := range slices.Sorted(maps.Keys(vmms)) {
			for _, st := range vmms[id].Received[told[id]:] {
				lines = append(lines, fmt.Sprintf("Nexus told: VMM %s %s (gen %d)", id, st.VmmState.State, st.VmmState.Gen))
			}
			told[id] = len(vmms[id].Received)
		}
		return lines
	}
}
