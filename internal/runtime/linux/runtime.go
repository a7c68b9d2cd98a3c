// Package linux is the zone runtime for Linux. A zone oxz_<kind>_<id> is a
// named network namespace with veth links holding its addresses
// (internal/runtime/linux/zonenet), a zone root directory (its root dataset
// under the pool root, or on its pool under the data dir: roots.go), and its
// service started inside the namespace under runit's
// runsv (internal/runtime/linux/supervise), which keeps it running whether or
// not the agent is alive. A file in the zone root and the links' aliases mark
// every part as this agent's, so a restarted agent can prove what it owns.
package linux

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/vmm/guestcg"
	"github.com/sled-agent/sled-agent/internal/zone"
	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// Options set up the runtime.
type Options struct {
	// VPC: the sled runs the VPC data path, which zones' NICs are ports
	// of: a NIC then holds its address alone (/32) with a route to its
	// VPC gateway and the default IPv4 route through it, as OPTE gives
	// zones; without, it holds its address in its subnet (nothing
	// answers on it).
	VPC bool
	// DataDir holds the legacy zone roots (DataDir/pools/<pool>/zones/<zone>,
	// for specs without a root dataset) and the agent binary the default
	// image runs (DataDir/bin).
	DataDir string
	// PoolRoot is where the pools are mounted (the storage reconciler's
	// pool root): a zone's root dataset is
	// PoolRoot/ext/<pool id>/crypt/zone/<zone>. Default DataDir/storage,
	// the agent's default.
	PoolRoot string
	// RunDir holds what lasts one boot, like the zones themselves: each
	// zone's runit service directory (RunDir/<tag>/<zone>), whose state
	// runsv rewrites on every change. Default /run/sled-agent.
	RunDir string
	// TmpfsRunDir mounts a tmpfs on RunDir if it is not on one already (the
	// agent sets it; on most systems /run is a tmpfs anyway).
	TmpfsRunDir bool
	// Tag marks every object as this agent's (default "sled-agent"). Tests
	// use a unique tag.
	Tag string
	// DataDirLock is the file the agent holds an flock on while it runs
	// (agent.LockDataDir's), written into every zone's claim so that
	// another sled's runtime can tell whether this sled's agent still runs
	// (debris.go). Default <DataDir>/agent.lock, the agent's.
	DataDirLock string
	// Sled is the id of the sled whose zones these are (a UUID in lower
	// case): written into every zone's marks, and what Sweep, Owned and
	// Destroy go by (see claim.go). Required.
	Sled string
	// NetnsPrefix is put before every zone name to make its namespace name
	// (default none). Tests use a unique prefix.
	NetnsPrefix string
	// Images maps a zone type to what runs in its zones; others run
	// their kind's default: VMMImage, NTPImage, else DefaultImage.
	Images map[string]Image
	// NTPNoClock makes NTPImage's chronyd only track (ntp-zone
	// --no-clock): it never sets this machine's clock (development and
	// tests; the agent's --ntp-no-clock).
	NTPNoClock bool
	// VMMArgs, if set, gives the arguments added to a VMM zone's command
	// when it is made (the agent's: how guests run, where their disks may
	// lie); they may hold the placeholders of an Image. The runtime adds
	// --guest-cgroup, the cgroup the service confines its QEMU in, which
	// Destroy removes (cgroup.go).
	VMMArgs func() []string
	// AgentBinary is the binary DefaultImage runs (default: this executable).
	// It is copied into the data dir, so zones outlive the file it came from.
	AgentBinary string
	// HealthTimeout bounds one health check (default 1s).
	HealthTimeout time.Duration
	// Notify is called when a zone may have died: its namespace or a link
	// was deleted, or its supervisor exited. The reconciler's Poke fits.
	Notify func()
	Log    *slog.Logger
}

