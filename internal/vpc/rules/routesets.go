package rules

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
)

// RouterKeys returns the router ids a port needs: its VPC's system router,
// and the custom router of each subnet it has (IPv4, then IPv6; an invalid
// prefix means the port has no subnet of that family)
// (omicron illumos-utils/src/opte/port.rs:144-162). Nexus pushes routes
// only for the ids a sled lists.
func RouterKeys(vni uint32, v4, v6 netip.Prefix) []RouterID {
	ids := []RouterID{SystemRouter(vni)}
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			ids = append(ids, CustomRouter(vni, p))
		}
	}
	return ids
}

// InitialRoutes returns the routes a route set starts with when a new port
// is the first to need its id: none for an instance's port (so a new guest
// sends nothing until Nexus pushes routes), and 0.0.0.0/0 and ::/0 to the
// system internet gateway for a service's, so boundary NTP reaches out
// before Nexus runs (omicron illumos-utils/src/opte/port_manager.rs:478-510).
// Upstream gives every new id of a service port these routes, custom ones
// included.
func InitialRoutes(service bool) []Route {
	if !service {
		return nil
	}
	return []Route{
		{Dest: netip.MustParsePrefix("0.0.0.0/0"), Target: SystemIGW()},
		{Dest: netip.MustParsePrefix("::/0"), Target: SystemIGW()},
	}
}

// RouteSets is the sled's record of route sets by router id, as upstream's
// port manager keeps it: an id is present while a port needs it, holds the
// version Nexus last had applied, and a new set replaces it whole. It is
// not safe for concurrent use: the owner holds its lock, as the port
// manager does, across Ensure and applying the deltas to ports.
type RouteSets struct {
	sets map[RouterID]*routeSet
}

type routeSet struct {
	version *RouterVersion
	routes  map[Route]struct{}
	ports   int
}

// NewRouteSets returns an empty record.
func NewRouteSets() *RouteSets { return &RouteSets{sets: map[RouterID]*routeSet{}} }

// KeyRoutes are the routes of one router id, for a port's table in the
// id's class.
type KeyRoutes struct {
	ID     RouterID
	Routes []Route
}

// AddPort records that a new port needs ids (RouterKeys) and returns the
// routes its table starts with, per id: the id's current set, or
// InitialRoutes(service) for an id no port needed before
// (omicron illumos-utils/src/opte/port_manager.rs:519-557).
func (s *RouteSets) AddPort(ids []RouterID, service bool) []KeyRoutes {
	out := make([]KeyRoutes, 0, len(ids))
	for _, id := range ids {
		set := s.sets[id]
		if set == nil {
			set = &routeSet{routes: map[Route]struct{}{}}
			for _, r := range InitialRoutes(service) {
				set.routes[r] = struct{}{}
			}
			s.sets[id] = set
		}
		set.ports++
		out = append(out, KeyRoutes{ID: id, Routes: sortedRoutes(set.routes)})
	}
	return out
}

// RemovePort records that a port is gone; an id no port needs any more is
// forgotten, version and all (omicron illumos-utils/src/opte/port_manager.rs:1180-1207).
func (s *RouteSets) RemovePort(ids []RouterID) {
	for _, id := range ids {
		set := s.sets[id]
		if set == nil {
			continue
		}
		if set.ports--; set.ports <= 0 {
			delete(s.sets, id)
		}
	}
}

// List returns every id with its version, sorted: GET /vpc-routes.
func (s *RouteSets) List() []RouteState {
	out := make([]RouteState, 0, len(s.sets))
	for id, set := range s.sets {
		st := RouteState{ID: id}
		if set.version != nil {
			v := *set.version
			st.Version = &v
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b RouteState) int { return compareIDs(a.ID, b.ID) })
	return out
}

// Routes returns an id's current routes and version; ok is false when no
// port needs the id.
func (s *RouteSets) Routes(id RouterID) (routes []Route, version *RouterVersion, ok bool) {
	set := s.sets[id]
	if set == nil {
		return nil, nil, false
	}
	if set.version != nil {
		v := *set.version
		version = &v
	}
	return sortedRoutes(set.routes), version, true
}

