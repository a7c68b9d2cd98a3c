package told

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The operations, as upstream's handlers and port manager answer them.
// Each takes a body its Check accepted (the API checks it first, so a
// refusal names the member and changes nothing).

// V2P are the mappings (GET /v2p): every one told and not deleted,
// whatever the ports (OPTE's table is global to the sled).
func (s *Store) V2P() []V2P {
	return s.current().record().V2P
}

// SetV2P records a mapping, replacing the one of its (vni, virtual_ip)
// (PUT /v2p).
func (s *Store) SetV2P(ctx context.Context, m V2P) error {
	return s.update(ctx, func(st *state, _ []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		st.v2p[m.key()] = m
		return func(ctx context.Context, dp DataPath) error { return dp.SetV2P(ctx, m) }, nil
	})
}

// ClearV2P removes the mapping of (m.VNI, m.VirtualIP); its MAC and host
// are not compared, as OPTE's VpcMappings::del does not; one that is not
// there is no error (DELETE /v2p).
func (s *Store) ClearV2P(ctx context.Context, m V2P) error {
	return s.update(ctx, func(st *state, _ []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		delete(st.v2p, m.key())
		return func(ctx context.Context, dp DataPath) error { return dp.ClearV2P(ctx, m) }, nil
	})
}

// Routes are the RouterIDs the sled's ports need, each with the version
// of the set last applied (GET /vpc-routes): Nexus sends routes for these
// only.
func (s *Store) Routes() []RouteState {
	st := s.current()
	ports, _ := s.ports(st)
	needed := neededKeys(ports)
	out := []RouteState{}
	for _, k := range sortedKeys(needed) {
		rs := RouteState{ID: needed[k]}
		if set, ok := st.routes[k]; ok {
			rs.Version = set.Version
		}
		out = append(out, rs)
	}
	return out
}

// replacedBy is upstream's RouterVersion::is_replaced_by: another router,
// or a later version of the same.
func replacedBy(old, new RouterVersion) bool {
	return old.RouterID != new.RouterID || old.Version < new.Version
}

