// Package agent assembles the sled agent daemon: ledger, config store, zone
// reconciler, runtime and HTTP API, and runs them until told to stop.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/hardware"
	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/prefix"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/servers"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/qemuvm"
	"github.com/sled-agent/sled-agent/internal/vmm/reservoir"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// vmmRecordDirs are the directories of the VMMs' records: vmms in each
// ledger directory.
func vmmRecordDirs(ledgerDirs []string) []string {
	out := make([]string, len(ledgerDirs))
	for i, d := range ledgerDirs {
		out[i] = filepath.Join(d, "vmms")
	}
	return out
}

// LedgerFile is the name of the sled config ledger in each ledger directory.
const LedgerFile = "omicron-sled-config.json"

// SimStateFile, in the data dir, holds the sim runtime's simulated OS.
const SimStateFile = "sim-state.json"

// PrefixStateFile, in the data dir, holds the routing prefixes this agent
// advertised.
const PrefixStateFile = "prefixes.json"

// ZoneHistoryFile, in the data dir, holds the zones' histories and the
// removed zones' last statuses across restarts.
const ZoneHistoryFile = "zone-history.json"

// Config is how the agent is set up. The JSON keys are the flag names.
type Config struct {
	Listen  string `json:"listen"`
	DataDir string `json:"data-dir"`
	// Netns, if set, is the network namespace the agent runs in as a sled
	// (internal/sledns): the command enters it before New.
	Netns string `json:"netns"`
	// MaxConnections caps the API's open connections; those beyond are
	// closed at once (0: httpbound.MaxConns, a quarter of the file
	// descriptor limit, at most 4096).
	MaxConnections int `json:"max-connections"`
	// BodyReadTimeout, if set, replaces every API operation's body read
	// deadline (tests).
	BodyReadTimeout time.Duration `json:"-"`
	// RunDir holds per-boot state of the linux runtime (default
	// /run/sled-agent, on a tmpfs).
	RunDir     string   `json:"run-dir"`
	LedgerDirs []string `json:"ledger-dir"`
	Runtime    string   `json:"runtime"`
	SledID     string   `json:"sled-id"`
	UnderlayIP string   `json:"underlay-ip"`
	// RackID is the rack's UUID, reported in inventory; empty: not known.
	RackID string `json:"rack-id"`
	// BaseboardPart, BaseboardSerial and BaseboardRevision, if set, are
	// the sled's baseboard whatever its firmware says (see hardware.Probe
	// for what is reported when the firmware does not say).
	BaseboardPart     string  `json:"baseboard-part"`
	BaseboardSerial   string  `json:"baseboard-serial"`
	BaseboardRevision *uint32 `json:"baseboard-revision"`
	// DDMURL is the routing daemon's admin API; empty: the agent manages
	// no routing prefixes (the run command's default is http://[::1]:8000).
	DDMURL string `json:"ddm-url"`
	// BootstrapPrefix is the sled's bootstrap /64, advertised with the
	// underlay /64; empty: none.
	BootstrapPrefix string `json:"bootstrap-prefix"`
	// PrefixPeriod is how often the originated set is checked when nothing
	// changed (0: 30s).
	PrefixPeriod time.Duration `json:"-"`
	// DNSServers are the internal DNS servers ("[addr]:port") that name the
	// switch daemons; Switches are switch daemon addresses used when DNS is
	// unreachable or names none. With neither, no NAT entries are managed.
	DNSServers []string `json:"dns-server"`
	Switches   []string `json:"switch"`
	// Nexus are Nexus internal API addresses ("[addr]:port"); empty:
	// Nexus is found through the DNS servers' SRV records, and with no
	// DNS server either, Nexus is told nothing.
	Nexus []string `json:"nexus"`
	// NATPeriod is how often switches are found and checked (0: 10s).
	NATPeriod time.Duration `json:"-"`
	Role      string        `json:"role"`
	SimFaults string        `json:"sim-faults"`
	// Images overrides what runs in the zones of a kind (linux runtime),
	// and how it shows it is ready:
	// {"crucible": ["/usr/bin/crucible-downstairs", "--listen", "{listen}"]}
	// or {"crucible": {"command": [...], "ready": {"http": {"path": "/healthz"}}}}.
	// See linux.Images for the forms and the placeholders.
	Images linux.Images `json:"images"`
	// RelistPeriod is how often zones are listed to catch deaths (0: default).
	RelistPeriod time.Duration `json:"-"`
	// HealthPeriod is how often every running zone is health-checked, and
	// HealthFailures how many checks in a row must fail before it is taken
	// as unhealthy and restarted (0: 5s and 3).
	HealthPeriod   time.Duration `json:"-"`
	HealthFailures int           `json:"-"`
	// LedgerCheckPeriod is how often the ledger copies are checked and bad
	// ones rewritten (0: 10s).
	LedgerCheckPeriod time.Duration `json:"-"`
	// SimStartDelay, if set, is how long each sim zone takes to start (dev).
	SimStartDelay func(zone.Spec) time.Duration `json:"-"`
	// VdevDir holds file-backed synthetic disks (u2_<name>.vdev) for the
	// linux runtime's storage; PoolRoot is where its pools are mounted
	// (default <data-dir>/storage).
	VdevDir  string `json:"vdev-dir"`
	PoolRoot string `json:"pool-root"`
	// StoragePeriod is how often every disk is checked when nothing asks
	// sooner (0: 30s): disks that come and go are followed by their events
	// (the kernel's, the vdev dir's, the sim's faults), the period is the
	// safety net.
	StoragePeriod time.Duration `json:"-"`
	// SkipTimesync lets zones that need synchronized time start without
	// it (development; upstream's TimeSyncConfig::Skip).
	SkipTimesync bool `json:"skip-timesync"`
	// NTPNoClock makes the linux runtime's NTP zones only track time
	// (chronyd -x), never set the host's clock (development and tests).
	NTPNoClock bool `json:"ntp-no-clock"`
	// VMMReservoirPercentage and VMMReservoirSizeMB size the VMM
	// reservoir (internal/vmm/reservoir): a percentage of usable memory or
	// a size in MiB, not both; neither is reservoir.DefaultPercentage.
	VMMReservoirPercentage int    `json:"vmm-reservoir-percentage"`
	VMMReservoirSizeMB     uint64 `json:"vmm-reservoir-size-mb"`
	// VMMImageDir is a directory of guest disk images that file backends
	// may name, beside the pools' local_storage datasets ("" for none).
	VMMImageDir string `json:"vmm-image-dir"`
	// VMMAccel is how the linux runtime's guests run: kvm, tcg, or auto
	// (KVM only where hardware virtualisation is really there).
	VMMAccel string `json:"vmm-accel"`
	// VMMStandIn makes every VMM's guest a stand-in (internal/vmm/standin):
	// simulated, its NICs veth pairs whose host ends are named and placed
	// as its taps would be, into a network namespace of its own (tests of
	// guests' networking; needs root).
	VMMStandIn bool `json:"vmm-stand-in"`
	// VPCDataPath runs the sled's VPC data path (internal/vpc/vpcd) in the
	// agent and has it realise what the sled is told: guests' and service
	// zones' ports, their rules and routes, the v2p mappings (needs root).
	// It serves its local API on <run-dir>/<zone-tag>-vpcd.sock.
	VPCDataPath bool `json:"vpc-data-path"`
	// VMMQEMUIDs is the range of user and group ids the VMM services run
	// QEMU as, FIRST:COUNT ("" for the services' default, see qemuvm).
	VMMQEMUIDs string `json:"vmm-qemu-ids"`
	// ZoneTag and NetnsPrefix give a linux runtime's OS objects another
	// ownership tag and name prefix (tests; default "sled-agent" and none).
	ZoneTag     string `json:"-"`
	NetnsPrefix string `json:"-"`
	// TmpfsRunDir has the linux runtime mount a tmpfs on RunDir, if it is
	// not on one, whatever RunDir is (tests; it always does on the default).
	TmpfsRunDir bool `json:"-"`
}