// Runtime creates, lists and destroys zones on Linux. It needs root.
type Runtime struct {
	opts    Options
	agent   string // the kept agent binary
	dataDir string // opts.DataDir, absolute (claims name it)

	cg     cgroups
	guests guestcg.Host // the hierarchies guests' cgroups are in (cgroup.go)

	mu       sync.Mutex
	watchers map[string]watcher  // guarded by mu; supervisor watchers by zone name
	roots    map[string][]string // guarded by mu; zone roots seen by Ensure and List, by zone name
}

// New prepares the runtime: it checks the tools it needs and keeps a copy
// of the agent binary in the data dir.
func New(opts Options) (*Runtime, error) {
	opts.Tag = cmp.Or(opts.Tag, defaultTag)
	opts.HealthTimeout = cmp.Or(opts.HealthTimeout, time.Second)
	opts.RunDir = cmp.Or(opts.RunDir, defaultRunDir)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the linux runtime needs root (it creates network namespaces and links)")
	}
	if opts.DataDir == "" {
		return nil, errors.New("the linux runtime needs a data dir")
	}
	if err := validSled(opts.Sled); err != nil {
		return nil, fmt.Errorf("the linux runtime needs its sled's id: %w", err)
	}
	// Absolute, as the storage reconciler's paths are, so that placeOf can
	// compare them.
	poolRoot, err := filepath.Abs(cmp.Or(opts.PoolRoot, filepath.Join(opts.DataDir, "storage")))
	if err != nil {
		return nil, fmt.Errorf("pool root: %w", err)
	}
	opts.PoolRoot = poolRoot
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if opts.DataDirLock, err = filepath.Abs(cmp.Or(opts.DataDirLock, filepath.Join(dataDir, DataDirLockFile))); err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	r := &Runtime{opts: opts, dataDir: dataDir, watchers: map[string]watcher{}, roots: map[string][]string{}, cg: newCgroups(opts.Tag), guests: guestcg.Detect()}
	if !r.cg.available() {
		opts.Log.Warn("no cgroup v2 file system: zone processes will be found by walking /proc")
	}
	if err := r.keepAgentBinary(); err != nil {
		return nil, err
	}
	if err := prepareRunDir(opts.RunDir, opts.TmpfsRunDir); err != nil {
		return nil, err
	}
	return r, nil
}

// The defaults of Options.
const (
	defaultTag    = "sled-agent"
	defaultRunDir = "/run/sled-agent"
)

// owner is the file in a zone root that proves the zone is ours.
type owner struct {
	Tag string `json:"tag"`
	// Sled is the sled whose zone it is; empty in marks of the previous
	// version (see claim.go).
	Sled  string `json:"sled_id,omitempty"`
	ID    string `json:"id"`
	Name  string `json:"name"`
	Hash  string `json:"config_hash"`
	Netns string `json:"netns"`
	// Data is the zone's durable dataset ({data}), if it has one.
	Data string `json:"data,omitempty"`
	// Config is the zone's config, for people and for the restore protocol.
	Config json.RawMessage `json:"config"`
}

const ownerFile = "zone.json"

// deadZoneGrace is how long the service of a zone whose namespace is gone
// gets to stop before it is killed.
const deadZoneGrace = 100 * time.Millisecond

func (r *Runtime) netnsName(zoneName string) string { return r.opts.NetnsPrefix + zoneName }

// serviceDir is where the zone's runit service lives: under the run dir,
// which is per boot (tmpfs), like the zone's namespace and processes.
func (r *Runtime) serviceDir(zoneName string) string {
	return filepath.Join(r.serviceRoot(), zoneName)
}

// serviceRoot holds the service directories of this runtime's zones, and
// nothing else.
func (r *Runtime) serviceRoot() string { return filepath.Join(r.opts.RunDir, r.opts.Tag) }

