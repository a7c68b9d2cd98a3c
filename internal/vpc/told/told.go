// Package told is the sled's durable record of what Nexus told it about
// guest networking, and upstream's operations on it (GET/PUT/DELETE /v2p,
// GET/PUT /vpc-routes, PUT /eip-gateways, PUT /vpc/{id}/firewall/rules,
// the external IPs and attached subnets of a VMM, PUT /probes) with the
// answers and idempotency of upstream's port manager (omicron
// illumos-utils/src/opte/port_manager.rs). What the record holds is given
// to a data path (DataPath, the consumer of this package's decisions)
// after it is durably written; a restarted agent reads it back and gives
// the data path again what Nexus would not send again.
package told

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/ledger"
)

// RecordFile is the record's name in each of its directories.
const RecordFile = "vpc-told.json"

// Errors for decisions; the API maps them to upstream's answers.
var (
	// ErrNoSuchVMM: the sled has no such VMM (404 NO_SUCH_INSTANCE).
	ErrNoSuchVMM = errors.New("no such VMM")
	// ErrSubnetAttached: POST of a subnet already attached (409
	// SUBNET_ALREADY_ATTACHED, which Nexus takes as success).
	ErrSubnetAttached = errors.New("the IP subnet is already attached")
	// ErrEphemeralAttached: another ephemeral IP is attached (upstream's
	// ImplicitEphemeralIpDetach, a 500).
	ErrEphemeralAttached = errors.New("another ephemeral IP is attached")
	// ErrNoPort: the VMM has no port now (upstream's missing port, a 500).
	ErrNoPort = errors.New("no port")
	// ErrUnavailable: the record could not be written; nothing changed.
	ErrUnavailable = errors.New("the record of what the sled was told could not be written")
	// ErrDataPath: the record was written but the data path refused or
	// failed (a 500, as upstream's OPTE errors).
	ErrDataPath = errors.New("data path")
)

// RouterClass is OPTE's: a system router's entries or a custom one's.
type RouterClass string

const (
	ClassSystem RouterClass = "system"
	ClassCustom RouterClass = "custom"
)

// DataPath realises what the sled was told; its methods are OPTE's
// commands (opte-ioctl), each idempotent. Every call is made after the
// record holding its cause is durably written, one at a time.
type DataPath interface {
	// CreatePort makes a port with everything it needs (xde create, then
	// external IPs, firewall rules, router entries, attached subnets).
	CreatePort(ctx context.Context, p PortConfig) error
	DeletePort(ctx context.Context, port PortRef) error
	SetV2P(ctx context.Context, m V2P) error
	// ClearV2P removes the mapping of (m.VNI, m.VirtualIP).
	ClearV2P(ctx context.Context, m V2P) error
	// SetFirewallRules replaces a port's rules with its VNI's (a data path
	// keeps those whose targets are none or include the port, as OPTE's
	// opte_firewall_rules does).
	SetFirewallRules(ctx context.Context, port PortRef, rules []FirewallRule) error
	AddRouterEntry(ctx context.Context, port PortRef, class RouterClass, r Route) error
	DelRouterEntry(ctx context.Context, port PortRef, class RouterClass, r Route) error
	// SetExternalIPs replaces a port's external IPs; gateways are the
	// internet gateways of each (PUT /eip-gateways, instances only).
	SetExternalIPs(ctx context.Context, port PortRef, ips ExternalIPs, gateways map[string][]string) error
	AttachSubnet(ctx context.Context, port PortRef, s AttachedSubnet) error
	DetachSubnet(ctx context.Context, port PortRef, subnet string) error
}

// PortConfig is what a port is made with.
type PortConfig struct {
	Port     Port
	Gateways map[string][]string
	Rules    []FirewallRule
	// System and Custom are its router entries by class.
	System, Custom []Route
	Subnets        []AttachedSubnet
}

