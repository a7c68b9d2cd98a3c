package told

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The wire shapes of upstream's sled-agent API 48.0.0 that Nexus sends for
// guest networking (VPC.md §1.1), as this package keeps them. Every one is
// checked by its Check method before anything is recorded; a problem is an
// error wrapping ErrInvalid that names the member.

// MaxVNI is the largest Geneve VNI (24 bits).
const MaxVNI = 1<<24 - 1

// ServiceVNI is the VNI of the services VPC (upstream's Vni::SERVICES_VNI).
const ServiceVNI = 100

// NIC is upstream's NetworkInterface.
type NIC = sledconfig.NIC

// V2P is upstream's VirtualNetworkInterfaceHost: where a VPC address lives.
type V2P struct {
	VirtualIP      string `json:"virtual_ip" doc:"The VPC-private address."`
	VirtualMAC     string `json:"virtual_mac" doc:"Its NIC's MAC."`
	PhysicalHostIP string `json:"physical_host_ip" doc:"The underlay address of the sled that has it."`
	VNI            uint32 `json:"vni"`
}

// RouterID is upstream's: a VPC's system router ({vni, system}) or the
// custom router of one of its subnets ({vni, custom(subnet)}).
type RouterID struct {
	VNI  uint32     `json:"vni"`
	Kind RouterKind `json:"kind"`
}

// RouterKind is upstream's: {"type":"system"} or {"type":"custom","subnet":…}.
type RouterKind struct {
	Type   string `json:"type" enum:"system,custom"`
	Subnet string `json:"subnet,omitempty" doc:"The subnet of a custom router."`
}

// RouterVersion is upstream's: the router a set was resolved from, and its
// version.
type RouterVersion struct {
	RouterID string `json:"router_id" format:"uuid"`
	Version  uint64 `json:"version"`
}

// RouteState is upstream's ResolvedVpcRouteState.
type RouteState struct {
	ID      RouterID       `json:"id"`
	Version *RouterVersion `json:"version" null:"true" doc:"The version of the set last applied; null when none was."`
}

// RouteSet is upstream's ResolvedVpcRouteSet: every route of one RouterID.
type RouteSet struct {
	ID      RouterID       `json:"id"`
	Version *RouterVersion `json:"version,omitempty" null:"true"`
	Routes  []Route        `json:"routes"`
}

// Route is upstream's ResolvedVpcRoute.
type Route struct {
	Dest   string       `json:"dest" doc:"An IP network."`
	Target RouterTarget `json:"target"`
}

// RouterTarget is upstream's: {"type":"drop"}, {"type":"ip","value":ip},
// {"type":"vpc_subnet","value":net} or {"type":"internet_gateway","value":
// {"type":"system"} | {"type":"instance","value":uuid}}.
type RouterTarget struct {
	Type string
	// Value is the ip or vpc_subnet's network.
	Value string
	// Gateway is internet_gateway's.
	Gateway *Gateway
}

// Gateway is upstream's InternetGatewayRouterTarget.
type Gateway struct {
	Type string `json:"type" enum:"system,instance"`
	ID   string `json:"value,omitempty" format:"uuid"`
}

// MarshalJSON writes upstream's adjacently tagged form.
func (t RouterTarget) MarshalJSON() ([]byte, error) {
	switch t.Type {
	case "internet_gateway":
		return json.Marshal(struct {
			Type  string   `json:"type"`
			Value *Gateway `json:"value"`
		}{t.Type, t.Gateway})
	case "ip", "vpc_subnet":
		return json.Marshal(struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		}{t.Type, t.Value})
	}
	return json.Marshal(struct {
		Type string `json:"type"`
	}{t.Type})
}

// UnmarshalJSON reads upstream's adjacently tagged form.
func (t *RouterTarget) UnmarshalJSON(b []byte) error {
	var raw struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*t = RouterTarget{Type: raw.Type}
	switch raw.Type {
	case "internet_gateway":
		t.Gateway = &Gateway{}
		return json.Unmarshal(raw.Value, t.Gateway)
	case "ip", "vpc_subnet":
		return json.Unmarshal(raw.Value, &t.Value)
	}
	return nil
}

// EIPGateways is upstream's ExternalIpGatewayMap: per NIC id, per external
// IP, the internet gateways that may choose it as a source.
type EIPGateways struct {
	Mappings map[string]map[string][]string `json:"mappings"`
}