// Defaults for development on one machine.
const (
	DefaultListen     = "[::1]:12345"
	DefaultUnderlayIP = "fd00:1122:3344:101::1"
	DefaultRole       = "gimlet"
	DefaultRuntime    = "sim"
	DefaultRunDir     = "/run/sled-agent"
	DefaultDDMURL     = "http://[::1]:8000"
)

// LoadFile reads a config file (JSON with the flag names as keys) into c,
// for the keys the file sets.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading agent config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return fmt.Errorf("agent config %s: %w", path, err)
	}
	return nil
}

// Agent is a running sled agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	ln       net.Listener
	rec      *reconciler.Reconciler
	store    *configstore.Store
	server   *api.Server
	sim      *sim.Runtime
	identity api.Identity
	// watch, if set, reports runtime events until its ctx ends.
	watch func(context.Context) error
	// lock holds the data dir (and, for the linux runtime, the host's
	// zones of its tag) for this agent until Run returns or Close.
	lock io.Closer
	// prefixes, if set, keeps the sled's routing prefixes in DDM.
	prefixes *prefix.Reconciler
	// nat, if set, keeps the sled's NAT entries on every switch.
	nat *nat.Reconciler
	// vmms hosts the VMMs.
	vmms *vmm.Manager
	// localOp orders the changes of the local storage allocations
	// (localstorage.go): one at a time, a waiter giving up when its
	// request ends.
	localOp chan struct{}
	// guestHost makes a VMM zone's service reachable; accel and accelWhy
	// are how the linux runtime's guests run, and reservoir their memory
	// (vmmhost.go).
	guestHost       vmm.Host
	guestSled       func() spec.Sled
	accel, accelWhy string
	reservoir       *reservoir.Account
	// storage, if set, realises the config's disks and datasets (sim
	// runtime; storage.go).
	storage *storage.Reconciler
	// timeSync watches the sled's NTP zone; zones that need synchronized
	// time wait for it (timesync.go).
	timeSync *timesync.Watcher
	// nexus, if set, tells Nexus of the sled and its VMMs' states
	// (nexus.go).
	nexus *nexusLink
	// ntpServers, if set, keeps the internal NTP zones on the rack's
	// boundary NTP servers (linux runtime with --dns-server; timesync.go).
	ntpServers *servers.Follower
	// vpc is the record of what Nexus told the sled about guest
	// networking (vpc.go).
	vpc *told.Store
	// vpcAPI is the sled's VPC data path (--vpc-data-path), nil without
	// it; vpcd is it when it runs in the agent (the sim runtime), else it
	// is a service of its own (the linux runtime).
	vpcAPI dataPathAPI
	vpcd   *vpcd.Daemon
	// probes makes the probes' zones (probes.go), nil unless the data
	// path runs with the linux runtime.
	probes   *probes.Reconciler
	underlay netip.Addr
	// ddm is the routing daemon's client (nil without --ddm-url): the
	// switches' tunnel endpoints come from it.
	ddm *ddm.Client
	// wanted is the config the reconcilers were last given.
	wanted atomic.Pointer[sledconfig.Config]
}

