// Package probes makes the sled's probe zones, as upstream's probe manager
// does (omicron sled-agent/src/probe_manager.rs): Nexus tells the sled the
// whole set of probes it should run (PUT /probes, every minute), and each
// probe is a zone holding one NIC, the probe's, whose port the data path
// makes with one firewall rule, allow all inbound (internal/vpc/told). The
// zone runs nothing; its kernel answers on its address (ICMP echo, and
// what a kernel answers of UDP and TCP), so that an operator can check a
// VPC's networking without running a guest.
//
// The set replaces the one before; a probe is known by its id alone, as
// upstream's set difference goes: probes added get their zone, probes gone
// have it removed, probes still there are kept. A pass lists the zones
// that exist (Zones.List), so a zone that outlived the agent is adopted,
// not made again. A pass that fails is tried again after a capped delay;
// every probe's state and last error is in Status.
//
// Where upstream's zone takes its address from OPTE's DHCP and adds its
// routes by hand (running_zone.rs ensure_address_for_port), the zone here
// is given the same: the NIC's address alone (/32, /128), a route to its
// IPv4 gateway on the link and the default route through it.
package probes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/backoff"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// ZonePrefix starts every probe zone's name (upstream's oxz_probe_<id>).
const ZonePrefix = "oxz_probe_"

// ZoneName is the name of probe id's zone.
func ZoneName(id string) string { return ZonePrefix + strings.ToLower(id) }

// Zone is what a probe's zone is made with: its NIC.
type Zone struct {
	// ID is the probe's id, a UUID in lower case: the zone's names come
	// from it alone.
	ID  string
	MAC net.HardwareAddr
	// Addrs are the NIC's private addresses, each alone (/32, /128).
	Addrs []netip.Prefix
	// Gateway is the NIC's IPv4 gateway, the first address of its
	// subnet; invalid when it has no IPv4 address.
	Gateway netip.Addr
}

// ZoneFor is the zone of probe p.
func ZoneFor(p told.Probe) (Zone, error) {
	id, err := uuid.Parse(p.ID)
	if err != nil || len(p.ID) != 36 {
		return Zone{}, fmt.Errorf("probe id %q is not a UUID", p.ID)
	}
	z := Zone{ID: id.String()}
	if z.MAC, err = net.ParseMAC(p.Interface.MAC); err != nil || len(z.MAC) != 6 {
		return Zone{}, fmt.Errorf("probe %s: mac %q is not an Ethernet address", z.ID, p.Interface.MAC)
	}
	add := func(ip, subnet string) error {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return fmt.Errorf("probe %s: ip: %w", z.ID, err)
		}
		s, err := netip.ParsePrefix(subnet)
		if err != nil {
			return fmt.Errorf("probe %s: subnet: %w", z.ID, err)
		}
		z.Addrs = append(z.Addrs, netip.PrefixFrom(a, a.BitLen()))
		if a.Is4() {
			z.Gateway = s.Masked().Addr().Next()
		}
		return nil
	}
	v := p.Interface.IPConfig.Value
	if v.IP != "" {
		if err := add(v.IP, v.Subnet); err != nil {
			return Zone{}, err
		}
	}
	for _, s := range []*sledconfig.PrivateIP{v.V4, v.V6} {
		if s != nil {
			if err := add(s.IP, s.Subnet); err != nil {
				return Zone{}, err
			}
		}
	}
	if len(z.Addrs) == 0 {
		return Zone{}, fmt.Errorf("probe %s: its NIC has no address", z.ID)
	}
	return z, nil
}

// Zones is where probe zones are made: network namespaces of the sled
// (Namespaces, with the linux runtime).
type Zones interface {
	// List returns the ids of the probe zones of this sled that exist.
	List(ctx context.Context) ([]string, error)
	// Ensure makes z's zone exist as z says, keeping what is right of
	// it; it may be called again at any time.
	Ensure(ctx context.Context, z Zone) error
	// Remove removes probe id's zone; one that is not there is not an
	// error.
	Remove(ctx context.Context, id string) error
	// Where says where probe id's zone is: the namespace to enter and the
	// host end of its NIC, the link of the probe's port.
	Where(id string) (netns, link string)
}