// Sled is what the store reads of the sled's VMMs and zones (the agent).
type Sled interface {
	// VMMs are the registered VMMs the agent holds a record of.
	VMMs() []VMM
	// ServicePorts are the ports of the sled config's zones.
	ServicePorts() []Port
}

// Options set a store up.
type Options struct {
	// Dirs each keep a copy of the record (internal/ledger); none keeps
	// nothing (tests).
	Dirs []string
	Sled Sled
	// DataPath, if set, is given what the sled is told.
	DataPath DataPath
	Log      *slog.Logger
	// Now is the clock (time.Now).
	Now func() time.Time
	// CallTimeout bounds the data path's calls of one operation or sync
	// (DefaultCallTimeout), whatever the caller's deadline.
	CallTimeout time.Duration
}

// DefaultCallTimeout bounds the data path's calls of one operation.
const DefaultCallTimeout = 10 * time.Second

// Store is the record and its operations. Changes are made one at a time
// (op, a semaphore taken with the request's deadline, held across the
// ledger write and the data path's calls so that they happen in the order
// the record changed); readers take only mu, to copy the published state.
type Store struct {
	opts Options
	led  *ledger.Ledger
	log  *slog.Logger
	op   chan struct{}

	mu sync.Mutex
	// st is the state last written (or read at start); replaced, never
	// changed in place.
	st *state
	// gen is the record's generation; copies its copies' status.
	gen    uint64
	last   ledger.Record
	copies []ledger.CopyStatus
	// loadProblem says why the record could not be read at start.
	loadProblem string

	// made are the ports given to the data path, by port, with the
	// configuration they were made for; replayed says the mappings were
	// given to it since start. Guarded by op.
	made     map[PortRef]string
	replayed bool
}

// Open reads the record (none: nothing told yet). A record that cannot be
// read is reported (View's load_problem) and the store starts empty: Nexus
// sends v2p mappings and routes again within a minute.
func Open(opts Options) (*Store, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	s := &Store{opts: opts, log: opts.Log, op: make(chan struct{}, 1), st: newState(), made: map[PortRef]string{}}
	if len(opts.Dirs) == 0 {
		return s, nil
	}
	led, err := ledger.Open(opts.Dirs, RecordFile, opts.Log)
	if err != nil {
		return nil, err
	}
	s.led = led
	rec, copies, err := led.Read()
	s.copies = copies
	switch {
	case errors.Is(err, ledger.ErrNotFound):
	case err != nil:
		s.loadProblem = err.Error()
		s.log.Error("the record of what the sled was told is unreadable; starting from nothing", "err", err)
	default:
		st, derr := decodeState(rec.Data)
		if derr != nil {
			s.loadProblem = fmt.Sprintf("record generation %d: %v", rec.Generation, derr)
			s.log.Error("the record of what the sled was told does not decode; starting from nothing", "err", derr)
			s.gen = rec.Generation
			break
		}
		s.st, s.gen, s.last = st, rec.Generation, rec
	}
	return s, nil
}