func (r *Runtime) netConfig(spec zone.Spec) (zonenet.Config, error) {
	addr, ok := spec.Config.ServiceAddr()
	if !ok {
		return zonenet.Config{}, fmt.Errorf("zone %s has no underlay service address", spec.Name)
	}
	c := zonenet.Config{Netns: r.netnsName(spec.Name), Tag: r.opts.Tag, ZoneID: spec.ID, Underlay: addr.Addr()}
	if t := spec.Config.ZoneType; t.Type == "internal_dns" && t.GZAddress != "" {
		// The global zone's address in the DNS zone's /64, while the
		// zone runs (validated: IPv6).
		c.GZ, _ = netip.ParseAddr(t.GZAddress)
	}
	if nic := spec.Config.ZoneType.NIC; nic != nil {
		n, err := nicConfig(nic, r.opts.VPC)
		if err != nil {
			return zonenet.Config{}, fmt.Errorf("zone %s: %w", spec.Name, err)
		}
		c.NIC = n
	}
	return c, nil
}

// Ensure creates the zone (whatever of it is missing) and returns once its
// service is up and answers its health check. Its root is its root dataset
// (spec.Storage.Root), which must exist, else the legacy root, which Ensure
// creates (roots.go).
func (r *Runtime) Ensure(ctx context.Context, spec zone.Spec) error {
	t0 := time.Now()
	root, err := r.rootFor(spec)
	if err != nil {
		return err
	}
	if err := r.checkData(spec, root); err != nil {
		return err
	}
	netCfg, err := r.netConfig(spec)
	if err != nil {
		return err
	}
	addr, _ := spec.Config.ServiceAddr()
	// What the zone runs, checked before anything of it is made.
	img := r.imageFor(spec)
	if spec.Config.ZoneType.Type == zone.VMMZoneType && r.opts.VMMArgs != nil {
		img.Command = append(slices.Clip(img.Command), r.opts.VMMArgs()...)
		if cg := r.guestCgroup(spec.Name); cg != "" {
			img.Command = append(img.Command, "--guest-cgroup", cg)
		}
	}
	argv, err := img.expand(spec, addr, r.agent, root, r.opts.Tag)
	if err != nil {
		return err
	}
	ready, err := r.probeFor(spec, img, root)
	if err != nil {
		return fmt.Errorf("zone %s: %w", spec.Name, err)
	}
	// The ownership mark goes first, so a crash of the agent at any later
	// point leaves parts that are provably ours. It is not fsynced: what it
	// marks (namespace, links, processes) does not survive a crash of the
	// machine either, and a legacy root whose mark was lost with it is
	// litter in our own data dir, for the restore protocol to clear (a
	// root dataset without a mark is left as it is, for the zone's next
	// start).
	cfgJSON, err := json.Marshal(spec.Config)
	if err != nil {
		return err
	}
	mark := mustJSON(owner{Tag: r.opts.Tag, Sled: r.opts.Sled, ID: spec.ID, Name: spec.Name, Hash: spec.Hash, Netns: netCfg.Netns, Data: spec.Storage.Data, Config: cfgJSON})
	if err := writeMark(root, mark); err != nil {
		return fmt.Errorf("zone %s: writing its root: %w", spec.Name, err)
	}
	r.noteRoot(spec.Name, root)
	// Then the claim, before the zone has any part outside our data dir.
	if err := r.claimZone(ctx, spec.Name); err != nil {
		return err
	}
	// The network is made, then the supervisor started while the kernel
	// finishes the network in the background (zonenet.WaitLive), and only
	// then is the service asked whether it is ready: a health check sent
	// before the network carries traffic could wait out a retransmission.
	pending, err := zonenet.EnsureStarted(ctx, netCfg)
	if err != nil {
		return fmt.Errorf("zone %s: network: %w", spec.Name, err)
	}
	tNet := time.Now()
	proc, err := r.startService(ctx, spec.Name, netCfg.Netns, argv)
	if err != nil {
		pending.Close()
		return err
	}
	tSup := time.Now()
	if err := pending.Wait(ctx); err != nil {
		proc.Close()
		return fmt.Errorf("zone %s: network: %w", spec.Name, err)
	}
	tLive := time.Now()
	if err := r.waitReady(ctx, spec.Name, netCfg.Netns, r.serviceDir(spec.Name), proc, ready); err != nil {
		return err
	}
	r.opts.Log.Debug("zone ready", "zone", spec.Name, "network", tNet.Sub(t0), "supervisor", tSup.Sub(tNet), "live", tLive.Sub(tSup), "service", time.Since(tLive))
	r.watchSupervisor(spec.Name, proc)
	return nil
}