// Options set a reconciler up.
type Options struct {
	Zones Zones
	Log   *slog.Logger
	// Retry is the delay after failed passes (default 1 s doubling to
	// 1 min).
	Retry backoff.Backoff
	// Resync is how often the zones are listed again when nothing asks
	// sooner (default 1 min): a zone removed from outside is made again.
	Resync time.Duration
	// CallTimeout bounds each call of Zones (default 30 s).
	CallTimeout time.Duration
}

// Reconciler keeps the probe zones those of the latest set. Set gives it
// the set; Run does the work.
type Reconciler struct {
	opts Options
	log  *slog.Logger
	kick chan struct{} // capacity 1: a pass is due

	// mu guards the fields below it; nothing is called with it held.
	mu     sync.Mutex
	want   map[string]told.Probe   // the latest set, by id
	status Status                  // but its Probes
	probes map[string]*ProbeStatus // each probe wanted or still there
}

// New returns a reconciler; Run starts it.
func New(opts Options) *Reconciler {
	if opts.Retry == (backoff.Backoff{}) {
		opts.Retry = backoff.Backoff{Initial: time.Second, Max: time.Minute}
	}
	opts.Resync = cmp.Or(opts.Resync, time.Minute)
	opts.CallTimeout = cmp.Or(opts.CallTimeout, 30*time.Second)
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{opts: opts, log: log, kick: make(chan struct{}, 1),
		want: map[string]told.Probe{}, probes: map[string]*ProbeStatus{}}
}

// Set replaces the set of probes the sled runs. It does not wait: the
// zones follow.
func (r *Reconciler) Set(probes []told.Probe) {
	want := make(map[string]told.Probe, len(probes))
	for _, p := range probes {
		want[strings.ToLower(p.ID)] = p
	}
	r.mu.Lock()
	r.want = want
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default: // a pass is due already; it reads the latest set
	}
}

// Status is the probe zones' state (GET /agent/inventory).
type Status struct {
	Probes    []ProbeStatus `json:"probes" doc:"Each probe of the set, and each probe zone still there that is no longer wanted, by id."`
	LastError string        `json:"last_error,omitempty" doc:"Why the last pass failed: listing the zones, or some probe's zone (its status says which)."`
	Failures  int           `json:"failures" doc:"Passes failed in a row."`
	NextRetry *time.Time    `json:"next_retry,omitempty" doc:"When a failed pass is tried again (at once if the set changes first)."`
	LastPass  *time.Time    `json:"last_pass,omitempty" doc:"When the last pass ended."`
}

// ProbeStatus is one probe zone's state.
type ProbeStatus struct {
	ID        string    `json:"id"`
	Zone      string    `json:"zone" doc:"The zone's name, oxz_probe_<id>."`
	Netns     string    `json:"netns,omitempty" doc:"The zone's network namespace, to enter (nsenter --net=…)."`
	Link      string    `json:"link,omitempty" doc:"The host end of the zone's NIC: the link of the probe's port in the data path."`
	Wanted    bool      `json:"wanted" doc:"In the set Nexus told the sled; false while a zone no longer wanted is removed."`
	State     string    `json:"state" enum:"making,ready,failed,removing" doc:"ready: the zone is there as the probe says; failed: making it failed (last_error says why; it is tried again)."`
	Adopted   bool      `json:"adopted,omitempty" doc:"The zone was there when the agent started (it outlived the agent): kept, not made again."`
	Since     time.Time `json:"since" doc:"When the state last changed."`
	Attempts  int       `json:"attempts" doc:"Attempts failed in a row."`
	LastError string    `json:"last_error,omitempty"`
}

// Status is the state now.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.status
	st.Probes = []ProbeStatus{}
	for _, id := range slices.Sorted(maps.Keys(r.probes)) {
		st.Probes = append(st.Probes, *r.probes[id])
	}
	return st
}