// New prepares an agent: it loads the ledger, binds the listener and builds
// every component. Nothing acts until Run.
func New(cfg Config, log *slog.Logger) (_ *Agent, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.Role == "" {
		cfg.Role = DefaultRole
	}
	if cfg.UnderlayIP == "" {
		cfg.UnderlayIP = DefaultUnderlayIP
	}
	if cfg.Role != "gimlet" && cfg.Role != "scrimlet" {
		return nil, fmt.Errorf("role %q: must be gimlet or scrimlet", cfg.Role)
	}
	underlay, err := netip.ParseAddr(cfg.UnderlayIP)
	if err != nil || !underlay.Is6() || underlay.Is4In6() {
		return nil, fmt.Errorf("underlay-ip %q: must be an IPv6 address", cfg.UnderlayIP)
	}
	if err := cfg.Images.Validate(); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	var bootstrap netip.Prefix
	if cfg.BootstrapPrefix != "" {
		if bootstrap, err = netip.ParsePrefix(cfg.BootstrapPrefix); err != nil || !bootstrap.Addr().Is6() || bootstrap.Addr().Is4In6() || bootstrap.Bits() != 64 || bootstrap.Masked() != bootstrap {
			return nil, fmt.Errorf("bootstrap-prefix %q: must be an IPv6 /64 with the host bits zero, like fdb0:a840:2504:101::/64", cfg.BootstrapPrefix)
		}
	}
	if cfg.HealthPeriod < 0 || cfg.HealthFailures < 0 {
		return nil, fmt.Errorf("health-period %s and health-failures %d: must not be negative", cfg.HealthPeriod, cfg.HealthFailures)
	}
	if cfg.MaxConnections < 0 {
		return nil, fmt.Errorf("max-connections %d: must not be negative", cfg.MaxConnections)
	}
	natOpts, err := natOptions(cfg, underlay)
	if err != nil {
		return nil, err
	}
	rackID := ""
	if cfg.RackID != "" {
		var ok bool
		if rackID, ok = parseUUID(cfg.RackID); !ok {
			return nil, fmt.Errorf("rack-id %q is not a UUID", cfg.RackID)
		}
	}
	hw, hwNotes, err := hardware.Probe(hardware.Options{
		Part:     cfg.BaseboardPart,
		Serial:   cfg.BaseboardSerial,
		Revision: cfg.BaseboardRevision,
	})
	if err != nil {
		return nil, fmt.Errorf("probing the sled's hardware: %w", err)
	}
	var ddmClient *ddm.Client
	if cfg.DDMURL != "" {
		if ddmClient, err = ddm.NewClient(cfg.DDMURL); err != nil {
			return nil, fmt.Errorf("ddm-url: %w", err)
		}
	}
	if cfg.DataDir == "" {
		return nil, errors.New("data-dir is required")
	}
	// Every flag is checked before anything is written (data dir, lock,
	// sled id): a refused start leaves the host as it was.
	if cfg.Runtime != "sim" && cfg.Runtime != "linux" {
		return nil, fmt.Errorf("runtime %q: want sim or linux", cfg.Runtime)
	}
	if cfg.SimFaults != "" && cfg.Runtime != "sim" {
		return nil, fmt.Errorf("sim-faults is only for the sim runtime, not %q", cfg.Runtime)
	}
	if _, ok := parseUUID(cfg.SledID); cfg.SledID != "" && !ok {
		return nil, fmt.Errorf("sled-id %q is not a UUID", cfg.SledID)
	}
	if _, err := reservoir.Size(hw.PhysicalRAM, cfg.VMMReservoirPercentage, cfg.VMMReservoirSizeMB); err != nil {
		return nil, fmt.Errorf("vmm reservoir: %w", err)
	}
	if cfg.VMMQEMUIDs != "" {
		if _, err := qemuvm.ParseIDRange(cfg.VMMQEMUIDs); err != nil {
			return nil, fmt.Errorf("vmm-qemu-ids: %w", err)
		}
	}
	// The API's port is taken first too: one in use is refused before the
	// data dir is touched. Where another agent holds this data dir (and so,
	// likely, the port) that is what is said.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if held := dataDirHeld(cfg.DataDir); held != nil {
			return nil, held
		}
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer func() {
		if err != nil {
			ln.Close()
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// One agent per data dir, and per host and zone tag: two would fight
	// over the same zones. Taken before anything touches the OS.
	lock, err := lockFor(cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if len(cfg.LedgerDirs) == 0 {
		cfg.LedgerDirs = []string{filepath.Join(cfg.DataDir, "ledger-a"), filepath.Join(cfg.DataDir, "ledger-b")}
	}
	sledID, err := sledIdentity(cfg.DataDir, cfg.SledID)
	if err != nil {
		return nil, err
	}
	cfg.SledID = sledID

	a := &Agent{cfg: cfg, log: log.With("sled_id", sledID), lock: lock, localOp: make(chan struct{}, 1)}
	for _, n := range hwNotes {
		a.log.Info("hardware not read from the host", "component", "hardware", "note", n)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rt, err := newRuntime(cfg, a.log.With("component", "runtime"), a.vmmServiceArgs)
	if err != nil {
		return nil, err
	}
	a.sim, _ = rt.(*sim.Runtime)
	if lrt, ok := rt.(*linux.Runtime); ok {
		a.watch = lrt.Watch
	}
	if cfg.SimFaults != "" && a.sim == nil {
		return nil, fmt.Errorf("sim-faults is only for the sim runtime, not %q", cfg.Runtime)
	}
	var onRunningChange, onPresentChange []func() // set below, before anything runs
	zs := &zoneStorage{}                          // its reconciler set below
	zt := &zoneTimeSync{}                         // its watcher set below
	a.rec = reconciler.New(rt, a.log.With("component", "reconciler"), reconciler.Options{
		Storage:        zs,
		TimeSync:       zt,
		RelistPeriod:   cfg.RelistPeriod,
		HealthPeriod:   cfg.HealthPeriod,
		HealthFailures: cfg.HealthFailures,
		HistoryFile:    filepath.Join(cfg.DataDir, ZoneHistoryFile),
		Metrics:        reconciler.NewMetrics(reg),
		OnRunningChange: func() {
			for _, f := range onRunningChange {
				f()
			}
		},
		OnPresentChange: func() {
			for _, f := range onPresentChange {
				f()
			}
		},
	})
	a.ddm = ddmClient
	if ddmClient != nil {
		a.prefixes = prefix.New(ddmClient, a.rec, prefix.Options{
			Bootstrap: bootstrap,
			Underlay:  underlay,
			Period:    cfg.PrefixPeriod,
			StateFile: filepath.Join(cfg.DataDir, PrefixStateFile),
			Log:       a.log.With("component", "prefixes"),
		})
		onPresentChange = append(onPresentChange, a.prefixes.Poke)
	}
	if natOpts != nil {
		natOpts.Log = a.log.With("component", "nat")
		a.nat = nat.New(a.rec, *natOpts)
		onRunningChange = append(onRunningChange, a.nat.Poke)
	}
	if err := a.vmmHost(cfg, rt, hw); err != nil {
		return nil, err
	}
	claimSet := sledClaims(underlay) // zones and VMMs never share an id or address
	var resolver *dns.Resolver       // internal DNS, for Nexus and NTP servers
	if natOpts != nil {
		resolver, _ = natOpts.Resolver.(*dns.Resolver)
	}
	if a.nexus, err = newNexus(cfg, a, resolver); err != nil {
		return nil, err
	}
	var vmmStates vmm.States
	if a.nexus != nil {
		vmmStates = a.nexus
	}
	// After the runtime, which makes its run dir (the boot's token is kept
	// there).
	boot, err := hostBoot(cfg)
	if err != nil {
		// VMMs are then not judged by the boot they were recorded in: one
		// whose zone is gone stays failed until unregistered.
		a.log.Error("naming this boot of the host", "err", err)
	}
	a.vmms = vmm.New(rt, a.guestHost, vmm.Options{
		States: vmmStates,
		Boot:   boot,
		// Each VMM's record is kept like the sled config: a copy in each
		// ledger directory. An earlier agent kept one file per VMM in the
		// data dir; those are rewritten as records at start.
		RecordDirs: vmmRecordDirs(cfg.LedgerDirs),
		LegacyDir:  filepath.Join(cfg.DataDir, "vmms"),
		Claims:     claimSet,
		Sled:       a.guestSled,
		Identity:   vmm.SledIdentity{ID: sledID, Serial: hw.Baseboard.Serial, Model: hw.Baseboard.Part, Revision: hw.Baseboard.Revision},
		Reservoir:  a.reservoir,
		Log:        a.log.With("component", "vmm"),
	})
	// A zone may have died: the zone reconciler relists, VMM monitors look.
	rt.SetNotify(func() {
		a.rec.Poke()
		a.vmms.Poke()
	})

	l, err := ledger.Open(cfg.LedgerDirs, LedgerFile, a.log.With("component", "ledger"))
	if err != nil {
		return nil, fmt.Errorf("opening ledger: %w", err)
	}
	if a.storage, err = newStorage(cfg, a.sim, a.rec, a.log.With("component", "storage")); err != nil {
		return nil, err
	}
	zs.s = a.storage
	a.store = configstore.Open(l, a.log.With("component", "configstore"), func(cfg *sledconfig.Config) {
		a.storageConfig(cfg)
		a.wanted.Store(cfg)
		a.rec.Update(cfg)
		if a.timeSync != nil {
			a.timeSync.Poke() // the NTP zone may be new, or gone
		}
	}, configstore.Options{
		CheckPeriod:  cfg.LedgerCheckPeriod,
		SledUnderlay: underlay,
	})
	useClaims(a.store, claimSet, a.log)
	a.timeSync = a.newTimeSync(cfg, a.log.With("component", "timesync"))
	zt.w = a.timeSync
	// An NTP zone that starts is asked at once.
	onRunningChange = append(onRunningChange, a.timeSync.Poke)
	if a.watch != nil && resolver != nil {
		if a.ntpServers, err = a.newNTPServers(resolver, zs, a.log.With("component", "ntp-servers")); err != nil {
			return nil, err
		}
		onRunningChange = append(onRunningChange, a.ntpServers.Poke)
	}

	vpcOpts := told.Options{
		Dirs: cfg.LedgerDirs,
		Sled: vpcSled{a},
		Log:  a.log.With("component", "vpc"),
	}
	if cfg.VPCDataPath {
		if os.Geteuid() != 0 {
			return nil, errors.New("vpc-data-path: the data path reads and writes guests' links and the underlay: it needs root")
		}
		a.underlay = underlay
		if cfg.Runtime == "linux" {
			// A service of its own, started (if it is not running) by
			// runVPC: it outlives the agent.
			a.vpcAPI = vpcd.NewClient(a.vpcSocket())
		} else {
			if a.vpcd, err = vpcd.Start(vpcd.Options{Underlay: underlay, Log: a.log.With("component", "vpcd")}); err != nil {
				return nil, fmt.Errorf("starting the VPC data path: %w", err)
			}
			a.vpcAPI = vpcd.Local{D: a.vpcd}
		}
		vpcOpts.DataPath = vpcPath{a: a, d: a.vpcAPI}
		// Probes' zones are network namespaces with either runtime, as
		// stand-in guests are: a port needs a link to attach to.
		a.probes = probes.New(probes.Options{Zones: probeZones(cfg), Log: a.log.With("component", "probes")})
	}
	if a.vpc, err = told.Open(vpcOpts); err != nil {
		if a.vpcd != nil {
			a.vpcd.Close()
		}
		return nil, fmt.Errorf("opening the record of what the sled was told: %w", err)
	}

	a.ln = ln
	// Other sleds and the control plane reach the agent at the sled's
	// underlay address, on the port it listens on.
	port := ln.Addr().(*net.TCPAddr).Port
	a.identity = api.Identity{
		SledID:   sledID,
		Address:  net.JoinHostPort(underlay.String(), strconv.Itoa(port)),
		Role:     cfg.Role,
		RackID:   rackID,
		Hardware: hw,
	}
	a.log.Info("sled identity", "address", a.identity.Address, "rack_id", rackID,
		"baseboard_part", hw.Baseboard.Part, "baseboard_serial", hw.Baseboard.Serial, "baseboard_revision", hw.Baseboard.Revision,
		"cpu_family", hw.CPUFamily, "physical_ram", hw.PhysicalRAM, "hardware_threads", hw.HardwareThreads)
	deps := api.Deps{
		Reservoir:  a.reservoir,
		Accel:      a.accel,
		AccelWhy:   a.accelWhy,
		Identity:   a.identity,
		Configs:    a.store,
		Reconciler: a.rec,
		Log:        a.log.With("component", "api"),
		Registry:   reg,

		BodyReadTimeout: cfg.BodyReadTimeout,
	}
	if a.sim != nil {
		deps.Faults = a.sim
	}
	if a.prefixes != nil {
		deps.Prefixes, deps.DDMURL = a.prefixes, cfg.DDMURL
	}
	if a.nat != nil {
		deps.NAT = a.nat
	}
	deps.VMMs, deps.SledUnderlay = a.vmms, underlay
	deps.VPC = a.vpc
	if a.probes != nil {
		a.probes.Set(a.vpc.View().Probes)
		deps.VPC = vpcWithProbes{Store: a.vpc, probes: a.probes}
		deps.Probes = a.probes
	}
	if a.nexus != nil {
		deps.Nexus = a.nexus
	}
	if a.storage != nil {
		deps.Storage, deps.LocalStorage = a.storage, a
	}
	deps.TimeSync = a.timeSync
	if a.ntpServers != nil {
		deps.NTPServers = a.ntpServers
	}
	a.server = api.New(deps)
	return a, nil
}

// Addr is the address the API listens on.
func (a *Agent) Addr() string { return a.ln.Addr().String() }

// SledID is the sled's id.
func (a *Agent) SledID() string { return a.cfg.SledID }

// Identity is what the sled is, as inventory reports it.
func (a *Agent) Identity() api.Identity { return a.identity }

// NAT exposes the NAT reconciler, or nil when the agent manages no NAT
// entries.
func (a *Agent) NAT() *nat.Reconciler { return a.nat }

// Storage exposes the storage reconciler, or nil when the agent manages no
// storage.
func (a *Agent) Storage() *storage.Reconciler { return a.storage }

// natOptions builds the NAT reconciler's options from cfg, or nil when no
// switch can be found (no DNS server, no fallback switch).
func natOptions(cfg Config, underlay netip.Addr) (*nat.Options, error) {
	if len(cfg.DNSServers) == 0 && len(cfg.Switches) == 0 {
		return nil, nil
	}
	opts := &nat.Options{Underlay: underlay, Period: cfg.NATPeriod}
	servers, err := parseAddrPorts("dns-server", cfg.DNSServers)
	if err != nil {
		return nil, err
	}
	if opts.Fallback, err = parseAddrPorts("switch", cfg.Switches); err != nil {
		return nil, err
	}
	if len(servers) > 0 {
		r, err := dns.NewResolver(servers, 0)
		if err != nil {
			return nil, err
		}
		opts.Resolver = r
	}
	return opts, nil
}

// Prefixes exposes the prefix reconciler, or nil when the agent manages no
// prefixes.
func (a *Agent) Prefixes() *prefix.Reconciler { return a.prefixes }

// Reconciler exposes the zone reconciler (dev progress, benchmarks).
func (a *Agent) Reconciler() *reconciler.Reconciler { return a.rec }

// Store exposes the config store.
func (a *Agent) Store() *configstore.Store { return a.store }

// Sim is the sim runtime, or nil.
func (a *Agent) Sim() *sim.Runtime { return a.sim }

// Close releases what New took (the listener and the data dir) when Run is
// not going to be called. Run releases them itself.
func (a *Agent) Close() error { return errors.Join(a.ln.Close(), a.lock.Close()) }

// Run serves the API and reconciles until ctx is cancelled, then shuts down
// gracefully. Zones are left running: stopping the agent is not destroying
// its zones.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Headers, bodies (per operation, in the API) and idle connections
	// have deadlines, and the connections a cap: no client can hold the
	// agent's memory or file descriptors.
	srv := httpbound.NewServer(a.server.Handler())
	srv.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)
	ln := httpbound.Listener(a.ln, cmp.Or(a.cfg.MaxConnections, httpbound.MaxConns()), a.log.With("component", "api"))
	// VMMs outlive the agent: take back the ones the last agent left
	// (their states go to Nexus once its link runs, below).
	if n, err := a.vmms.Resume(); err != nil {
		a.log.Error("adopting VMMs", "err", err, "adopted", n)
	} else if n > 0 {
		a.log.Info("adopted VMMs", "count", n)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := a.rec.Run(ctx); err != nil {
			errc <- fmt.Errorf("reconciler: %w", err)
		}
	})
	wg.Go(func() { a.store.Run(ctx) })
	wg.Go(func() { a.vmms.Run(ctx, cmp.Or(a.cfg.LedgerCheckPeriod, configstore.DefaultCheckPeriod)) })
	if a.prefixes != nil {
		wg.Go(func() { a.prefixes.Run(ctx) })
	}
	if a.nat != nil {
		wg.Go(func() { a.nat.Run(ctx) })
	}
	if a.storage != nil {
		wg.Go(func() { a.runStorage(ctx) })
	}
	if a.nexus != nil {
		wg.Go(func() { a.nexus.run(ctx) })
	}
	wg.Go(func() { a.runTimeSync(ctx) })
	if a.vpcAPI != nil {
		// restarted tells runV2B the data path came back empty.
		restarted := make(chan struct{}, 1)
		wg.Go(func() { a.runVPC(ctx, restarted) })
		if a.probes != nil {
			wg.Go(func() { a.probes.Run(ctx) })
		}
		if a.ddm != nil {
			wg.Go(func() { a.runV2B(ctx, restarted) })
		}
	}
	if a.ntpServers != nil {
		wg.Go(func() { a.ntpServers.Run(ctx) })
	}
	if a.watch != nil {
		wg.Go(func() {
			if err := a.watch(ctx); err != nil && ctx.Err() == nil {
				// The relist still catches dead zones, only later.
				a.log.Error("watching zone events failed; relying on the periodic relist", "err", err)
			}
		})
	}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("api server: %w", err)
			cancel()
		}
	})
	a.log.Info("sled agent serving", "addr", a.Addr(), "runtime", a.cfg.Runtime, "role", a.cfg.Role)
	<-ctx.Done()
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shutCancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		srv.Close()
	}
	wg.Wait()
	a.vmms.Close() // monitors stop; the VMMs keep running
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	a.lock.Close()
	a.log.Info("sled agent stopped; zones left running")
	return errors.Join(errs...)
}

