// Package nat keeps this sled's NAT entries right on every switch. The
// upstream agent set NAT entries up inside zone start: it blocked zone start
// for minutes waiting for both switches, gave up on one forever, waited
// forever on a dead one, and never noticed a replaced one. Here NAT is a
// reconciler of its own, outside zone start: every period, and whenever a
// zone starts or stops running, it finds the switch daemons (dpd) through
// internal DNS (or static fallback addresses) and makes each of them hold
// exactly this sled's entries, each switch on its own, so a slow or dead
// switch never delays the others.
//
// Desired: one entry per running zone with external connectivity (nexus:
// its external_ip; external_dns: its dns_address's IP; both with ports
// 0–65535; boundary_ntp: its snat_cfg IP and port range), targeting this
// sled's underlay address, the zone NIC's MAC and VNI. The entries of a
// switch this reconciler owns are this sled's service entries: those in the
// services VPC (VNI 100, as upstream's reconciler owns only the service
// VNIs) whose target is this sled's underlay address. Those not desired (or
// different) are deleted, missing ones created. Entries in any other VNI
// are never touched, though they target this sled too: Nexus writes them
// for its instances' external IPs. An entry not ours that overlaps one of
// ours (dpd answers 409: another sled's, or an instance's) is reported,
// never overwritten.
package nat

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// ServicesVNI is the VNI of the services VPC (upstream's
// Vni::SERVICES_VNI): every service zone's NIC is in it, and the NAT
// entries this reconciler owns are those in it.
const ServicesVNI = 100

// Switch is what the reconciler needs of one switch daemon
// (internal/dpd.Client).
type Switch interface {
	AllNAT(ctx context.Context) ([]dpd.NatEntry, error)
	CreateNAT(ctx context.Context, e dpd.NatEntry) error
	DeleteNAT(ctx context.Context, external netip.Addr, low uint16) error
	SwitchIdentifiers(ctx context.Context) (dpd.SwitchIdentifiers, error)
}

// Resolver finds the switch daemons in internal DNS (internal/dns.Resolver).
type Resolver interface {
	LookupSwitches(ctx context.Context) ([]netip.AddrPort, error)
}

// Zones is what the reconciler needs of the zone reconciler.
type Zones interface {
	RunningSpecs() []zone.Spec
	Restored() <-chan struct{}
	// Unmanaged names the zones no config judges (reconciler.Unmanaged):
	// while there are any, this sled's entries no zone wants may be
	// theirs, and none is deleted.
	Unmanaged() []string
}

// Options set the reconciler up. Zero values take the defaults.
type Options struct {
	// Underlay is this sled's underlay address: the target of its entries,
	// and how its entries are told from other sleds'.
	Underlay netip.Addr
	// Resolver finds the switches; nil: Fallback only.
	Resolver Resolver
	// Fallback are switch addresses used when DNS is unreachable or knows
	// none.
	Fallback []netip.AddrPort
	// NewSwitch makes a client for a switch at addr (default: a dpd client
	// of http://addr).
	NewSwitch func(addr netip.AddrPort) (Switch, error)
	// Period is how often switches are found and checked (10s).
	Period time.Duration
	// CallTimeout bounds each call to a switch, and DiscoveryTimeout the
	// DNS lookups of one discovery (5s each).
	CallTimeout      time.Duration
	DiscoveryTimeout time.Duration
	Log              *slog.Logger
}

// Reconciler makes every switch hold exactly this sled's NAT entries.
type Reconciler struct {
	zones Zones
	opts  Options
	poke  chan struct{}

	mu        sync.Mutex
	discovery Discovery          // guarded by mu
	workers   map[string]*worker // guarded by mu; by switch address
	ignored   []string           // guarded by mu; the last Status.Ignored logged
}

// Discovery is what the last search for switches found.
type Discovery struct {
	At *time.Time `json:"at,omitempty"`
	// Source is "dns" when DNS named switches, "fallback" otherwise.
	Source string `json:"source,omitempty"`
	// DNSError says why DNS did not name switches, if it did not.
	DNSError string `json:"dns_error,omitempty"`
}

// Status is what the reconciler reports.
type Status struct {
	Discovery Discovery `json:"discovery"`
	// Desired are this sled's entries, as "external low-high → target".
	Desired []string `json:"desired"`
	// Ignored are running zones with external connectivity whose NIC is
	// not in the services VPC: no entry is made for them, since an entry
	// outside VNI 100 is not this reconciler's to delete again.
	Ignored  []string       `json:"ignored,omitempty"`
	Switches []SwitchStatus `json:"switches"`
}

