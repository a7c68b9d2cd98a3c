package rules

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/google/uuid"
)

// RouterID is upstream RouterId: a VPC's system router ({vni, system}) or
// the custom router of one of its subnets ({vni, custom(subnet)}). Subnet
// is invalid (the zero Prefix) for the system router. It is comparable,
// so it keys maps.
type RouterID struct {
	VNI    uint32
	Subnet netip.Prefix
}

// SystemRouter returns the id of a VPC's system router.
func SystemRouter(vni uint32) RouterID { return RouterID{VNI: vni} }

// CustomRouter returns the id of a subnet's custom router.
func CustomRouter(vni uint32, subnet netip.Prefix) RouterID {
	return RouterID{VNI: vni, Subnet: subnet}
}

// IsSystem says whether the id names a system router.
func (id RouterID) IsSystem() bool { return !id.Subnet.IsValid() }

// Class is the router class of the id's entries on a port.
func (id RouterID) Class() Class {
	if id.IsSystem() {
		return System
	}
	return Custom
}

func (id RouterID) String() string {
	if id.IsSystem() {
		return fmt.Sprintf("vni %d system", id.VNI)
	}
	return fmt.Sprintf("vni %d custom %s", id.VNI, id.Subnet)
}

type routerKindJSON struct {
	Type   string `json:"type"`
	Subnet string `json:"subnet,omitempty"`
}

type routerIDJSON struct {
	VNI  VNI            `json:"vni"`
	Kind routerKindJSON `json:"kind"`
}

func (id RouterID) MarshalJSON() ([]byte, error) {
	j := routerIDJSON{VNI: VNI(id.VNI), Kind: routerKindJSON{Type: "system"}}
	if !id.IsSystem() {
		j.Kind = routerKindJSON{Type: "custom", Subnet: id.Subnet.String()}
	}
	return json.Marshal(j)
}

func (id *RouterID) UnmarshalJSON(b []byte) error {
	var j struct {
		VNI  VNI             `json:"vni"`
		Kind json.RawMessage `json:"kind"`
	}
	if err := decodeStrict(b, &j, "id", "vni", "kind"); err != nil {
		return err
	}
	t, m, err := tagOf(j.Kind, "id.kind")
	if err != nil {
		return err
	}
	switch t {
	case "system":
		*id = SystemRouter(uint32(j.VNI))
	case "custom":
		if isNull(m["subnet"]) {
			return invalid("id.kind.subnet", "", "required")
		}
		p, err := parsePrefix("id.kind.subnet", m["subnet"])
		if err != nil {
			return err
		}
		*id = CustomRouter(uint32(j.VNI), p)
	default:
		return invalid("id.kind.type", t, "not system or custom")
	}
	return nil
}

// RouterVersion is upstream RouterVersion: the router a set was resolved
// from, and its version.
type RouterVersion struct {
	RouterID uuid.UUID `json:"router_id"`
	Version  uint64    `json:"version"`
}

func (v *RouterVersion) UnmarshalJSON(b []byte) error {
	type plain RouterVersion
	var p plain
	if err := decodeStrict(b, &p, "version", "router_id", "version"); err != nil {
		return err
	}
	*v = RouterVersion(p)
	return nil
}

// IsReplacedBy says whether a set at version o replaces one at v: a
// different router, or a higher version of the same one
// (omicron common/src/api/internal/shared/mod.rs:206-208).
func (v RouterVersion) IsReplacedBy(o RouterVersion) bool {
	return v.RouterID != o.RouterID || v.Version < o.Version
}

// TargetKind is the kind of a route's target.
type TargetKind uint8

const (
	// TargetDrop: the packet is dropped.
	TargetDrop TargetKind = iota + 1
	// TargetIP: the packet goes to the instance that owns IP (the
	// overlay resolves IP, not the packet's destination).
	TargetIP
	// TargetVPCSubnet: the packet is delivered inside the VPC.
	TargetVPCSubnet
	// TargetInternetGateway: the packet leaves through an internet
	// gateway, the system one or an instance's (IGW).
	TargetInternetGateway
)

// Target is upstream RouterTarget. It is comparable.
type Target struct {
	Kind   TargetKind
	IP     netip.Addr   // TargetIP
	Subnet netip.Prefix // TargetVPCSubnet
	// IGWInstance says the gateway is an instance VPC's gateway IGW;
	// false is the system gateway ({"type":"system"}).
	IGWInstance bool
	IGW         uuid.UUID
}

// DropTarget, IPTarget, SubnetTarget, SystemIGW and InstanceIGW build targets.
func DropTarget() Target                 { return Target{Kind: TargetDrop} }
func IPTarget(ip netip.Addr) Target      { return Target{Kind: TargetIP, IP: ip} }
func SubnetTarget(p netip.Prefix) Target { return Target{Kind: TargetVPCSubnet, Subnet: p} }
func SystemIGW() Target                  { return Target{Kind: TargetInternetGateway} }
func InstanceIGW(id uuid.UUID) Target {
	return Target{Kind: TargetInternetGateway, IGWInstance: true, IGW: id}
}