// runtime is what the agent needs of a zone runtime.
type runtime interface {
	reconciler.Runtime
	SetNotify(func())
}

// newRuntime builds the zone runtime cfg names.
func newRuntime(cfg Config, log *slog.Logger, vmmArgs func() []string) (runtime, error) {
	switch cfg.Runtime {
	case "sim":
		// The simulated OS outlives the agent, as a real one does.
		rt, err := sim.Open(sim.Options{StartDelay: cfg.SimStartDelay, StateFile: filepath.Join(cfg.DataDir, SimStateFile)})
		if err != nil {
			return nil, err
		}
		if cfg.SimFaults != "" {
			f, err := sim.LoadFaults(cfg.SimFaults)
			if err != nil {
				return nil, err
			}
			if err := rt.SetFaults(f); err != nil {
				return nil, fmt.Errorf("%s: %w", cfg.SimFaults, err)
			}
		}
		return rt, nil
	case "linux":
		runDir := cmp.Or(cfg.RunDir, DefaultRunDir)
		return linux.New(linux.Options{
			DataDir:     cfg.DataDir,
			DataDirLock: filepath.Join(cfg.DataDir, lockFile),
			RunDir:      runDir,
			TmpfsRunDir: runDir == DefaultRunDir || cfg.TmpfsRunDir,
			Tag:         cfg.ZoneTag,
			Sled:        cfg.SledID,
			NetnsPrefix: cfg.NetnsPrefix,
			PoolRoot:    poolRoot(cfg),
			NTPNoClock:  cfg.NTPNoClock,
			VPC:         cfg.VPCDataPath,
			Images:      cfg.Images, // validated by New
			VMMArgs:     vmmArgs,
			Log:         log,
		})
	default:
		return nil, fmt.Errorf("runtime %q: want sim or linux", cfg.Runtime)
	}
}