// startService writes the zone's service directory and starts its
// supervisor.
func (r *Runtime) startService(ctx context.Context, name, netns string, argv []string) (*supervise.Proc, error) {
	svc := r.serviceDir(name)
	prepare := supervise.Prepare
	if argv[0] == r.agent {
		// The agent's own services need no run script (see
		// cmd/sled-agent).
		prepare = supervise.PrepareDirect
	}
	if err := prepare(svc, argv, nil); err != nil {
		return nil, fmt.Errorf("zone %s: service: %w", name, err)
	}
	return r.startSupervisor(ctx, name, netns, svc)
}

// startSupervisor starts the zone's runsv inside the zone's namespace, so
// that the service it runs, and every restart of it, is born there. A runsv
// found running outside the namespace (one an older agent started, when the
// run script entered the namespace itself) is replaced: the script no longer
// does, and its next restart of the service would land in the host's.
func (r *Runtime) startSupervisor(ctx context.Context, name, netns, svc string) (*supervise.Proc, error) {
	start := supervise.StartOptions{Start: func(cmd *exec.Cmd) error { return zonenet.StartIn(netns, cmd) }}
	if r.cg.available() {
		var err error
		if start.Cgroup, err = r.cg.ensure(name); err != nil {
			return nil, fmt.Errorf("zone %s: %w", name, err)
		}
	}
	for attempt := 0; ; attempt++ {
		proc, err := supervise.StartWith(ctx, svc, start)
		if errors.Is(err, zonenet.ErrNoNetns) {
			return nil, &zone.GoneError{Name: name, Reason: "its network namespace was deleted before its supervisor started"}
		}
		if err != nil {
			return nil, fmt.Errorf("zone %s: starting its supervisor: %w", name, err)
		}
		in, err := zonenet.ProcessIn(proc.PID, netns)
		if err == nil && in {
			return proc, nil
		}
		proc.Close()
		if err == nil {
			err = fmt.Errorf("its supervisor (runsv %d) runs outside the zone's namespace", proc.PID)
		}
		if attempt > 0 {
			return nil, fmt.Errorf("zone %s: %w", name, err)
		}
		r.opts.Log.Info("replacing the zone's supervisor", "zone", name, "reason", err)
		if err := supervise.StopSupervisor(ctx, svc); err != nil {
			return nil, fmt.Errorf("zone %s: stopping its supervisor: %w", name, err)
		}
	}
}