func (t Target) String() string {
	switch t.Kind {
	case TargetDrop:
		return "drop"
	case TargetIP:
		return "ip " + t.IP.String()
	case TargetVPCSubnet:
		return "vpc_subnet " + t.Subnet.String()
	case TargetInternetGateway:
		if t.IGWInstance {
			return "internet_gateway " + t.IGW.String()
		}
		return "internet_gateway system"
	}
	return fmt.Sprintf("target kind %d", t.Kind)
}

func (t Target) MarshalJSON() ([]byte, error) {
	switch t.Kind {
	case TargetDrop:
		return []byte(`{"type":"drop"}`), nil
	case TargetIP:
		return json.Marshal(map[string]any{"type": "ip", "value": t.IP.String()})
	case TargetVPCSubnet:
		return json.Marshal(map[string]any{"type": "vpc_subnet", "value": t.Subnet.String()})
	case TargetInternetGateway:
		v := map[string]any{"type": "system"}
		if t.IGWInstance {
			v = map[string]any{"type": "instance", "value": t.IGW.String()}
		}
		return json.Marshal(map[string]any{"type": "internet_gateway", "value": v})
	}
	return nil, fmt.Errorf("router target of unknown kind %d", t.Kind)
}

func (t *Target) UnmarshalJSON(b []byte) error {
	typ, m, err := tagOf(b, "target")
	if err != nil {
		return err
	}
	switch typ {
	case "drop":
	case "ip", "vpc_subnet", "internet_gateway":
		if isNull(m["value"]) {
			return invalid("target.value", "", "required")
		}
	default:
		return invalid("target.type", typ, "not drop, ip, vpc_subnet or internet_gateway")
	}
	switch typ {
	case "drop":
		*t = DropTarget()
	case "ip":
		var s string
		if err := json.Unmarshal(m["value"], &s); err != nil {
			return invalid("target.value", string(m["value"]), "not a string")
		}
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return invalid("target.value", s, "not an IP address")
		}
		*t = IPTarget(ip)
	case "vpc_subnet":
		p, err := parsePrefix("target.value", m["value"])
		if err != nil {
			return err
		}
		*t = SubnetTarget(p)
	case "internet_gateway":
		gt, gm, err := tagOf(m["value"], "target.value")
		if err != nil {
			return err
		}
		switch gt {
		case "system":
			*t = SystemIGW()
		case "instance":
			var s string
			if err := json.Unmarshal(gm["value"], &s); err != nil {
				return invalid("target.value.value", string(gm["value"]), "not a UUID")
			}
			id, err := uuid.Parse(s)
			if err != nil {
				return invalid("target.value.value", s, "not a UUID")
			}
			*t = InstanceIGW(id)
		default:
			return invalid("target.value.type", gt, "not system or instance")
		}
	}
	return nil
}

// Route is upstream ResolvedVpcRoute. It is comparable: a route set is a
// set of them, as upstream's HashSet.
type Route struct {
	Dest   netip.Prefix `json:"dest"`
	Target Target       `json:"target"`
}

func (r Route) String() string { return r.Dest.String() + " -> " + r.Target.String() }

func (r *Route) UnmarshalJSON(b []byte) error {
	var j struct {
		Dest   json.RawMessage `json:"dest"`
		Target Target          `json:"target"`
	}
	if err := decodeStrict(b, &j, "route", "dest", "target"); err != nil {
		return err
	}
	p, err := parsePrefix("route.dest", j.Dest)
	if err != nil {
		return err
	}
	*r = Route{Dest: p, Target: j.Target}
	return nil
}

// RouteSet is upstream ResolvedVpcRouteSet, one element of PUT /vpc-routes.
type RouteSet struct {
	ID      RouterID       `json:"id"`
	Version *RouterVersion `json:"version"`
	Routes  []Route        `json:"routes"`
}

// MarshalJSON writes upstream's shape: routes is a list even when nil.
func (s RouteSet) MarshalJSON() ([]byte, error) {
	type plain RouteSet
	if s.Routes == nil {
		s.Routes = []Route{}
	}
	return json.Marshal(plain(s))
}

func (s *RouteSet) UnmarshalJSON(b []byte) error {
	type plain RouteSet
	var p plain
	if err := decodeStrict(b, &p, "route set", "id", "routes"); err != nil {
		return err
	}
	*s = RouteSet(p)
	return nil
}

// RouteState is upstream ResolvedVpcRouteState, one element of
// GET /vpc-routes.
type RouteState struct {
	ID      RouterID       `json:"id"`
	Version *RouterVersion `json:"version"`
}