// sledIdentity returns the sled id: the configured one, else the one kept in
// the data dir, else a new one, which is kept.
func sledIdentity(dataDir, configured string) (string, error) {
	path := filepath.Join(dataDir, "sled-id")
	kept := ""
	if data, err := os.ReadFile(path); err == nil {
		s := strings.TrimSpace(string(data))
		id, ok := parseUUID(s)
		if !ok {
			return "", fmt.Errorf("%s holds %q, not a UUID: fix or remove it", path, s)
		}
		kept = id
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading sled id: %w", err)
	}
	id := kept
	if configured != "" {
		var ok bool
		if id, ok = parseUUID(configured); !ok {
			return "", fmt.Errorf("sled-id %q is not a UUID", configured)
		}
		if kept != "" && id != kept {
			return "", fmt.Errorf("sled-id %s differs from the id %s kept in %s: a sled's identity does not change; remove that file to give this data dir a new identity", id, kept, path)
		}
	}
	if id == "" {
		id = uuid.NewString()
	}
	if kept == "" {
		if err := atomicfile.WriteFile(path, []byte(id+"\n"), atomicfile.Options{Perm: 0o600, Durable: true}); err != nil {
			return "", fmt.Errorf("keeping sled id: %w", err)
		}
	}
	return id, nil
}

// parseUUID accepts only the canonical 36-character form, in either case, and
// returns it in lower case.
func parseUUID(s string) (string, bool) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return "", false
	}
	return u.String(), true
}

// Example returns a realistic example sled config (a real one from a rack).
func Example() []byte { return sledconfig.Example() }