// SwitchStatus is one switch as the reconciler last saw it.
type SwitchStatus struct {
	Address string `json:"address"`
	// FoundBy is "dns" or "fallback".
	FoundBy string  `json:"found_by"`
	Slot    *uint16 `json:"slot,omitempty"`
	// Desired and Present count this sled's entries wanted and, after the
	// last pass, held by the switch.
	Desired     int        `json:"desired"`
	Present     int        `json:"present"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// Conflicts are wanted entries the switch refused because an entry
	// not ours (another sled's, or an instance's) overlaps them; they are
	// reported, not overwritten.
	Conflicts []string `json:"conflicts,omitempty"`
	// Kept are this sled's entries no zone of the config wants, not
	// deleted because zones run that no readable config judges (the
	// ledger lost or corrupt): they may be theirs.
	Kept     []string `json:"kept,omitempty"`
	Passes   uint64   `json:"passes"`
	Failures uint64   `json:"failures"`
}

// New returns a reconciler; Run runs it.
func New(zones Zones, opts Options) *Reconciler {
	opts.Period = cmp.Or(opts.Period, 10*time.Second)
	opts.CallTimeout = cmp.Or(opts.CallTimeout, 5*time.Second)
	opts.DiscoveryTimeout = cmp.Or(opts.DiscoveryTimeout, 5*time.Second)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.NewSwitch == nil {
		opts.NewSwitch = func(addr netip.AddrPort) (Switch, error) { return dpd.NewClient("http://" + addr.String()) }
	}
	return &Reconciler{zones: zones, opts: opts, poke: make(chan struct{}, 1), workers: map[string]*worker{}}
}

// Poke asks every switch to be checked now. It never blocks.
func (r *Reconciler) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Status returns a snapshot; it never waits for a pass.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	st := Status{Discovery: r.discovery, Switches: []SwitchStatus{}}
	ws := make([]*worker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	want, ignored := desired(r.zones.RunningSpecs(), r.opts.Underlay)
	for _, e := range want {
		st.Desired = append(st.Desired, describe(e))
	}
	st.Ignored = ignored
	if st.Desired == nil {
		st.Desired = []string{}
	}
	for _, w := range ws {
		st.Switches = append(st.Switches, w.snapshot())
	}
	slices.SortFunc(st.Switches, func(a, b SwitchStatus) int { return cmp.Compare(a.Address, b.Address) })
	return st
}

// Run reconciles until ctx ends. Nothing happens before the zones found at
// start-up are adopted. Switches are found every period; each is checked
// by its own worker, every period and on Poke.
func (r *Reconciler) Run(ctx context.Context) error {
	select {
	case <-r.zones.Restored():
	case <-ctx.Done():
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(r.opts.Period)
	defer tick.Stop()
	r.discover(ctx, &wg)
	r.kickAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r.discover(ctx, &wg)
			r.kickAll()
		case <-r.poke:
			// A change of the running zones: every known switch now; the
			// switches themselves are looked for again at the period.
			r.kickAll()
		}
	}
}

// noteIgnored logs the zones Desired ignores when they change.
func (r *Reconciler) noteIgnored(ignored []string) {
	r.mu.Lock()
	changed := !slices.Equal(ignored, r.ignored)
	r.ignored = ignored
	r.mu.Unlock()
	if changed && len(ignored) > 0 {
		r.opts.Log.Warn("zones with a NIC outside the services VPC get no NAT entry", "zones", ignored, "services_vni", ServicesVNI)
	}
}

// kickAll asks every worker for a pass.
func (r *Reconciler) kickAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		w.kick()
	}
}

// discover finds the switches and starts and stops workers to match.
func (r *Reconciler) discover(ctx context.Context, wg *sync.WaitGroup) {
	now := time.Now()
	d := Discovery{At: &now, Source: "dns"}
	var found []netip.AddrPort
	if r.opts.Resolver == nil {
		d.DNSError = "no DNS servers configured"
	} else {
		dctx, cancel := context.WithTimeout(ctx, r.opts.DiscoveryTimeout)
		var err error
		found, err = r.opts.Resolver.LookupSwitches(dctx)
		cancel()
		switch {
		case err != nil:
			d.DNSError = err.Error()
		case len(found) == 0:
			d.DNSError = "DNS names no switch"
		}
	}
	if d.DNSError != "" {
		d.Source, found = "fallback", r.opts.Fallback
		if r.opts.Resolver != nil {
			r.opts.Log.Warn("switch discovery through DNS failed; using the fallback switches", "err", d.DNSError, "fallback", r.opts.Fallback)
		}
	}
	want := map[string]netip.AddrPort{}
	for _, a := range found {
		want[a.String()] = a
	}
	var gone, added []string
	var failed []error
	r.mu.Lock()
	r.discovery = d
	for addr, w := range r.workers {
		if _, ok := want[addr]; !ok {
			w.stop()
			delete(r.workers, addr)
			gone = append(gone, addr)
		}
	}
	for addr, a := range want {
		if w, ok := r.workers[addr]; ok {
			w.setFoundBy(d.Source)
			continue
		}
		sw, err := r.opts.NewSwitch(a)
		if err != nil {
			failed = append(failed, fmt.Errorf("switch %s: %w", addr, err))
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w := newWorker(r, addr, d.Source, sw, cancel)
		r.workers[addr] = w
		added = append(added, addr)
		wg.Go(func() { w.run(wctx) })
	}
	r.mu.Unlock()
	// Logged with no lock held.
	for _, addr := range gone {
		r.opts.Log.Info("switch no longer found; no longer checked", "switch", addr)
	}
	for _, addr := range added {
		r.opts.Log.Info("switch found", "switch", addr, "by", d.Source)
	}
	for _, err := range failed {
		r.opts.Log.Error("making a client for a switch", "err", err)
	}
}

// Desired returns the NAT entries of the running zones, targeting underlay.
// Zones without a NIC have no target and so no entry; nor have zones whose
// NIC is outside the services VPC (see Status.Ignored).
func Desired(running []zone.Spec, underlay netip.Addr) []dpd.NatEntry {
	out, _ := desired(running, underlay)
	return out
}

// owned reports whether e is one of the entries the reconciler makes
// exactly the desired ones: this sled's, in the services VPC.
func (r *Reconciler) owned(e dpd.NatEntry) bool {
	return e.Target.InternalIP == r.opts.Underlay && e.Target.VNI == ServicesVNI
}

// desired is Desired, and the zones it ignores for their NIC's VNI, as
// "zone: vni N".
func desired(running []zone.Spec, underlay netip.Addr) (out []dpd.NatEntry, ignored []string) {
	for _, s := range running {
		t := s.Config.ZoneType
		if t.NIC == nil {
			continue
		}
		mac, err := dpd.ParseMAC(t.NIC.MAC)
		if err != nil {
			continue
		}
		target := dpd.NatTarget{InternalIP: underlay, InnerMAC: mac, VNI: t.NIC.VNI}
		var ext netip.Addr
		low, high := uint16(0), uint16(65535)
		switch t.Type {
		case "nexus":
			ext, err = netip.ParseAddr(t.ExternalIP)
		case "external_dns":
			var ap netip.AddrPort
			ap, err = netip.ParseAddrPort(t.DNSAddress)
			ext = ap.Addr()
		case "boundary_ntp":
			if t.SNAT == nil {
				continue
			}
			ext, err = netip.ParseAddr(t.SNAT.IP)
			low, high = t.SNAT.FirstPort, t.SNAT.LastPort
		default:
			continue
		}
		if err != nil || !ext.IsValid() {
			continue
		}
		if t.NIC.VNI != ServicesVNI {
			ignored = append(ignored, fmt.Sprintf("%s: vni %d", s.Name, t.NIC.VNI))
			continue
		}
		out = append(out, dpd.NatEntry{External: ext.Unmap(), Low: low, High: high, Target: target})
	}
	slices.SortFunc(out, compareEntries)
	slices.Sort(ignored)
	return out, ignored
}

func compareEntries(a, b dpd.NatEntry) int {
	if c := a.External.Compare(b.External); c != 0 {
		return c
	}
	return cmp.Compare(a.Low, b.Low)
}

func describe(e dpd.NatEntry) string {
	return fmt.Sprintf("%s %d-%d → %s %s vni %d", e.External, e.Low, e.High, e.Target.InternalIP, e.Target.InnerMAC, e.Target.VNI)
}