// FirewallRulesBody is upstream's VpcFirewallRulesEnsureBody.
type FirewallRulesBody struct {
	VNI   uint32         `json:"vni"`
	Rules []FirewallRule `json:"rules"`
}

// FirewallRule is upstream's ResolvedVpcFirewallRule. Nexus omits the
// filters that are None; absent and null are the same.
type FirewallRule struct {
	Status          string           `json:"status" enum:"enabled,disabled"`
	Direction       string           `json:"direction" enum:"inbound,outbound"`
	Targets         []NIC            `json:"targets"`
	FilterHosts     []HostIdentifier `json:"filter_hosts,omitempty" null:"true"`
	FilterPorts     []string         `json:"filter_ports,omitempty" null:"true"`
	FilterProtocols []Protocol       `json:"filter_protocols,omitempty" null:"true"`
	Action          string           `json:"action" enum:"allow,deny"`
	Priority        uint16           `json:"priority"`
}

// HostIdentifier is upstream's: {"type":"ip","value":net} or
// {"type":"vpc","value":vni}.
type HostIdentifier struct {
	Type string
	// Net is ip's; VNI vpc's.
	Net string
	VNI uint32
}

// MarshalJSON writes upstream's adjacently tagged form.
func (h HostIdentifier) MarshalJSON() ([]byte, error) {
	if h.Type == "vpc" {
		return json.Marshal(struct {
			Type  string `json:"type"`
			Value uint32 `json:"value"`
		}{h.Type, h.VNI})
	}
	return json.Marshal(struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	}{h.Type, h.Net})
}

// UnmarshalJSON reads upstream's adjacently tagged form.
func (h *HostIdentifier) UnmarshalJSON(b []byte) error {
	var raw struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*h = HostIdentifier{Type: raw.Type}
	switch raw.Type {
	case "vpc":
		return json.Unmarshal(raw.Value, &h.VNI)
	case "ip":
		return json.Unmarshal(raw.Value, &h.Net)
	}
	return nil
}

// Protocol is upstream's VpcFirewallRuleProtocol: tcp, udp, or icmp/icmp6
// with an optional type and code range (value null: any).
type Protocol struct {
	Type  string      `json:"type" enum:"tcp,udp,icmp,icmp6"`
	Value *IcmpFilter `json:"value,omitempty" null:"true"`
}

// IcmpFilter is upstream's VpcFirewallIcmpFilter.
type IcmpFilter struct {
	IcmpType uint8   `json:"icmp_type"`
	Code     *string `json:"code,omitempty" null:"true" doc:"A code or an inclusive range, \"3\" or \"3-4\"."`
}

// ExternalIPBody is upstream's InstanceExternalIpBody.
type ExternalIPBody struct {
	Type  string `json:"type" enum:"ephemeral,floating"`
	Value string `json:"value" doc:"The external IP address."`
}

// AttachedSubnets is upstream's.
type AttachedSubnets struct {
	Subnets []AttachedSubnet `json:"subnets"`
}

// AttachedSubnet is upstream's.
type AttachedSubnet struct {
	Subnet string `json:"subnet" doc:"An IP network."`
	Kind   string `json:"kind" enum:"vpc,external"`
}

// ProbeSet is upstream's: the exact set of probes the sled should run.
type ProbeSet struct {
	Probes []Probe `json:"probes"`
}

// Probe is upstream's ProbeCreate.
type Probe struct {
	ID          string            `json:"id" format:"uuid"`
	Interface   NIC               `json:"interface"`
	ExternalIPs []ProbeExternalIP `json:"external_ips"`
}

// ProbeExternalIP is upstream's ExternalIp (of a probe).
type ProbeExternalIP struct {
	IP        string `json:"ip"`
	FirstPort uint16 `json:"first_port"`
	LastPort  uint16 `json:"last_port"`
	Kind      string `json:"kind" enum:"snat,ephemeral,floating"`
}

// ErrInvalid: a request upstream's Nexus would not send; nothing changed.
var ErrInvalid = errors.New("invalid request")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// parseIP is an address in the form upstream writes, canonical.
func parseIP(what, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, invalid("%s %q is not an IP address", what, s)
	}
	return a, nil
}

// parseNet is an IP network ("a.b.c.d/n", "x::/n").
func parseNet(what, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
		return netip.Prefix{}, invalid("%s %q is not an IP network like 172.30.0.0/22", what, s)
	}
	return p, nil
}