// current is the published state; not to be changed.
func (s *Store) current() *state {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// ports are the sled's ports now, given state st, by port; vmms the
// registered VMMs by id.
func (s *Store) ports(st *state) (ports []Port, vmms map[string]VMM) {
	vmms = map[string]VMM{}
	if s.opts.Sled != nil {
		for _, v := range s.opts.Sled.VMMs() {
			vmms[v.ID] = v
			if !v.Active {
				continue
			}
			for _, n := range v.NICs {
				p := Port{NIC: n, Owner: v.ID, Rules: v.Rules, Since: v.Registered, DHCP: v.DHCP}
				if n.Primary {
					p.External = v.External
					if t, ok := st.vmms[v.ID]; ok && t.External != nil {
						p.External = *t.External
					}
				}
				ports = append(ports, p)
			}
		}
		ports = append(ports, s.opts.Sled.ServicePorts()...)
	}
	for _, id := range sortedKeys(st.probes) {
		ports = append(ports, probePort(st.probes[id]))
	}
	return ports, vmms
}

// neededKeys are the RouterIDs the ports need, by key.
func neededKeys(ports []Port) map[string]RouterID {
	out := map[string]RouterID{}
	for _, p := range ports {
		for _, k := range p.RouterKeys() {
			out[k.key()] = k
		}
	}
	return out
}

// lock takes op, or gives up with ctx.
func (s *Store) lock(ctx context.Context) error {
	select {
	case s.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for an earlier change of what the sled was told: %w", ctx.Err())
	}
}

func (s *Store) unlock() { <-s.op }

// change is one operation: it changes st (a copy of the current state),
// given the ports and VMMs now, and returns what the data path is to be
// told once the change is written.
type change func(st *state, ports []Port, vmms map[string]VMM) (apply func(ctx context.Context, dp DataPath) error, err error)

// update runs one operation: the change, dropping what no port needs any
// more, the record written if it changed, the state published, then the
// data path told.
func (s *Store) update(ctx context.Context, c change) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	st := s.current().clone()
	ports, vmms := s.ports(st)
	apply, err := c(st, ports, vmms)
	if err != nil {
		return err
	}
	ports, _ = s.ports(st) // probes may have changed
	s.prune(st, ports, vmms)
	if err := s.write(st); err != nil {
		return err
	}
	dp := s.opts.DataPath
	if dp == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	s.syncLocked(ctx, dp, st, ports)
	if apply == nil {
		return nil
	}
	if err := apply(ctx, dp); err != nil {
		return fmt.Errorf("%w: %w", ErrDataPath, err)
	}
	return nil
}

// prune drops what nothing needs: route sets of RouterIDs no port needs,
// rules of VNIs no port is in, what was told to VMMs no longer registered.
func (s *Store) prune(st *state, ports []Port, vmms map[string]VMM) {
	needed := neededKeys(ports)
	for k := range st.routes {
		if _, ok := needed[k]; !ok {
			delete(st.routes, k)
		}
	}
	vnis := map[uint32]bool{}
	for _, p := range ports {
		vnis[p.NIC.VNI] = true
	}
	for v := range st.firewall {
		if !vnis[v] {
			delete(st.firewall, v)
		}
	}
	for id := range st.vmms {
		if _, ok := vmms[id]; !ok {
			delete(st.vmms, id)
		}
	}
}