// SetRoutes applies route sets (PUT /vpc-routes) as PM::vpc_routes_ensure
// does: a set of a RouterID no port of the sled needs is ignored (with a
// warning); one whose version does not replace the applied one's is
// skipped; any other replaces the applied set, and each port needing it
// gets the entries removed and added.
func (s *Store) SetRoutes(ctx context.Context, sets []RouteSet) error {
	return s.update(ctx, func(st *state, ports []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		needed := neededKeys(ports)
		type delta struct {
			id          RouterID
			add, remove []Route
		}
		var deltas []delta
		for _, set := range sets {
			k := set.ID.key()
			if _, ok := needed[k]; !ok {
				s.log.Warn("ignoring routes of a router no port of the sled needs", "router", k)
				continue
			}
			var owner Port
			for _, p := range ports {
				if slices.ContainsFunc(p.RouterKeys(), func(r RouterID) bool { return r.key() == k }) {
					owner = p
					break
				}
			}
			old := st.routeSet(set.ID, owner)
			if _, applied := st.routes[k]; applied && old.Version != nil && set.Version != nil && !replacedBy(*old.Version, *set.Version) {
				s.log.Info("skipping routes whose version does not replace the applied one's", "router", k,
					"applied", *old.Version, "sent", *set.Version)
				continue
			}
			deltas = append(deltas, delta{id: set.ID, add: routeDiff(set.Routes, old.Routes), remove: routeDiff(old.Routes, set.Routes)})
			st.routes[k] = set
		}
		return func(ctx context.Context, dp DataPath) error {
			for _, d := range deltas {
				class := ClassSystem
				if d.id.Kind.Type == "custom" {
					class = ClassCustom
				}
				for _, ref := range s.madeRefs(ports, func(p Port) bool {
					return slices.ContainsFunc(p.RouterKeys(), func(r RouterID) bool { return r.key() == d.id.key() })
				}) {
					for _, r := range d.remove {
						if err := dp.DelRouterEntry(ctx, ref, class, r); err != nil {
							return err
						}
					}
					for _, r := range d.add {
						if err := dp.AddRouterEntry(ctx, ref, class, r); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}, nil
	})
}

// routeDiff are the routes of a not in b.
func routeDiff(a, b []Route) []Route {
	var out []Route
	for _, r := range a {
		if !slices.ContainsFunc(b, func(x Route) bool { return x.key() == r.key() }) {
			out = append(out, r)
		}
	}
	return out
}

// SetEIPGateways replaces the map (PUT /eip-gateways). If it changed,
// every instance's primary port gets its external IPs again with their
// gateways (upstream's refresh_external_ips); service and probe ports
// stay untagged.
func (s *Store) SetEIPGateways(ctx context.Context, g EIPGateways) error {
	return s.update(ctx, func(st *state, ports []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		before := fmt.Sprint(st.gateways)
		st.gateways = g.Mappings
		if fmt.Sprint(st.gateways) == before {
			return nil, nil
		}
		return func(ctx context.Context, dp DataPath) error {
			for _, p := range ports {
				if p.NIC.Kind.Type != "instance" || !p.NIC.Primary {
					continue
				}
				ref := p.Ref()
				if _, ok := s.made[ref]; !ok {
					continue
				}
				if err := dp.SetExternalIPs(ctx, ref, p.External, g.Mappings[ref.NICID]); err != nil {
					return err
				}
			}
			return nil
		}, nil
	})
}

// SetFirewallRules replaces the rules of every port in the VNI (PUT
// /vpc/{vpc_id}/firewall/rules; the VPC id is not used, as upstream does
// not use it), and remembers them (VNIRules) while a port is in the VNI.
// With no port in the VNI it does nothing, and succeeds.
func (s *Store) SetFirewallRules(ctx context.Context, b FirewallRulesBody) error {
	return s.update(ctx, func(st *state, ports []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		var covered []string
		for _, p := range ports {
			if p.NIC.VNI == b.VNI && p.NIC.Kind.Type == "instance" && !slices.Contains(covered, p.Owner) {
				covered = append(covered, p.Owner)
			}
		}
		slices.Sort(covered)
		st.firewall[b.VNI] = VNIRules{VNI: b.VNI, Rules: b.Rules, ToldAt: s.opts.Now().UTC(), Covered: covered}
		return func(ctx context.Context, dp DataPath) error {
			for _, ref := range s.madeRefs(ports, func(p Port) bool { return p.NIC.VNI == b.VNI }) {
				if err := dp.SetFirewallRules(ctx, ref, b.Rules); err != nil {
					return err
				}
			}
			return nil
		}, nil
	})
}

// vmmPort is VMM id's primary port: an unknown VMM is ErrNoSuchVMM, one
// without ports now (or without a primary NIC) ErrNoPort.
func vmmPort(id string, ports []Port, vmms map[string]VMM) (VMM, Port, error) {
	v, ok := vmms[id]
	if !ok {
		return VMM{}, Port{}, fmt.Errorf("%w: %s", ErrNoSuchVMM, id)
	}
	nic, ok := v.primary()
	if !ok {
		return VMM{}, Port{}, fmt.Errorf("VMM %s has no primary NIC: %w", id, ErrNoPort)
	}
	for _, p := range ports {
		if p.Owner == id && strings.EqualFold(p.NIC.ID, nic.ID) {
			return v, p, nil
		}
	}
	return VMM{}, Port{}, fmt.Errorf("VMM %s is not active (it is stopped, failed or destroyed): its primary NIC %s has %w", id, nic.ID, ErrNoPort)
}

// PutExternalIP attaches an external IP to VMM id's primary port (PUT
// /vmms/{id}/external-ip), as upstream's add_external_ip: the same
// ephemeral IP again is a no-op, another one ErrEphemeralAttached, a
// floating IP joins the set. On an error nothing changed.
func (s *Store) PutExternalIP(ctx context.Context, id string, b ExternalIPBody) error {
	return s.externalIP(ctx, id, func(e ExternalIPs) (ExternalIPs, error) { return e.Merge(b) })
}

// DeleteExternalIP detaches it (DELETE /vmms/{id}/external-ip); one not
// attached is no error.
func (s *Store) DeleteExternalIP(ctx context.Context, id string, b ExternalIPBody) error {
	return s.externalIP(ctx, id, func(e ExternalIPs) (ExternalIPs, error) { return e.Prune(b), nil })
}

func (s *Store) externalIP(ctx context.Context, id string, f func(ExternalIPs) (ExternalIPs, error)) error {
	return s.update(ctx, func(st *state, ports []Port, vmms map[string]VMM) (func(context.Context, DataPath) error, error) {
		_, p, err := vmmPort(id, ports, vmms)
		if err != nil {
			return nil, err
		}
		next, err := f(p.External)
		if err != nil {
			return nil, err
		}
		t := st.vmms[id]
		t.ID, t.External = id, &next
		if t.Subnets == nil {
			t.Subnets = []AttachedSubnet{}
		}
		st.vmms[id] = t
		ref := p.Ref()
		return func(ctx context.Context, dp DataPath) error {
			return dp.SetExternalIPs(ctx, ref, next, st.gateways[ref.NICID])
		}, nil
	})
}

// SetAttachedSubnets makes VMM id's attached subnets exactly these (PUT
// /vmms/{id}/attached-subnets): those no longer wanted are detached, then
// every wanted one attached (OPTE's attach replaces a mapping).
func (s *Store) SetAttachedSubnets(ctx context.Context, id string, want AttachedSubnets) error {
	return s.subnets(ctx, id, func(have []AttachedSubnet) ([]AttachedSubnet, []AttachedSubnet, []string, error) {
		var detach []string
		for _, h := range have {
			if !slices.ContainsFunc(want.Subnets, func(w AttachedSubnet) bool { return w.Subnet == h.Subnet }) {
				detach = append(detach, h.Subnet)
			}
		}
		return want.Subnets, want.Subnets, detach, nil
	})
}

// ClearAttachedSubnets detaches them all (DELETE /vmms/{id}/attached-subnets).
func (s *Store) ClearAttachedSubnets(ctx context.Context, id string) error {
	return s.subnets(ctx, id, func(have []AttachedSubnet) ([]AttachedSubnet, []AttachedSubnet, []string, error) {
		var detach []string
		for _, h := range have {
			detach = append(detach, h.Subnet)
		}
		return []AttachedSubnet{}, nil, detach, nil
	})
}

// AttachSubnet attaches one (POST /vmms/{id}/attached-subnets); one
// attached already is ErrSubnetAttached, and changes nothing.
func (s *Store) AttachSubnet(ctx context.Context, id string, a AttachedSubnet) error {
	return s.subnets(ctx, id, func(have []AttachedSubnet) ([]AttachedSubnet, []AttachedSubnet, []string, error) {
		if slices.ContainsFunc(have, func(h AttachedSubnet) bool { return h.Subnet == a.Subnet }) {
			return nil, nil, nil, fmt.Errorf("%w: %s", ErrSubnetAttached, a.Subnet)
		}
		next := append(slices.Clone(have), a)
		sortSubnets(next)
		return next, []AttachedSubnet{a}, nil, nil
	})
}

// DetachSubnet detaches one (DELETE /vmms/{id}/attached-subnets/{subnet});
// one not attached is no error.
func (s *Store) DetachSubnet(ctx context.Context, id, subnet string) error {
	p, err := parseNet("subnet", subnet)
	if err != nil {
		return err
	}
	subnet = p.String()
	return s.subnets(ctx, id, func(have []AttachedSubnet) ([]AttachedSubnet, []AttachedSubnet, []string, error) {
		i := slices.IndexFunc(have, func(h AttachedSubnet) bool { return h.Subnet == subnet })
		if i < 0 {
			return have, nil, nil, nil
		}
		return slices.Delete(slices.Clone(have), i, i+1), nil, []string{subnet}, nil
	})
}

// subnets runs a change of VMM id's attached subnets: f returns the new
// set, the subnets to attach and those to detach.
func (s *Store) subnets(ctx context.Context, id string, f func(have []AttachedSubnet) (next, attach []AttachedSubnet, detach []string, err error)) error {
	return s.update(ctx, func(st *state, ports []Port, vmms map[string]VMM) (func(context.Context, DataPath) error, error) {
		_, p, err := vmmPort(id, ports, vmms)
		if err != nil {
			return nil, err
		}
		t := st.vmms[id]
		next, attach, detach, err := f(t.Subnets)
		if err != nil {
			return nil, err
		}
		t.ID, t.Subnets = id, next
		if t.Subnets == nil {
			t.Subnets = []AttachedSubnet{}
		}
		st.vmms[id] = t
		ref := p.Ref()
		return func(ctx context.Context, dp DataPath) error {
			for _, d := range detach {
				if err := dp.DetachSubnet(ctx, ref, d); err != nil {
					return err
				}
			}
			for _, a := range attach {
				if err := dp.AttachSubnet(ctx, ref, a); err != nil {
					return err
				}
			}
			return nil
		}, nil
	})
}

// SetProbes replaces the probes (PUT /probes). Their ports are made and
// removed by the sync every operation ends with.
func (s *Store) SetProbes(ctx context.Context, set ProbeSet) error {
	return s.update(ctx, func(st *state, _ []Port, _ map[string]VMM) (func(context.Context, DataPath) error, error) {
		st.probes = map[string]Probe{}
		for _, p := range set.Probes {
			st.probes[p.ID] = p
		}
		return nil, nil
	})
}

// View is the operator's view of the record (GET /agent/vpc).
type View struct {
	Ports       []PortView                     `json:"ports" doc:"The sled's ports: each active VMM's NICs, each service zone's NIC, each probe's."`
	V2P         []V2P                          `json:"v2p"`
	Routes      []RouteSet                     `json:"routes" doc:"The route sets applied, of the RouterIDs the ports need."`
	EIPGateways map[string]map[string][]string `json:"eip_gateways"`
	Firewall    []VNIRules                     `json:"firewall" doc:"The latest firewall rules told per VNI in which the sled has a port."`
	VMMs        []VMMTold                      `json:"vmms" doc:"What each VMM was told since its registration."`
	Probes      []Probe                        `json:"probes"`
	Generation  uint64                         `json:"generation" doc:"The record's generation: one more at every change."`
	Copies      []RecordCopy                   `json:"record_copies,omitempty"`
	LoadProblem string                         `json:"load_problem,omitempty" doc:"Why the record could not be read at start (the agent then started from nothing)."`
}

// PortView is one port.
type PortView struct {
	PortRef
	Owner      string      `json:"owner" doc:"The VMM, zone or probe it is for."`
	MAC        string      `json:"mac"`
	VNI        uint32      `json:"vni"`
	Primary    bool        `json:"primary"`
	IPs        []string    `json:"ips"`
	External   ExternalIPs `json:"external_ips"`
	RouterKeys []RouterID  `json:"router_ids"`
}

// RecordCopy is one copy of the record, as the sled config's copies are
// shown.
type RecordCopy struct {
	Path       string `json:"path"`
	State      string `json:"state"`
	Generation uint64 `json:"generation,omitempty"`
	Error      string `json:"error,omitempty"`
}

// View is the record now and the ports it applies to.
func (s *Store) View() View {
	s.mu.Lock()
	st, gen, copies, problem := s.st, s.gen, slices.Clone(s.copies), s.loadProblem
	s.mu.Unlock()
	r := st.record()
	v := View{V2P: r.V2P, Routes: r.Routes, EIPGateways: r.EIPGateways, Firewall: r.Firewall, VMMs: r.VMMs, Probes: r.Probes,
		Generation: gen, LoadProblem: problem, Ports: []PortView{}}
	ports, _ := s.ports(st)
	for _, p := range ports {
		pv := PortView{PortRef: p.Ref(), Owner: p.Owner, IPs: []string{}, MAC: p.NIC.MAC, VNI: p.NIC.VNI, Primary: p.NIC.Primary, External: p.External, RouterKeys: p.RouterKeys()}
		val := p.NIC.IPConfig.Value
		for _, ip := range []string{val.IP} {
			if _, err := netip.ParseAddr(ip); err == nil {
				pv.IPs = append(pv.IPs, ip)
			}
		}
		for _, pi := range []*sledconfig.PrivateIP{val.V4, val.V6} {
			if pi != nil {
				pv.IPs = append(pv.IPs, pi.IP)
			}
		}
		v.Ports = append(v.Ports, pv)
	}
	for _, c := range copies {
		v.Copies = append(v.Copies, RecordCopy{Path: c.Path, State: string(c.State), Generation: c.Generation, Error: c.Err})
	}
	return v
}
