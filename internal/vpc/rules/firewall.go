package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
)

// Port is the identity a rule's targets are compared with: a NIC is
// unique by (VNI, MAC).
type Port struct {
	VNI uint32
	MAC MAC
}

// Rule is one compiled firewall rule, what OPTE holds after the sled agent
// unrolled an upstream rule into one rule per (protocol, host) pair.
type Rule struct {
	// Source is the index of the upstream rule in the list given to
	// CompileFirewall.
	Source   int
	Dir      Dir
	Priority uint16
	Action   Action
	// Host is nil for any host.
	Host *HostFilter
	// Proto is nil for any protocol.
	Proto *ProtocolFilter
	// HasPorts says the rule filters on the destination port; Ports are
	// the ports it accepts, sorted and merged. Only TCP and UDP rules have
	// a port filter. A filter whose ranges were all reversed has no port
	// and matches nothing.
	HasPorts bool
	Ports    []PortRange

	seq int // expansion order, for OPTE's insertion order
}

// matches is the rule's predicate, the reference the index must agree with.
func (r *Rule) matches(f *Flow) bool {
	if p := r.Proto; p != nil {
		if f.Proto != p.Proto {
			return false
		}
		if p.ICMP != nil {
			if f.ICMPType != p.ICMP.Type {
				return false
			}
			if c := p.ICMP.Code; c != nil && (f.ICMPCode < c.First || f.ICMPCode > c.Last) {
				return false
			}
		}
	}
	if r.HasPorts && !portsContain(r.Ports, f.DstPort) {
		return false
	}
	if h := r.Host; h != nil {
		switch h.Kind {
		case HostIP:
			if !h.Net.Contains(f.Remote()) {
				return false
			}
		case HostVPC:
			if !f.VNI.Present || f.VNI.VNI != h.VNI {
				return false
			}
		}
	}
	return true
}

func portsContain(ranges []PortRange, port uint16) bool {
	for _, r := range ranges {
		if port >= r.First && port <= r.Last {
			return true
		}
	}
	return false
}

func (r Rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s priority %d %s", r.Dir, r.Priority, r.Action)
	if r.Host != nil {
		fmt.Fprintf(&b, " host %s", r.Host)
	}
	if r.Proto != nil {
		fmt.Fprintf(&b, " proto %s", r.Proto)
	}
	if r.HasPorts {
		ps := make([]string, len(r.Ports))
		for i, p := range r.Ports {
			ps[i] = p.String()
		}
		fmt.Fprintf(&b, " ports [%s]", strings.Join(ps, ","))
	}
	return b.String()
}

// Verdict is the firewall's decision on a flow.
type Verdict struct {
	Action Action
	// Rule is the index of the matched rule in Rules(dir), or -1 when no
	// rule matched and the direction's default decided.
	Rule int
}

// Default actions of the firewall layer: inbound Deny, outbound
// StatefulAllow (opte lib/oxide-vpc/src/engine/firewall.rs:138-142).
var (
	DefaultIn  = Verdict{Action: Deny, Rule: -1}
	DefaultOut = Verdict{Action: Allow, Rule: -1}
)

var epochs atomic.Uint64

// Firewall is a port's compiled rule set. It is immutable: a rule change
// compiles a new one, and the engine swaps it in and clears the flows the
// old one allowed (OPTE clears the layer's flow table on set_fw_rules).
type Firewall struct {
	epoch   uint64
	port    Port
	in, out index
}

// CompileFirewall selects the rules that apply to port and compiles them
// in OPTE's order. rules are assumed decoded (and so validated) from
// upstream's shape; a value no decoding could produce is an error.
func CompileFirewall(rules []FirewallRule, port Port) (*Firewall, error) {
	var in, out []Rule
	seq := 0
	for i := range rules {
		src := &rules[i]
		if err := checkRule(src); err != nil {
			return nil, fmt.Errorf("firewall rule %d: %w", i, err)
		}
		// Disabled rules are dropped; a rule applies to a port when it has
		// no targets or one of them is the port
		// (omicron illumos-utils/src/opte/firewall_rules.rs:138-147).
		if src.Status != Enabled || !appliesTo(src, port) {
			continue
		}
		for _, r := range expand(i, src) {
			r.seq = seq
			seq++
			if r.Dir == In {
				in = append(in, r)
			} else {
				out = append(out, r)
			}
		}
	}
	fw := &Firewall{epoch: epochs.Add(1), port: port}
	fw.in = buildIndex(order(in))
	fw.out = buildIndex(order(out))
	return fw, nil
}