// waitReady waits, until ctx ends, for the zone's service to be up and
// ready, and says through ctx's progress reporter what it waits for.
// Every poll also checks that the zone still exists: if its namespace or its
// supervisor is gone, the wait ends at once with a zone.GoneError.
func (r *Runtime) waitReady(ctx context.Context, name, netns, svc string, proc *supervise.Proc, ready probe) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := proc.Watch(wctx)
	poll := zoneservice.NewPoller(r.opts.HealthTimeout)
	lastSaid := ""
	for {
		if !zonenet.NetnsExists(netns) {
			return &zone.GoneError{Name: name, Reason: "its network namespace was deleted while its service was starting"}
		}
		select {
		case <-exited:
			return &zone.GoneError{Name: name, Reason: "its supervisor exited while its service was starting"}
		default:
		}
		// The readiness check comes first: until the service listens it
		// is refused at once, and it is what the wait is for. The
		// supervisor's word is read once the service answers.
		var waiting string // what the zone waits for, and the last answer
		if err := ready.run(ctx, poll, r.opts.HealthTimeout); err == nil {
			st, err := supervise.Status(svc)
			switch {
			case err != nil:
				waiting = "waiting for its supervisor's status: " + err.Error()
			case !st.Up:
				waiting = "waiting for its supervisor to report the service up (" + ready.what + " answers)"
			default:
				return nil
			}
		} else if ctx.Err() != nil && lastSaid != "" {
			waiting = lastSaid // a check cut short by the end of the wait says nothing new
		} else {
			waiting = ready.waiting(err)
		}
		if waiting != lastSaid {
			zone.ReportProgress(ctx, waiting)
			lastSaid = waiting
		}
		t := time.NewTimer(poll.Pause())
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("zone %s not ready: %s (supervisor: %s): %w", name, waiting, supervisorSays(svc), ctx.Err())
		case <-exited:
			t.Stop()
		case <-t.C:
		}
	}
}

// Healthy reports whether the zone's service passes its image's readiness
// check, the one Ensure waits for, within the health timeout. The restore
// protocol asks it of zones it finds running, before it adopts them.
func (r *Runtime) Healthy(ctx context.Context, spec zone.Spec) error {
	img := r.imageFor(spec)
	root := r.legacyRoot(spec)
	if img.Ready.Command != nil {
		// Only a readiness command has placeholders that name the zone's
		// root and durable dataset.
		spec, root = r.placesOf(spec)
	}
	ready, err := r.probeFor(spec, img, root)
	if err != nil {
		return err
	}
	if err := ready.run(ctx, nil, r.opts.HealthTimeout); err != nil {
		return fmt.Errorf("zone %s: %s: %w", spec.Name, ready.what, err)
	}
	return nil
}

// placesOf returns spec with the zone's storage, and the zone's root: as
// the spec says, else as the zone's mark says (the reconciler asks Healthy
// with the ledgered spec, which does not carry where the zone's datasets
// are), else the legacy root.
func (r *Runtime) placesOf(spec zone.Spec) (zone.Spec, string) {
	if spec.Storage.Root != "" {
		return spec, filepath.Clean(spec.Storage.Root)
	}
	roots, err := r.rootsOf(spec.Name)
	if err == nil {
		for _, root := range roots {
			if o, err := readOwner(root); err == nil && r.ourMark(o) {
				if r.placeOf(root) == datasetPlace {
					spec.Storage.Root = root
				}
				spec.Storage.Data = cmp.Or(spec.Storage.Data, o.Data)
				return spec, root
			}
		}
	}
	return spec, r.legacyRoot(spec)
}

// supervisorSays describes what runsv reports of the service, for errors.
func supervisorSays(svc string) string {
	st, err := supervise.Status(svc)
	switch {
	case err != nil:
		return err.Error()
	case st.Up:
		return fmt.Sprintf("service up, pid %d", st.PID)
	case st.LastExit != nil && st.LastExit.Code == -1:
		return fmt.Sprintf("service %s, last killed by signal %d", st.Phase, st.LastExit.Signal)
	case st.LastExit != nil:
		return fmt.Sprintf("service %s, last exited with code %d", st.Phase, st.LastExit.Code)
	default:
		return "service " + st.Phase
	}
}

// watcher watches a zone's supervisor, which Destroy then stops without
// looking for it.
type watcher struct {
	cancel context.CancelFunc
	proc   *supervise.Proc
}

// watchSupervisor notifies when the zone's supervisor exits.
func (r *Runtime) watchSupervisor(name string, proc *supervise.Proc) {
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if old, ok := r.watchers[name]; ok {
		old.cancel()
	}
	r.watchers[name] = watcher{cancel: cancel, proc: proc}
	r.mu.Unlock()
	exited := proc.Watch(ctx)
	go func() {
		select {
		case <-exited:
			r.opts.Log.Warn("zone supervisor exited", "zone", name)
			r.notify()
		case <-ctx.Done():
		}
	}()
}

