package rules

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// FirewallRule is upstream's ResolvedVpcFirewallRule, as Nexus sends it in
// PUT /vpc/{id}/firewall/rules and in an instance's local_config. The three
// filters may be absent or null (upstream None: any); nil here. An empty
// list means the same.
type FirewallRule struct {
	Status    Status           `json:"status"`
	Direction Direction        `json:"direction"`
	Targets   []NIC            `json:"targets"`
	Hosts     []HostFilter     `json:"filter_hosts,omitzero"`
	Ports     []PortRange      `json:"filter_ports,omitzero"`
	Protocols []ProtocolFilter `json:"filter_protocols,omitzero"`
	Action    RuleAction       `json:"action"`
	Priority  uint16           `json:"priority"`
}

func (r *FirewallRule) UnmarshalJSON(b []byte) error {
	type plain FirewallRule
	var p plain
	if err := decodeStrict(b, &p, "rule", "status", "direction", "targets", "action", "priority"); err != nil {
		return err
	}
	*r = FirewallRule(p)
	return nil
}

// MarshalJSON writes upstream's shape: targets is a list even when nil.
func (r FirewallRule) MarshalJSON() ([]byte, error) {
	type plain FirewallRule
	if r.Targets == nil {
		r.Targets = []NIC{}
	}
	return json.Marshal(plain(r))
}

// Status is upstream VpcFirewallRuleStatus.
type Status string

const (
	Enabled  Status = "enabled"
	Disabled Status = "disabled"
)

func (s *Status) UnmarshalText(b []byte) error {
	switch v := Status(b); v {
	case Enabled, Disabled:
		*s = v
		return nil
	}
	return invalid("status", string(b), "not enabled or disabled")
}

// Direction is upstream VpcFirewallRuleDirection.
type Direction string

const (
	Inbound  Direction = "inbound"
	Outbound Direction = "outbound"
)

func (d *Direction) UnmarshalText(b []byte) error {
	switch v := Direction(b); v {
	case Inbound, Outbound:
		*d = v
		return nil
	}
	return invalid("direction", string(b), "not inbound or outbound")
}

// Dir is the packet direction the rule applies to.
func (d Direction) Dir() Dir {
	if d == Inbound {
		return In
	}
	return Out
}

// RuleAction is upstream VpcFirewallRuleAction.
type RuleAction string

const (
	RuleAllow RuleAction = "allow"
	RuleDeny  RuleAction = "deny"
)

func (a *RuleAction) UnmarshalText(b []byte) error {
	switch v := RuleAction(b); v {
	case RuleAllow, RuleDeny:
		*a = v
		return nil
	}
	return invalid("action", string(b), "not allow or deny")
}

// NIC is one of a rule's targets, upstream NetworkInterface. Only the VNI
// and MAC take part in selecting rules; the rest is kept as sent.
type NIC struct {
	ID       string          `json:"id"`
	Kind     json.RawMessage `json:"kind"`
	Name     string          `json:"name"`
	IPConfig json.RawMessage `json:"ip_config"`
	MAC      MAC             `json:"mac"`
	VNI      VNI             `json:"vni"`
	Primary  bool            `json:"primary"`
	Slot     uint8           `json:"slot"`
}

func (t *NIC) UnmarshalJSON(b []byte) error {
	type plain NIC
	var p plain
	if err := decodeStrict(b, &p, "target", "id", "kind", "name", "ip_config", "mac", "vni", "primary", "slot"); err != nil {
		return err
	}
	*t = NIC(p)
	return nil
}

// HostKind says what a host filter names.
type HostKind uint8

const (
	// HostIP is {"type":"ip","value":IpNet}: a host (/32, /128) or a network.
	HostIP HostKind = iota + 1
	// HostVPC is {"type":"vpc","value":Vni}: packets tagged with that VNI.
	HostVPC
)

// HostFilter is upstream HostIdentifier.
type HostFilter struct {
	Kind HostKind
	Net  netip.Prefix // HostIP
	VNI  uint32       // HostVPC
}

// IPHost returns an ip host filter.
func IPHost(p netip.Prefix) HostFilter { return HostFilter{Kind: HostIP, Net: p} }

// VPCHost returns a vpc host filter.
func VPCHost(vni uint32) HostFilter { return HostFilter{Kind: HostVPC, VNI: vni} }

func (h HostFilter) MarshalJSON() ([]byte, error) {
	switch h.Kind {
	case HostIP:
		return json.Marshal(map[string]any{"type": "ip", "value": h.Net.String()})
	case HostVPC:
		return json.Marshal(map[string]any{"type": "vpc", "value": h.VNI})
	}
	return nil, fmt.Errorf("host filter of unknown kind %d", h.Kind)
}

func (h *HostFilter) UnmarshalJSON(b []byte) error {
	t, m, err := tagOf(b, "filter_hosts")
	if err != nil {
		return err
	}
	switch t {
	case "ip":
		p, err := parsePrefix("filter_hosts.value", m["value"])
		if err != nil {
			return err
		}
		*h = IPHost(p)
	case "vpc":
		var v VNI
		if isNull(m["value"]) {
			return invalid("filter_hosts.value", "", "required")
		}
		if err := v.UnmarshalJSON(m["value"]); err != nil {
			return err
		}
		*h = VPCHost(uint32(v))
	default:
		return invalid("filter_hosts.type", t, "not ip or vpc")
	}
	return nil
}

