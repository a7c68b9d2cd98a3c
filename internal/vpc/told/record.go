package told

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// record is what the sled was told, as kept in the ledger: every member
// sorted so that the same state is the same bytes.
type record struct {
	// V2P are the mappings, by (vni, virtual_ip).
	V2P []V2P `json:"v2p"`
	// Routes are the route sets applied, by RouterID; only those of
	// RouterIDs a port of the sled needs are kept (as upstream drops a
	// set with its last port).
	Routes []RouteSet `json:"routes"`
	// EIPGateways is the last map told (PUT /eip-gateways).
	EIPGateways map[string]map[string][]string `json:"eip_gateways"`
	// Firewall are the latest rules told per VNI.
	Firewall []VNIRules `json:"firewall"`
	// VMMs are what VMMs were told since their registration.
	VMMs []VMMTold `json:"vmms"`
	// Probes are the probes the sled runs (PUT /probes).
	Probes []Probe `json:"probes"`
}

// VNIRules are the firewall rules last told for a VNI.
//
// Upstream's port manager does not remember them: it applies them to the
// ports that exist and a later port gets only what it is created with (a
// VMM's local_config.firewall_rules, none for a service zone). Remembering
// the latest per VNI is an improvement VPC.md §3.4.5 allows: a service
// port made later (a new boundary NTP zone, say) gets the services VPC's
// rules at once instead of waiting up to five minutes for Nexus's next
// push, and the agent can give them again to a data path that restarted.
// They are kept while a port of the sled is in the VNI, and apply to a
// VMM's port only if told after the VMM was registered (its registration's
// are otherwise newer).
type VNIRules struct {
	VNI    uint32         `json:"vni"`
	Rules  []FirewallRule `json:"rules"`
	ToldAt time.Time      `json:"told_at"`
	// Covered are the VMMs that had a port in the VNI when the rules were
	// told: their ports take these rules, newer than their registrations'.
	// A VMM registered later brings its own, newer still. (A VMM's
	// registration time is not kept across the agent's restarts; this is.)
	Covered []string `json:"covered,omitempty"`
}

// VMMTold is what a VMM was told after its registration.
type VMMTold struct {
	ID string `json:"propolis_id"`
	// External, if set, replaces the registration's external IPs
	// (PUT/DELETE /vmms/{id}/external-ip).
	External *ExternalIPs `json:"external_ips,omitempty"`
	// Subnets are its attached subnets (upstream ignores the
	// registration's; the runner starts with none).
	Subnets []AttachedSubnet `json:"attached_subnets"`
}

// state is the record in a form easy to change; encode sorts it.
type state struct {
	v2p      map[string]V2P
	routes   map[string]RouteSet
	gateways map[string]map[string][]string
	firewall map[uint32]VNIRules
	vmms     map[string]VMMTold
	probes   map[string]Probe
}

func newState() *state {
	return &state{v2p: map[string]V2P{}, routes: map[string]RouteSet{}, gateways: map[string]map[string][]string{},
		firewall: map[uint32]VNIRules{}, vmms: map[string]VMMTold{}, probes: map[string]Probe{}}
}

func (s *state) record() record {
	r := record{V2P: []V2P{}, Routes: []RouteSet{}, EIPGateways: s.gateways, Firewall: []VNIRules{}, VMMs: []VMMTold{}, Probes: []Probe{}}
	for _, k := range sortedKeys(s.v2p) {
		r.V2P = append(r.V2P, s.v2p[k])
	}
	for _, k := range sortedKeys(s.routes) {
		r.Routes = append(r.Routes, s.routes[k])
	}
	for _, k := range sortedKeys(s.firewall) {
		r.Firewall = append(r.Firewall, s.firewall[k])
	}
	for _, k := range sortedKeys(s.vmms) {
		r.VMMs = append(r.VMMs, s.vmms[k])
	}
	for _, k := range sortedKeys(s.probes) {
		r.Probes = append(r.Probes, s.probes[k])
	}
	return r
}

func (s *state) encode() []byte {
	b, err := json.Marshal(s.record())
	if err != nil {
		panic(err) // only types of this package, which always encode
	}
	return b
}

// decodeState reads a record.
func decodeState(b []byte) (*state, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	s := newState()
	for _, m := range r.V2P {
		s.v2p[m.key()] = m
	}
	for _, rs := range r.Routes {
		s.routes[rs.ID.key()] = rs
	}
	if r.EIPGateways != nil {
		s.gateways = r.EIPGateways
	}
	for _, f := range r.Firewall {
		s.firewall[f.VNI] = f
	}
	for _, v := range r.VMMs {
		s.vmms[v.ID] = v
	}
	for _, p := range r.Probes {
		s.probes[p.ID] = p
	}
	return s, nil
}

// clone is a deep copy.
func (s *state) clone() *state {
	c, err := decodeState(s.encode())
	if err != nil {
		panic(err)
	}
	return c
}

func sortedKeys[K interface{ ~string | ~uint32 }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func contains(l []string, s string) bool { return slices.Contains(l, s) }

func sortStrings(l []string) { slices.Sort(l) }

func sortRoutes(l []Route) {
	slices.SortFunc(l, func(a, b Route) int { return strings.Compare(a.key(), b.key()) })
}

func sortSubnets(l []AttachedSubnet) {
	slices.SortFunc(l, func(a, b AttachedSubnet) int { return strings.Compare(a.Subnet, b.Subnet) })
}