// stopWatching stops watching the zone's supervisor and returns it, or nil
// if it was not watched.
func (r *Runtime) stopWatching(name string) *supervise.Proc {
	r.mu.Lock()
	w, ok := r.watchers[name]
	delete(r.watchers, name)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	w.cancel()
	return w.proc
}

// Destroy removes every part of the named zone: its service and supervisor,
// any process left in its namespace or cgroup, its guest's cgroup with what
// runs in it, its links and namespace, and its root (a root dataset's
// contents only: roots.go).
// Parts that do not exist are skipped; parts not marked as ours are left
// alone, and so is all but the roots of a zone whose parts are not proven
// our sled's (see claim.go).
func (r *Runtime) Destroy(ctx context.Context, name string) error {
	t0 := time.Now()
	defer func() { r.opts.Log.Debug("zone destroyed", "zone", name, "took", time.Since(t0)) }()
	sup := r.stopWatching(name) // nil for a zone this runtime did not start
	netns := r.netnsName(name)
	roots, err := r.rootsOf(name)
	if err != nil {
		return err
	}
	var errs []error
	zoneID := ""
	var ours []string // the roots that carry our mark
	for _, root := range roots {
		if o, err := readOwner(root); err == nil && r.ourMark(o) {
			zoneID = o.ID
			ours = append(ours, root)
		}
	}
	if !r.provenOurs(name, len(ours) > 0) {
		return r.removeRoots(name, ours)
	}
	// The service directory is under our run dir, which holds only ours.
	svc := r.serviceDir(name)
	switch {
	case r.cg.exists(name):
		// Everything the zone ran is in its cgroup: stop the service
		// gracefully if the zone is alive, then kill what is left.
		if zonenet.NetnsExists(netns) {
			if err := supervise.StopRunsv(ctx, svc, sup); err != nil {
				errs = append(errs, fmt.Errorf("stopping its service: %w", err))
			}
		}
		if err := r.cg.kill(ctx, name); err != nil {
			errs = append(errs, err)
		}
	case zonenet.NetnsExists(netns):
		// Whatever the service left behind is in the namespace, and
		// killed with it below.
		if err := supervise.StopRunsv(ctx, svc, sup); err != nil {
			errs = append(errs, fmt.Errorf("stopping its service: %w", err))
		}
		if err := killNamespaceProcs(ctx, zonenet.NetnsPath(netns)); err != nil {
			errs = append(errs, err)
		}
	default:
		// The zone is dead already: nothing to shut down gracefully, so
		// do not wait out runsv's restart throttle; its leftovers are
		// found by their mark.
		stopCtx, cancel := context.WithTimeout(ctx, deadZoneGrace)
		err := supervise.Stop(stopCtx, svc)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("stopping its service: %w", err))
		}
	}
	// A guest's QEMU, in its own cgroup: killed if the service did not
	// end it, before the network it uses goes.
	if err := r.removeGuestCgroup(ctx, name); err != nil {
		errs = append(errs, err)
	}
	if zoneID == "" {
		zoneID = idFromName(name)
	}
	if err := zonenet.Remove(ctx, netns, r.opts.Tag, zoneID); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(svc); err != nil {
			errs = append(errs, fmt.Errorf("service directory: %w", err))
		}
		// Before the roots: while a mark is left, a Destroy again finds
		// the zone and this directory.
		if err := r.removeSocketDir(name, zoneID); err != nil {
			errs = append(errs, err)
		}
		for _, root := range ours {
			if err := r.removeRoot(root); err != nil {
				errs = append(errs, fmt.Errorf("zone root: %w", err))
			}
		}
		if len(errs) == 0 {
			r.forgetRoot(name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroying zone %s: %w", name, err)
	}
	return nil
}