// parseMAC is a MAC in upstream's form, written as upstream writes it.
func parseMAC(what, s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 || len(s) != 17 {
		return "", invalid("%s %q is not a MAC address like A8:40:25:F0:00:01", what, s)
	}
	return strings.ToUpper(hw.String()), nil
}

func checkVNI(what string, v uint32) error {
	if v > MaxVNI {
		return invalid("%s %d is larger than the largest VNI, %d", what, v, MaxVNI)
	}
	return nil
}

func checkUUID(what, s string) (string, error) {
	if !isUUID(s) {
		return "", invalid("%s %q is not a UUID", what, s)
	}
	return strings.ToLower(s), nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// Check checks a mapping and returns it as kept: addresses and MAC canonical.
func (m V2P) Check() (V2P, error) {
	vip, err := parseIP("virtual_ip", m.VirtualIP)
	if err != nil {
		return V2P{}, err
	}
	phys, err := parseIP("physical_host_ip", m.PhysicalHostIP)
	if err != nil || !phys.Is6() {
		return V2P{}, invalid("physical_host_ip %q is not an IPv6 address", m.PhysicalHostIP)
	}
	mac, err := parseMAC("virtual_mac", m.VirtualMAC)
	if err != nil {
		return V2P{}, err
	}
	if err := checkVNI("vni", m.VNI); err != nil {
		return V2P{}, err
	}
	return V2P{VirtualIP: vip.String(), VirtualMAC: mac, PhysicalHostIP: phys.String(), VNI: m.VNI}, nil
}

// key is what a mapping is kept by: (vni, virtual_ip), as OPTE's table.
func (m V2P) key() string { return strconv.FormatUint(uint64(m.VNI), 10) + "/" + m.VirtualIP }

// Check checks an id and returns it as kept (the subnet canonical).
func (id RouterID) Check() (RouterID, error) {
	if err := checkVNI("id.vni", id.VNI); err != nil {
		return RouterID{}, err
	}
	switch id.Kind.Type {
	case "system":
		if id.Kind.Subnet != "" {
			return RouterID{}, invalid("id.kind: a system router has no subnet")
		}
	case "custom":
		p, err := parseNet("id.kind.subnet", id.Kind.Subnet)
		if err != nil {
			return RouterID{}, err
		}
		id.Kind.Subnet = p.String()
	default:
		return RouterID{}, invalid("id.kind.type %q: want system or custom", id.Kind.Type)
	}
	return id, nil
}

// key is what a set is kept by.
func (id RouterID) key() string {
	k := strconv.FormatUint(uint64(id.VNI), 10) + "/" + id.Kind.Type
	if id.Kind.Type == "custom" {
		k += "/" + id.Kind.Subnet
	}
	return k
}

// Check checks a route set and returns it as kept: its routes canonical,
// without duplicates, in a stable order.
func (s RouteSet) Check() (RouteSet, error) {
	id, err := s.ID.Check()
	if err != nil {
		return RouteSet{}, err
	}
	out := RouteSet{ID: id, Routes: []Route{}}
	if s.Version != nil {
		rid, err := checkUUID("version.router_id", s.Version.RouterID)
		if err != nil {
			return RouteSet{}, err
		}
		out.Version = &RouterVersion{RouterID: rid, Version: s.Version.Version}
	}
	seen := map[string]bool{}
	for i, r := range s.Routes {
		c, err := r.check(fmt.Sprintf("routes[%d]", i))
		if err != nil {
			return RouteSet{}, err
		}
		if k := c.key(); !seen[k] {
			seen[k] = true
			out.Routes = append(out.Routes, c)
		}
	}
	sortRoutes(out.Routes)
	return out, nil
}

func (r Route) check(at string) (Route, error) {
	dest, err := parseNet(at+".dest", r.Dest)
	if err != nil {
		return Route{}, err
	}
	t := RouterTarget{Type: r.Target.Type}
	switch r.Target.Type {
	case "drop":
	case "ip":
		a, err := parseIP(at+".target.value", r.Target.Value)
		if err != nil {
			return Route{}, err
		}
		t.Value = a.String()
	case "vpc_subnet":
		p, err := parseNet(at+".target.value", r.Target.Value)
		if err != nil {
			return Route{}, err
		}
		t.Value = p.String()
	case "internet_gateway":
		g := r.Target.Gateway
		switch {
		case g == nil:
			return Route{}, invalid("%s.target.value: an internet_gateway target needs one", at)
		case g.Type == "system" && g.ID == "":
			t.Gateway = &Gateway{Type: "system"}
		case g.Type == "instance":
			id, err := checkUUID(at+".target.value.value", g.ID)
			if err != nil {
				return Route{}, err
			}
			t.Gateway = &Gateway{Type: "instance", ID: id}
		default:
			return Route{}, invalid("%s.target.value: want {\"type\":\"system\"} or {\"type\":\"instance\",\"value\":<uuid>}", at)
		}
	default:
		return Route{}, invalid("%s.target.type %q: want drop, ip, vpc_subnet or internet_gateway", at, r.Target.Type)
	}
	return Route{Dest: dest.String(), Target: t}, nil
}

// key is a route's identity in its set.
func (r Route) key() string {
	k := r.Dest + " " + r.Target.Type + " " + r.Target.Value
	if g := r.Target.Gateway; g != nil {
		k += g.Type + " " + g.ID
	}
	return k
}

// Check checks a map and returns it as kept: ids and addresses canonical.
func (g EIPGateways) Check() (EIPGateways, error) {
	out := EIPGateways{Mappings: map[string]map[string][]string{}}
	for nic, ips := range g.Mappings {
		id, err := checkUUID("mappings key", nic)
		if err != nil {
			return EIPGateways{}, err
		}
		m := map[string][]string{}
		for ip, gws := range ips {
			a, err := parseIP("mappings."+nic+" key", ip)
			if err != nil {
				return EIPGateways{}, err
			}
			list := []string{}
			for _, gw := range gws {
				gid, err := checkUUID("mappings."+nic+"."+ip+"[]", gw)
				if err != nil {
					return EIPGateways{}, err
				}
				if !contains(list, gid) {
					list = append(list, gid)
				}
			}
			sortStrings(list)
			m[a.String()] = list
		}
		out.Mappings[id] = m
	}
	return out, nil
}

// Check checks the rules of a VNI.
func (b FirewallRulesBody) Check() (FirewallRulesBody, error) {
	if err := checkVNI("vni", b.VNI); err != nil {
		return FirewallRulesBody{}, err
	}
	if b.Rules == nil {
		return FirewallRulesBody{}, invalid("rules is required")
	}
	for i, r := range b.Rules {
		if err := r.check(fmt.Sprintf("rules[%d]", i)); err != nil {
			return FirewallRulesBody{}, err
		}
	}
	return b, nil
}

func (r FirewallRule) check(at string) error {
	switch {
	case r.Status != "enabled" && r.Status != "disabled":
		return invalid("%s.status %q: want enabled or disabled", at, r.Status)
	case r.Direction != "inbound" && r.Direction != "outbound":
		return invalid("%s.direction %q: want inbound or outbound", at, r.Direction)
	case r.Action != "allow" && r.Action != "deny":
		return invalid("%s.action %q: want allow or deny", at, r.Action)
	case r.Targets == nil:
		return invalid("%s.targets is required", at)
	}
	for i := range r.Targets {
		if err := checkNIC(fmt.Sprintf("%s.targets[%d]", at, i), &r.Targets[i]); err != nil {
			return err
		}
	}
	for i, h := range r.FilterHosts {
		switch h.Type {
		case "ip":
			if _, err := parseNet(fmt.Sprintf("%s.filter_hosts[%d].value", at, i), h.Net); err != nil {
				return err
			}
		case "vpc":
			if err := checkVNI(fmt.Sprintf("%s.filter_hosts[%d].value", at, i), h.VNI); err != nil {
				return err
			}
		default:
			return invalid("%s.filter_hosts[%d].type %q: want ip or vpc", at, i, h.Type)
		}
	}
	for i, p := range r.FilterPorts {
		if _, _, ok := parseRange(p, 65535); !ok {
			return invalid("%s.filter_ports[%d] %q: want a port or an inclusive range like 1000-2000", at, i, p)
		}
	}
	for i, p := range r.FilterProtocols {
		switch p.Type {
		case "tcp", "udp":
			if p.Value != nil {
				return invalid("%s.filter_protocols[%d]: %s takes no value", at, i, p.Type)
			}
		case "icmp", "icmp6":
			if p.Value != nil && p.Value.Code != nil {
				if _, _, ok := parseRange(*p.Value.Code, 255); !ok {
					return invalid("%s.filter_protocols[%d].value.code %q: want a code or an inclusive range like 3-4", at, i, *p.Value.Code)
				}
			}
		default:
			return invalid("%s.filter_protocols[%d].type %q: want tcp, udp, icmp or icmp6", at, i, p.Type)
		}
	}
	return nil
}

// parseRange reads "n" or "a-b" (a ≤ b ≤ max).
func parseRange(s string, max uint64) (uint64, uint64, bool) {
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := strconv.ParseUint(lo, 10, 32)
	if err != nil || a > max {
		return 0, 0, false
	}
	if !isRange {
		return a, a, true
	}
	b, err := strconv.ParseUint(hi, 10, 32)
	if err != nil || b > max || b < a {
		return 0, 0, false
	}
	return a, b, true
}

// checkNIC checks a NIC as a sled config's are checked.
func checkNIC(at string, n *NIC) error {
	if ps := sledconfig.NICProblems(at, n); len(ps) > 0 {
		return invalid("%s", ps[0])
	}
	return nil
}

// Check checks a request and returns it as kept: the address canonical.
func (b ExternalIPBody) Check() (ExternalIPBody, error) {
	if b.Type != "ephemeral" && b.Type != "floating" {
		return ExternalIPBody{}, invalid("type %q: want ephemeral or floating", b.Type)
	}
	a, err := parseIP("value", b.Value)
	if err != nil {
		return ExternalIPBody{}, err
	}
	return ExternalIPBody{Type: b.Type, Value: a.String()}, nil
}

// Check checks a subnet and returns it as kept.
func (s AttachedSubnet) Check(at string) (AttachedSubnet, error) {
	p, err := parseNet(at+"subnet", s.Subnet)
	if err != nil {
		return AttachedSubnet{}, err
	}
	if s.Kind != "vpc" && s.Kind != "external" {
		return AttachedSubnet{}, invalid("%skind %q: want vpc or external", at, s.Kind)
	}
	return AttachedSubnet{Subnet: p.String(), Kind: s.Kind}, nil
}

// Check checks a set and returns it as kept: subnets canonical, by subnet.
func (s AttachedSubnets) Check() (AttachedSubnets, error) {
	if s.Subnets == nil {
		return AttachedSubnets{}, invalid("subnets is required")
	}
	out := AttachedSubnets{Subnets: []AttachedSubnet{}}
	seen := map[string]bool{}
	for i, a := range s.Subnets {
		c, err := a.Check(fmt.Sprintf("subnets[%d].", i))
		if err != nil {
			return AttachedSubnets{}, err
		}
		if seen[c.Subnet] {
			return AttachedSubnets{}, invalid("subnets: %s is given twice", c.Subnet)
		}
		seen[c.Subnet] = true
		out.Subnets = append(out.Subnets, c)
	}
	sortSubnets(out.Subnets)
	return out, nil
}

// Check checks a probe set.
func (s ProbeSet) Check() (ProbeSet, error) {
	if s.Probes == nil {
		return ProbeSet{}, invalid("probes is required")
	}
	out := ProbeSet{Probes: []Probe{}}
	seen := map[string]bool{}
	for i, p := range s.Probes {
		at := fmt.Sprintf("probes[%d]", i)
		id, err := checkUUID(at+".id", p.ID)
		if err != nil {
			return ProbeSet{}, err
		}
		if seen[id] {
			return ProbeSet{}, invalid("probes: %s is given twice", id)
		}
		seen[id] = true
		if err := checkNIC(at+".interface", &p.Interface); err != nil {
			return ProbeSet{}, err
		}
		if p.Interface.Kind.Type != "probe" {
			return ProbeSet{}, invalid("%s.interface.kind.type %q: a probe's NIC is of kind probe", at, p.Interface.Kind.Type)
		}
		c := Probe{ID: id, Interface: p.Interface, ExternalIPs: []ProbeExternalIP{}}
		for j, e := range p.ExternalIPs {
			a, err := parseIP(fmt.Sprintf("%s.external_ips[%d].ip", at, j), e.IP)
			if err != nil {
				return ProbeSet{}, err
			}
			if e.Kind != "snat" && e.Kind != "ephemeral" && e.Kind != "floating" {
				return ProbeSet{}, invalid("%s.external_ips[%d].kind %q: want snat, ephemeral or floating", at, j, e.Kind)
			}
			if e.FirstPort > e.LastPort {
				return ProbeSet{}, invalid("%s.external_ips[%d]: first_port %d is after last_port %d", at, j, e.FirstPort, e.LastPort)
			}
			e.IP = a.String()
			c.ExternalIPs = append(c.ExternalIPs, e)
		}
		out.Probes = append(out.Probes, c)
	}
	return out, nil
}