// Run keeps the zones those of the latest set until ctx ends: a pass at
// once, after every Set, every Resync, and after a failed pass when its
// delay is up. Zones are left as they are when it returns: stopping the
// agent is not removing its probes.
func (r *Reconciler) Run(ctx context.Context) error {
	failures := 0
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-t.C:
		}
		select {
		case <-r.kick: // this pass reads the latest set
		default:
		}
		err := r.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		next := r.opts.Resync
		if err != nil {
			failures++
			next = r.opts.Retry.Delay(failures)
			r.log.Warn("probe zones", "err", err, "failures", failures, "retry_in", next)
		} else {
			failures = 0
		}
		now := time.Now()
		r.mu.Lock()
		r.status.Failures, r.status.LastPass, r.status.LastError, r.status.NextRetry = failures, &now, "", nil
		if err != nil {
			at := now.Add(next)
			r.status.LastError, r.status.NextRetry = err.Error(), &at
		}
		r.mu.Unlock()
		t.Reset(next)
	}
}

// pass makes the zones of the set and removes the others, once.
func (r *Reconciler) pass(ctx context.Context) error {
	r.mu.Lock()
	want := maps.Clone(r.want)
	r.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	list, err := r.opts.Zones.List(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("listing the probe zones: %w", err)
	}
	have := map[string]bool{}
	for _, id := range list {
		have[strings.ToLower(id)] = true
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.ensure(ctx, id, want[id], have[id]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want[id]; ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.remove(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// A probe no longer wanted whose zone is not listed is gone.
	r.mu.Lock()
	for id := range r.probes {
		if _, ok := want[id]; !ok && !have[id] {
			delete(r.probes, id)
		}
	}
	r.mu.Unlock()
	return errors.Join(errs...)
}

// ensure makes probe id's zone; there says it was listed.
func (r *Reconciler) ensure(ctx context.Context, id string, p told.Probe, there bool) error {
	r.mu.Lock()
	ps, known := r.probes[id]
	if !known {
		ps = &ProbeStatus{ID: id, Zone: ZoneName(id), Adopted: there}
		r.probes[id] = ps
	}
	ps.Wanted = true
	if ps.State == "" || ps.State == "removing" || !there && ps.State == "ready" {
		// New, wanted again, or gone from outside: it is being made.
		r.setLocked(ps, "making")
	}
	r.mu.Unlock()
	z, err := ZoneFor(p)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
		err = r.opts.Zones.Ensure(cctx, z)
		cancel()
	}
	netns, link := r.opts.Zones.Where(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	ps.Netns, ps.Link = netns, link
	if err != nil {
		ps.Attempts++
		ps.LastError = err.Error()
		r.setLocked(ps, "failed")
		return fmt.Errorf("probe %s: making its zone: %w", id, err)
	}
	if ps.State != "ready" {
		r.log.Info("probe zone ready", "probe", id, "zone", ps.Zone, "link", link, "adopted", ps.Adopted)
	}
	ps.Attempts, ps.LastError = 0, ""
	r.setLocked(ps, "ready")
	return nil
}

// remove removes probe id's zone, no longer wanted.
func (r *Reconciler) remove(ctx context.Context, id string) error {
	netns, link := r.opts.Zones.Where(id)
	r.mu.Lock()
	ps, ok := r.probes[id]
	if !ok {
		ps = &ProbeStatus{ID: id, Zone: ZoneName(id), Adopted: true, Netns: netns, Link: link}
		r.probes[id] = ps
	}
	ps.Wanted = false
	r.setLocked(ps, "removing")
	r.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	err := r.opts.Zones.Remove(cctx, id)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		ps.Attempts++
		ps.LastError = "removing its zone: " + err.Error()
		return fmt.Errorf("probe %s: removing its zone: %w", id, err)
	}
	r.log.Info("probe zone removed", "probe", id, "zone", ps.Zone)
	delete(r.probes, id)
	return nil
}

func (r *Reconciler) setLocked(ps *ProbeStatus, state string) {
	if ps.State != state {
		ps.State, ps.Since = state, time.Now()
	}
}