// List returns every zone whose root carries this agent's mark, with whether
// it is complete and its service up.
func (r *Runtime) List(ctx context.Context) ([]zone.Observed, error) {
	roots, err := r.rootPaths()
	if err != nil {
		return nil, err
	}
	var owners []owner
	seen := map[string]bool{}
	for _, root := range roots {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		o, err := readOwner(root)
		if err != nil || !r.ourMark(o) {
			continue
		}
		r.noteRoot(o.Name, root)
		// A zone with roots in both places (one that moved to its
		// dataset) is one zone, seen on its dataset; Destroy removes
		// both.
		if !seen[o.Name] {
			seen[o.Name] = true
			owners = append(owners, o)
		}
	}
	// The host's side of every zone, in one look; without it (the look
	// failed), each zone is inspected on its own.
	in, err := zonenet.NewInspector()
	if err != nil {
		r.opts.Log.Warn("inspecting zones one by one", "reason", err)
		in = nil
	}
	// Inspecting a zone is a few netlink round trips, mostly waiting:
	// several at once.
	out := make([]zone.Observed, len(owners))
	sem := make(chan struct{}, listInspections)
	var wg sync.WaitGroup
	for i, o := range owners {
		if err := ctx.Err(); err != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			obs := zone.Observed{Name: o.Name, ID: o.ID, Hash: o.Hash}
			obs.Running, obs.Detail = r.inspect(o, in)
			out[i] = obs
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// listInspections bounds how many zones List inspects at once.
const listInspections = 8

// Names returns the names of the zones whose name begins with prefix and
// whose root carries this runtime's mark, without inspecting them (cheap
// where List, with many zones, is not).
func (r *Runtime) Names(ctx context.Context, prefix string) ([]string, error) {
	roots, err := r.globRoots(globEscape(prefix) + "*")
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, root := range roots {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if o, err := readOwner(root); err == nil && r.ourMark(o) && strings.HasPrefix(o.Name, prefix) && !seen[o.Name] {
			seen[o.Name] = true
			out = append(out, o.Name)
		}
	}
	return out, nil
}

// Inspect looks at one zone, as List does, without listing the others.
func (r *Runtime) Inspect(ctx context.Context, name string) (zone.Observed, bool, error) {
	roots, err := r.rootsOf(name)
	if err != nil {
		return zone.Observed{}, false, err
	}
	var unreadable error
	for _, root := range roots {
		if err := ctx.Err(); err != nil {
			return zone.Observed{}, false, err
		}
		o, err := readOwner(root)
		if err != nil && unreadable == nil && (transient(err) || r.livesUnmarked(root)) {
			unreadable = fmt.Errorf("zone %s: the mark of its root %s cannot be read, but its parts exist: %w", name, root, err)
		}
		if err != nil || !r.ourMark(o) {
			continue
		}
		obs := zone.Observed{Name: o.Name, ID: o.ID, Hash: o.Hash}
		obs.Running, obs.Detail = r.inspect(o, nil)
		return obs, true, nil
	}
	// A zone whose mark is lost while it runs is not known to be gone
	// (a VMM's monitor would fail the VMM and tear its zone down): it
	// cannot be told.
	return zone.Observed{}, false, unreadable
}

// inspect says whether a zone is whole and its service up, and if not, why.
// in, if not nil, has looked at the host's side of every zone.
func (r *Runtime) inspect(o owner, in *zonenet.Inspector) (bool, string) {
	if !zonenet.NetnsExists(o.Netns) {
		return false, "network namespace missing"
	}
	var z sledconfig.Zone
	if err := json.Unmarshal(o.Config, &z); err == nil {
		if nc, err := r.netConfig(zone.Spec{Name: o.Name, ID: o.ID, Config: z}); err == nil {
			inspect := zonenet.Inspect
			if in != nil {
				inspect = in.Inspect
			}
			parts, err := inspect(nc)
			if err != nil {
				return false, "inspecting network: " + err.Error()
			}
			if !parts.Complete() {
				return false, fmt.Sprintf("network incomplete: %+v", parts)
			}
		}
	}
	st, err := supervise.Status(r.serviceDir(o.Name))
	switch {
	case err != nil:
		return false, "service status: " + err.Error()
	case !st.Supervised:
		return false, "supervisor not running"
	case !st.Up:
		return false, "service down"
	}
	return true, ""
}

// rootPaths returns every path where a zone root may be, on datasets and
// legacy: List and Sweep read their marks to tell the zones from the rest.
func (r *Runtime) rootPaths() ([]string, error) {
	return r.globRoots(sledconfig.ZoneNamePrefix + "*")
}

// writeMark writes a zone's ownership mark into root, making root if it is
// missing. A first mark is written in place: nothing of the zone exists yet
// for it to prove, and a mark torn by a crash makes a legacy root litter for
// the restore protocol's sweep (which runs before any Ensure) and is
// replaced by the next Ensure of a root dataset. A mark already there may
// prove parts that exist, and is replaced atomically. In place saves the
// temp file's inode and the rename, which contend with every other zone's
// in the same directory.
func writeMark(root string, mark []byte) error {
	path := filepath.Join(root, ownerFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	}
	if errors.Is(err, fs.ErrExist) {
		return atomicfile.WriteFile(path, mark, atomicfile.Options{})
	}
	if err != nil {
		return err
	}
	_, err = f.Write(mark)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

func readOwner(root string) (owner, error) {
	var o owner
	data, err := os.ReadFile(filepath.Join(root, ownerFile))
	if err != nil {
		return o, err
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("%s: %w", filepath.Join(root, ownerFile), err)
	}
	return o, nil
}

// rootsOf finds the roots of a zone: where Ensure or List saw it, else in
// both places on any pool (a search that contends with every other zone's
// files).
func (r *Runtime) rootsOf(name string) ([]string, error) {
	r.mu.Lock()
	roots, ok := r.roots[name]
	roots = slices.Clone(roots)
	r.mu.Unlock()
	if ok {
		// On datasets first, as globRoots returns them.
		legacy := func(root string) int {
			if r.placeOf(root) == datasetPlace {
				return 0
			}
			return 1
		}
		slices.SortStableFunc(roots, func(a, b string) int { return cmp.Compare(legacy(a), legacy(b)) })
		return roots, nil
	}
	return r.globRoots(globEscape(name))
}

// noteRoot remembers that root is one of the named zone's roots.
func (r *Runtime) noteRoot(name, root string) {
	r.mu.Lock()
	if !slices.Contains(r.roots[name], root) {
		r.roots[name] = append(r.roots[name], root)
	}
	r.mu.Unlock()
}

func (r *Runtime) forgetRoot(name string) {
	r.mu.Lock()
	delete(r.roots, name)
	r.mu.Unlock()
}

// removeSocketDir removes an NTP zone's command socket directory,
// chrony.SocketDir(tag, id): ours by its name, which holds our tag and the
// zone's id (a UUID, checked before it makes a path).
func (r *Runtime) removeSocketDir(name, zoneID string) error {
	if !strings.HasPrefix(name, ntpZonePrefix) {
		return nil
	}
	if _, err := uuid.Parse(zoneID); err != nil || len(zoneID) != 36 {
		return fmt.Errorf("chrony socket directory: zone id %q is not a UUID", zoneID)
	}
	if err := os.RemoveAll(chrony.SocketDir(r.opts.Tag, strings.ToLower(zoneID))); err != nil {
		return fmt.Errorf("chrony socket directory: %w", err)
	}
	return nil
}

// ntpZonePrefix begins the names of NTP zones (both kinds).
const ntpZonePrefix = sledconfig.ZoneNamePrefix + "ntp_"

// idFromName returns the zone id at the end of a zone name.
func idFromName(name string) string {
	if len(name) < 36 {
		return ""
	}
	return name[len(name)-36:]
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}