// Delta is the change to one id's routes that every port needing it must
// apply to its table, in the id's class: Del removed, then Add added.
type Delta struct {
	ID       RouterID
	Add, Del []Route
}

// EnsureResult is what Ensure did.
type EnsureResult struct {
	// Deltas, one per id whose routes changed, sorted by id.
	Deltas []Delta
	// Ignored are ids no port on the sled needs (upstream logs a warning).
	Ignored []RouterID
	// Skipped are sets the version gate held back: the recorded version
	// is not replaced by the one sent.
	Skipped []RouterID
}

// Ensure applies PUT /vpc-routes as upstream's vpc_routes_ensure does
// (omicron illumos-utils/src/opte/port_manager.rs:576-624): a set for an
// id no port needs is ignored; when both the recorded and the new set have
// a version and the recorded one is not replaced by the new one (same
// router and a version not higher), the set is skipped; otherwise the new
// set replaces the recorded one whole, version included, even when the
// new one has none. The deltas are computed against the routes before the
// call, so an id sent twice yields one delta to its final routes (upstream
// would keep only the second delta, computed against the first).
func (s *RouteSets) Ensure(sets []RouteSet) EnsureResult {
	var res EnsureResult
	before := map[RouterID]map[Route]struct{}{}
	for _, n := range sets {
		old := s.sets[n.ID]
		if old == nil {
			res.Ignored = append(res.Ignored, n.ID)
			continue
		}
		if old.version != nil && n.Version != nil && !old.version.IsReplacedBy(*n.Version) {
			res.Skipped = append(res.Skipped, n.ID)
			continue
		}
		if _, seen := before[n.ID]; !seen {
			before[n.ID] = old.routes
		}
		routes := make(map[Route]struct{}, len(n.Routes))
		for _, r := range n.Routes {
			routes[r] = struct{}{}
		}
		var version *RouterVersion
		if n.Version != nil {
			v := *n.Version
			version = &v
		}
		s.sets[n.ID] = &routeSet{version: version, routes: routes, ports: old.ports}
	}
	for _, id := range slices.SortedFunc(maps.Keys(before), compareIDs) {
		old, cur := before[id], s.sets[id].routes
		d := Delta{ID: id}
		for r := range cur {
			if _, ok := old[r]; !ok {
				d.Add = append(d.Add, r)
			}
		}
		for r := range old {
			if _, ok := cur[r]; !ok {
				d.Del = append(d.Del, r)
			}
		}
		if len(d.Add) == 0 && len(d.Del) == 0 {
			continue
		}
		slices.SortFunc(d.Add, compareRoutes)
		slices.SortFunc(d.Del, compareRoutes)
		res.Deltas = append(res.Deltas, d)
	}
	return res
}

func sortedRoutes(m map[Route]struct{}) []Route {
	return slices.SortedFunc(maps.Keys(m), compareRoutes)
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

func compareIDs(a, b RouterID) int {
	if c := cmp.Compare(a.VNI, b.VNI); c != 0 {
		return c
	}
	if a.IsSystem() != b.IsSystem() {
		if a.IsSystem() {
			return -1
		}
		return 1
	}
	return comparePrefixes(a.Subnet, b.Subnet)
}

func compareRoutes(a, b Route) int {
	if c := comparePrefixes(a.Dest, b.Dest); c != 0 {
		return c
	}
	ta, tb := a.Target, b.Target
	if c := cmp.Compare(ta.Kind, tb.Kind); c != 0 {
		return c
	}
	if c := ta.IP.Compare(tb.IP); c != 0 {
		return c
	}
	if c := comparePrefixes(ta.Subnet, tb.Subnet); c != 0 {
		return c
	}
	if ta.IGWInstance != tb.IGWInstance {
		if !ta.IGWInstance {
			return -1
		}
		return 1
	}
	return slices.Compare(ta.IGW[:], tb.IGW[:])
}