func checkRule(r *FirewallRule) error {
	switch {
	case r.Status != Enabled && r.Status != Disabled:
		return invalid("status", string(r.Status), "not enabled or disabled")
	case r.Direction != Inbound && r.Direction != Outbound:
		return invalid("direction", string(r.Direction), "not inbound or outbound")
	case r.Action != RuleAllow && r.Action != RuleDeny:
		return invalid("action", string(r.Action), "not allow or deny")
	}
	for _, h := range r.Hosts {
		if (h.Kind != HostIP || !h.Net.IsValid()) && h.Kind != HostVPC {
			return invalid("filter_hosts", h.String(), "not an ip network or a vpc")
		}
	}
	for _, p := range r.Protocols {
		switch p.Proto {
		case ProtoTCP, ProtoUDP:
			if p.ICMP != nil {
				return invalid("filter_protocols", p.Proto.String(), "an ICMP filter on a protocol that is not ICMP")
			}
		case ProtoICMP, ProtoICMPv6:
		default:
			return invalid("filter_protocols", p.Proto.String(), "not tcp, udp, icmp or icmp6")
		}
	}
	return nil
}

func appliesTo(r *FirewallRule, port Port) bool {
	if len(r.Targets) == 0 {
		return true
	}
	for _, t := range r.Targets {
		if uint32(t.VNI) == port.VNI && t.MAC == port.MAC {
			return true
		}
	}
	return false
}

// expand unrolls one upstream rule into protocols × hosts rules, protocols
// outermost, the order the sled agent sends them to OPTE
// (omicron illumos-utils/src/opte/firewall_rules.rs:155-188).
func expand(source int, src *FirewallRule) []Rule {
	action := Deny
	if src.Action == RuleAllow {
		action = Allow
	}
	protos := []*ProtocolFilter{nil}
	if len(src.Protocols) > 0 {
		protos = make([]*ProtocolFilter, len(src.Protocols))
		for i := range src.Protocols {
			protos[i] = &src.Protocols[i]
		}
	}
	hosts := []*HostFilter{nil}
	if len(src.Hosts) > 0 {
		hosts = make([]*HostFilter, len(src.Hosts))
		for i := range src.Hosts {
			hosts[i] = &src.Hosts[i]
		}
	}
	var ports []PortRange
	hasPorts := len(src.Ports) > 0
	if hasPorts {
		ports = mergePorts(src.Ports)
	}
	out := make([]Rule, 0, len(protos)*len(hosts))
	for _, p := range protos {
		for _, h := range hosts {
			r := Rule{Source: source, Dir: src.Direction.Dir(), Priority: src.Priority, Action: action, Host: h, Proto: p}
			// Ports are set only on TCP and UDP rules: a rule with ports
			// and no protocol matches every port
			// (omicron illumos-utils/src/opte/firewall_rules.rs:167-174).
			if p != nil && (p.Proto == ProtoTCP || p.Proto == ProtoUDP) && hasPorts {
				r.HasPorts, r.Ports = true, ports
			}
			out = append(out, r)
		}
	}
	return out
}

// mergePorts sorts and merges ranges, dropping reversed ones, as OPTE's
// port predicate does (opte lib/oxide-vpc/src/engine/firewall.rs:245-279).
func mergePorts(in []PortRange) []PortRange {
	rs := make([]PortRange, 0, len(in))
	for _, r := range in {
		if r.First <= r.Last {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b PortRange) int { return cmp.Compare(a.First, b.First) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// order sorts rules as OPTE's rule table holds them: lower priority first,
// Deny before Allow at equal priority, and among equals the rule added last
// first, since each is inserted before the first equal it finds
// (opte lib/opte/src/engine/layer.rs:1677-1693, set_rules adds them in
// order at :1801-1806).
func order(rs []Rule) []Rule {
	slices.SortFunc(rs, func(a, b Rule) int {
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		if a.Action != b.Action {
			if a.Action == Deny {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.seq, a.seq)
	})
	return rs
}

// Epoch identifies this compiled rule set; every compilation in the
// process gets a larger one. A flow decided under an older epoch was
// decided by rules that are gone.
func (fw *Firewall) Epoch() uint64 { return fw.epoch }

// Port is the port the rules were compiled for.
func (fw *Firewall) Port() Port { return fw.port }

// Rules returns the compiled rules of a direction in match order. The
// slice is shared: do not modify it.
func (fw *Firewall) Rules(d Dir) []Rule {
	if d == In {
		return fw.in.rules
	}
	return fw.out.rules
}

// Match decides a flow: the first rule in order that matches it, else the
// direction's default.
func (fw *Firewall) Match(f *Flow) Verdict {
	ix, def := &fw.out, DefaultOut
	if f.Dir == In {
		ix, def = &fw.in, DefaultIn
	}
	i := ix.match(f)
	if i < 0 {
		return def
	}
	return Verdict{Action: ix.rules[i].Action, Rule: i}
}

// matchLinear is Match by a scan of every rule, the reference for tests.
func (fw *Firewall) matchLinear(f *Flow) Verdict {
	rs, def := fw.out.rules, DefaultOut
	if f.Dir == In {
		rs, def = fw.in.rules, DefaultIn
	}
	for i := range rs {
		if rs[i].matches(f) {
			return Verdict{Action: rs[i].Action, Rule: i}
		}
	}
	return def
}