// write commits st as the record's next generation, unless it is what the
// record holds, and publishes it.
func (s *Store) write(st *state) error {
	data := st.encode()
	s.mu.Lock()
	same := string(data) == string(s.st.encode())
	gen := s.gen
	s.mu.Unlock()
	if same {
		return nil
	}
	lr := ledger.Record{Generation: gen + 1, Data: data, Checked: true}
	var copies []ledger.CopyStatus
	if s.led != nil {
		var err error
		if copies, err = s.led.Commit(lr); err != nil {
			s.log.Error("writing the record of what the sled was told", "err", err)
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	s.mu.Lock()
	s.st, s.gen, s.last, s.copies = st, lr.Generation, lr, copies
	s.mu.Unlock()
	return nil
}

// DataPathRestarted says the data path lost what it was given (it was
// restarted): the next Sync gives it every mapping and every port again.
func (s *Store) DataPathRestarted(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	clear(s.made)
	s.replayed = false
	return nil
}

// Sync makes the data path's ports the sled's: a port made for each new
// one with all it was told, a port deleted for each gone; after a start,
// every v2p mapping is given again first (Nexus re-sends those only when
// it finds them missing). Whoever gives the store a data path calls it
// when the VMMs or the sled config change; every operation calls it
// before it acts.
func (s *Store) Sync(ctx context.Context) error {
	dp := s.opts.DataPath
	if dp == nil {
		return nil
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	st := s.current()
	ports, _ := s.ports(st)
	ctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	return s.syncLocked(ctx, dp, st, ports)
}

// syncLocked is Sync with op held. Its failures are logged, and returned
// for Sync: an operation goes on with the ports that exist.
func (s *Store) syncLocked(ctx context.Context, dp DataPath, st *state, ports []Port) error {
	var errs []error
	if !s.replayed {
		ok := true
		for _, k := range sortedKeys(st.v2p) {
			if err := dp.SetV2P(ctx, st.v2p[k]); err != nil {
				errs, ok = append(errs, err), false
			}
		}
		s.replayed = ok
	}
	want := map[PortRef]Port{}
	for _, p := range ports {
		want[p.Ref()] = p
	}
	for _, ref := range slices.SortedFunc(mapKeys(s.made), comparePorts) {
		if p, ok := want[ref]; ok && signature(p) == s.made[ref] {
			continue
		}
		if err := dp.DeletePort(ctx, ref); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(s.made, ref)
	}
	for _, ref := range slices.SortedFunc(mapKeys(want), comparePorts) {
		if _, ok := s.made[ref]; ok {
			continue
		}
		p := want[ref]
		if err := dp.CreatePort(ctx, s.portConfig(st, p)); err != nil {
			errs = append(errs, err)
			continue
		}
		s.made[ref] = signature(p)
	}
	err := errors.Join(errs...)
	if err != nil {
		s.log.Error("giving the data path the sled's ports", "err", err)
	}
	return err
}

// signature is what a port was made for: a port whose NIC changes is made
// again (its external IPs are set in place).
func signature(p Port) string {
	return fmt.Sprintf("%s %+v", p.Owner, p.NIC)
}

func comparePorts(a, b PortRef) int { return strings.Compare(a.String(), b.String()) }

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// portConfig is everything port p is made with, given st.
func (s *Store) portConfig(st *state, p Port) PortConfig {
	c := PortConfig{Port: p, Rules: p.Rules}
	// A probe's port is made with upstream's one rule, whatever its VNI
	// was told; the VNI's next rules replace it, as upstream's do.
	if r, ok := st.firewall[p.NIC.VNI]; ok && p.NIC.Kind.Type != "probe" && (!r.ToldAt.Before(p.Since) || slices.Contains(r.Covered, p.Owner)) {
		c.Rules = r.Rules
	}
	if p.NIC.Kind.Type == "instance" && p.NIC.Primary {
		c.Gateways = st.gateways[strings.ToLower(p.NIC.ID)]
		if t, ok := st.vmms[p.Owner]; ok {
			c.Subnets = t.Subnets
		}
	}
	for _, k := range p.RouterKeys() {
		routes := st.routeSet(k, p).Routes
		if k.Kind.Type == "system" {
			c.System = append(c.System, routes...)
		} else {
			c.Custom = append(c.Custom, routes...)
		}
	}
	return c
}

// routeSet is the set of RouterID k: what was applied, else what a port
// starts with (PM create_port): none for an instance or probe, the
// services' default ({0/0, ::/0} → the system internet gateway) for a
// service port.
func (st *state) routeSet(k RouterID, p Port) RouteSet {
	if rs, ok := st.routes[k.key()]; ok {
		return rs
	}
	rs := RouteSet{ID: k, Routes: []Route{}}
	if p.NIC.Kind.Type == "service" {
		igw := RouterTarget{Type: "internet_gateway", Gateway: &Gateway{Type: "system"}}
		rs.Routes = []Route{{Dest: "0.0.0.0/0", Target: igw}, {Dest: "::/0", Target: igw}}
	}
	return rs
}

// madeRefs are the ports given to the data path among ports, by ref.
func (s *Store) madeRefs(ports []Port, keep func(Port) bool) []PortRef {
	var out []PortRef
	for _, p := range ports {
		if _, ok := s.made[p.Ref()]; ok && keep(p) {
			out = append(out, p.Ref())
		}
	}
	slices.SortFunc(out, comparePorts)
	return out
}