func (h HostFilter) String() string {
	if h.Kind == HostVPC {
		return fmt.Sprintf("vpc=%d", h.VNI)
	}
	return "ip=" + h.Net.String()
}

// PortRange is upstream L4PortRange, "22" or "1000-2000". Upstream refuses
// port 0 but accepts a range whose start is above its end, which then
// holds no port.
type PortRange struct{ First, Last uint16 }

func (p PortRange) String() string {
	if p.First == p.Last {
		return strconv.Itoa(int(p.First))
	}
	return fmt.Sprintf("%d-%d", p.First, p.Last)
}

func (p PortRange) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *PortRange) UnmarshalText(b []byte) error {
	first, last, err := parseRange[uint16](string(b), 16, 1, "filter_ports", "not a port 1-65535 or a range of them (\"22\", \"1000-2000\")")
	if err != nil {
		return err
	}
	*p = PortRange{First: first, Last: last}
	return nil
}

// parseRange reads upstream's "n" or "n-m" into numbers of bits bits, each
// at least min; any other text is invalid(field, s, why).
func parseRange[T uint8 | uint16](s string, bits int, min uint64, field, why string) (T, T, error) {
	one := func(v string) (T, error) {
		n, err := strconv.ParseUint(v, 10, bits)
		if err != nil || n < min {
			return 0, invalid(field, s, why)
		}
		return T(n), nil
	}
	left, right, isRange := strings.Cut(s, "-")
	first, err := one(left)
	if err != nil {
		return 0, 0, err
	}
	last := first
	if isRange {
		if last, err = one(right); err != nil {
			return 0, 0, err
		}
	}
	return first, last, nil
}

// ProtocolFilter is upstream VpcFirewallRuleProtocol: tcp, udp, or icmp /
// icmp6 with an optional type and code filter (nil: any message).
type ProtocolFilter struct {
	Proto Proto // ProtoTCP, ProtoUDP, ProtoICMP or ProtoICMPv6
	ICMP  *ICMPFilter
}

// ICMPFilter is upstream VpcFirewallIcmpFilter: a message type and an
// optional code range (nil: any code).
type ICMPFilter struct {
	Type uint8
	Code *CodeRange
}

// CodeRange is upstream IcmpParamRange, "3" or "3-4"; like PortRange a
// reversed range is accepted and holds nothing.
type CodeRange struct{ First, Last uint8 }

func (c CodeRange) String() string {
	if c.First == c.Last {
		return strconv.Itoa(int(c.First))
	}
	return fmt.Sprintf("%d-%d", c.First, c.Last)
}

func (c CodeRange) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

func (c *CodeRange) UnmarshalText(b []byte) error {
	first, last, err := parseRange[uint8](string(b), 8, 0, "code", "not a number 0-255 or a range of them (\"3\", \"3-4\")")
	if err != nil {
		return err
	}
	*c = CodeRange{First: first, Last: last}
	return nil
}

type icmpFilterJSON struct {
	Type uint8      `json:"icmp_type"`
	Code *CodeRange `json:"code"`
}

func (p ProtocolFilter) MarshalJSON() ([]byte, error) {
	var name string
	switch p.Proto {
	case ProtoTCP:
		return []byte(`{"type":"tcp"}`), nil
	case ProtoUDP:
		return []byte(`{"type":"udp"}`), nil
	case ProtoICMP:
		name = "icmp"
	case ProtoICMPv6:
		name = "icmp6"
	default:
		return nil, fmt.Errorf("protocol filter for %s", p.Proto)
	}
	var value any
	if p.ICMP != nil {
		value = icmpFilterJSON{Type: p.ICMP.Type, Code: p.ICMP.Code}
	}
	return json.Marshal(map[string]any{"type": name, "value": value})
}

func (p *ProtocolFilter) UnmarshalJSON(b []byte) error {
	t, m, err := tagOf(b, "filter_protocols")
	if err != nil {
		return err
	}
	switch t {
	case "tcp":
		*p = ProtocolFilter{Proto: ProtoTCP}
		return nil
	case "udp":
		*p = ProtocolFilter{Proto: ProtoUDP}
		return nil
	case "icmp":
		*p = ProtocolFilter{Proto: ProtoICMP}
	case "icmp6":
		*p = ProtocolFilter{Proto: ProtoICMPv6}
	default:
		return invalid("filter_protocols.type", t, "not tcp, udp, icmp or icmp6")
	}
	if raw := m["value"]; !isNull(raw) {
		if err := decodeStrict(raw, new(map[string]any), "filter_protocols.value", "icmp_type"); err != nil {
			return err
		}
		var f icmpFilterJSON
		if err := json.Unmarshal(raw, &f); err != nil {
			if ie := (*InvalidError)(nil); errors.As(err, &ie) {
				return err
			}
			return invalid("filter_protocols.value", string(raw), "not {icmp_type: 0-255, code?: \"3\" or \"3-4\"}")
		}
		p.ICMP = &ICMPFilter{Type: f.Type, Code: f.Code}
	}
	return nil
}

func (p ProtocolFilter) String() string {
	s := p.Proto.String()
	if p.ICMP != nil {
		s += fmt.Sprintf(" type %d", p.ICMP.Type)
		if p.ICMP.Code != nil {
			s += " code " + p.ICMP.Code.String()
		}
	}
	return s
}
