package engine

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sled-agent/sled-agent/internal/vpc/flow"
	"github.com/sled-agent/sled-agent/internal/vpc/gateway"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// IPConfig is a port's address in one family: its private address in its
// subnet, and the other addresses it may send from and receive for
// (transit IPs; attached subnets are the port's, PortConfig.Attached).
type IPConfig struct {
	Private netip.Addr
	Subnet  netip.Prefix
	Transit []netip.Prefix
}

// PortConfig is what a port is made with (OPTE's VpcCfg, as the port
// manager fills it).
type PortConfig struct {
	// Name is the port's link: a guest's tap, a service zone's NIC's host
	// end.
	Name string
	VNI  uint32
	MAC  wire.MAC
	// IPv4 and IPv6 are the port's addresses; at least one.
	IPv4, IPv6 *IPConfig
	// Service is a service zone's port (services VPC), not a guest's.
	Service bool
	// DHCP is what the gateway's DHCP hands out besides the address
	// (hostname, domain, search list, DNS servers); MTU the port's (1500 if
	// 0), announced in router advertisements.
	DHCP gateway.DHCP
	MTU  uint32
	// External is its external addresses and their gateways, as
	// SetExternalIPs sets them.
	External External
	// Attached are its attached subnets, as SetAttachedSubnets sets them.
	Attached []AttachedSubnet
}

func (c PortConfig) check() error {
	if c.Name == "" {
		return fmt.Errorf("engine: a port needs a name")
	}
	if c.VNI > mappings.MaxVNI {
		return fmt.Errorf("engine: port %s: VNI %d: want at most %d", c.Name, c.VNI, mappings.MaxVNI)
	}
	if c.IPv4 == nil && c.IPv6 == nil {
		return fmt.Errorf("engine: port %s has no address", c.Name)
	}
	for _, ip := range []*IPConfig{c.IPv4, c.IPv6} {
		if ip == nil {
			continue
		}
		if !ip.Subnet.Contains(ip.Private) {
			return fmt.Errorf("engine: port %s: %s is not in its subnet %s", c.Name, ip.Private, ip.Subnet)
		}
	}
	if c.IPv4 != nil && !c.IPv4.Private.Is4() || c.IPv6 != nil && !c.IPv6.Private.Is6() {
		return fmt.Errorf("engine: port %s: an address of the wrong family", c.Name)
	}
	return nil
}

// Port is one port: its config, its layers' rules and flows, and what it
// did.
type Port struct {
	e   *Engine
	cfg PortConfig

	// gw is the gateway layer, made again from gwBase when the attached
	// subnets change (attachMu orders the changes; attached is the set).
	gw       atomic.Pointer[gateway.Gateway]
	gwBase   gateway.Config
	attachMu sync.Mutex
	attached []AttachedSubnet
	// reply holds the gateway's answer to the frame Outbound is running:
	// a port's frames from its guest are run one at a time.
	reply []byte

	fw     atomic.Pointer[rules.Firewall]
	router atomic.Pointer[rules.Table]
	// fwFlows are the flows the firewall allowed, each under its key and
	// its mirror, so that either direction of it passes.
	fwFlows *flow.Table[wire.FlowKey, fwFlow]

	// The NAT layer: its rules, and its flows each under the key of
	// either direction. natMu orders config swaps and flow insertions
	// and removals; natActive counts the flows, so that a port with none
	// skips the lookup.
	nat       atomic.Pointer[natConfig]
	natMu     sync.Mutex
	natFlows  *flow.Table[wire.FlowKey, natEntry]
	natActive atomic.Int64

	stats counters
}

// fwFlow is a flow the firewall allowed: which way it began and by which
// rule (-1: the direction's default).
type fwFlow struct {
	dir  rules.Dir
	rule int
	// mirror: this entry is the flow's under the key of its other
	// direction.
	mirror bool
}

func newPort(e *Engine, cfg PortConfig) (*Port, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	gc := gateway.Config{GuestMAC: cfg.MAC, GatewayMAC: GatewayMAC, DHCP: cfg.DHCP, MTU: cmp.Or(cfg.MTU, 1500)}
	if ip := cfg.IPv4; ip != nil {
		gc.IPv4 = &gateway.IPv4Config{Private: ip.Private, Gateway: gateway.FirstHost(ip.Subnet), Transit: transit(ip.Transit)}
	}
	if ip := cfg.IPv6; ip != nil {
		gc.IPv6 = &gateway.IPv6Config{Private: ip.Private, Transit: transit(ip.Transit)}
	}
	p := &Port{e: e, cfg: cfg, gwBase: gc, reply: make([]byte, 4096), fwFlows: flow.New[wire.FlowKey, fwFlow](flow.Config[fwFlow]{Now: e.cfg.Now}),
		// A NAT flow takes two entries; a port's SNAT ranges need up
		// to one per port and protocol (OPTE's FW_FT_LIMIT).
		natFlows: flow.New[wire.FlowKey, natEntry](flow.Config[natEntry]{Limit: flow.PortLimit, Now: e.cfg.Now})}
	if err := p.checkExternal(cfg.External); err != nil {
		return nil, err
	}
	attached, err := p.normalize(cfg.Attached)
	if err != nil {
		return nil, err
	}
	p.cfg.External, p.cfg.Attached = cfg.External.clone(), nil
	p.nat.Store(compileNAT(p.cfg.External, nil, nil, 1))
	if err := p.setAttachedLocked(attached); err != nil { // p is not shared yet
		return nil, err
	}
	fw, err := rules.CompileFirewall(nil, rules.Port{VNI: cfg.VNI, MAC: rules.MAC(cfg.MAC)})
	if err != nil {
		return nil, err
	}
	p.fw.Store(fw)
	p.router.Store(rules.NewTable())
	return p, nil
}

// transit are a port's transit prefixes, which it may send from and
// receive for (the sled agent sets them both ways).
func transit(ps []netip.Prefix) []gateway.Transit {
	var out []gateway.Transit
	for _, p := range ps {
		out = append(out, gateway.Transit{Prefix: p, In: true, Out: true})
	}
	return out
}

// Config is what the port was made with, its external addresses and
// attached subnets as they are now (shared: not to be modified).
func (p *Port) Config() PortConfig {
	c := p.cfg
	c.External = p.nat.Load().ext
	c.Attached = p.AttachedSubnets()
	return c
}

// CheckFirewall reports whether SetFirewall would take rs, changing
// nothing.
func (p *Port) CheckFirewall(rs []rules.FirewallRule) error {
	_, err := rules.CompileFirewall(rs, rules.Port{VNI: p.cfg.VNI, MAC: rules.MAC(p.cfg.MAC)})
	return err
}

// SetFirewall replaces the port's firewall rules (OPTE's set_fw_rules), and
// forgets the flows the old ones allowed: they are decided again.
func (p *Port) SetFirewall(rs []rules.FirewallRule) error {
	fw, err := rules.CompileFirewall(rs, rules.Port{VNI: p.cfg.VNI, MAC: rules.MAC(p.cfg.MAC)})
	if err != nil {
		return err
	}
	p.fw.Store(fw)
	p.fwFlows.Clear()
	return nil
}

// Firewall is the port's compiled rules.
func (p *Port) Firewall() *rules.Firewall { return p.fw.Load() }

// ApplyRoutes removes del from the port's router table and adds add, in
// class (OPTE's del_router_entry, then add_router_entry). Routes that
// cannot be entries are reported; the rest is applied.
func (p *Port) ApplyRoutes(class rules.Class, del, add []rules.Route) error {
	// The port manager applies one change at a time: the swap cannot lose
	// another's entries.
	t, err := p.router.Load().Apply(class, del, add)
	p.router.Store(t)
	return err
}

// SetRoutes makes the port's entries of class exactly routes.
func (p *Port) SetRoutes(class rules.Class, routes []rules.Route) error {
	var del []rules.Route
	for _, e := range p.router.Load().Entries() {
		if e.Class == class {
			del = append(del, rules.Route{Dest: e.Dest, Target: e.Target})
		}
	}
	return p.ApplyRoutes(class, del, routes)
}

// Routes is the port's router table.
func (p *Port) Routes() []rules.Entry { return p.router.Load().Entries() }

// Flow is an allowed flow of the port's firewall, for the operator's view.
type Flow struct {
	Key     wire.FlowKey
	Dir     rules.Dir
	Rule    int
	Hits    uint64
	LastHit int64 // Unix nanoseconds
}

// Flows lists the flows the port's firewall allowed, each once (under the
// key of the direction it began in).
func (p *Port) Flows() []Flow {
	var out []Flow
	for _, e := range p.fwFlows.Entries() {
		if e.Value.mirror {
			continue
		}
		out = append(out, Flow{Key: e.Key, Dir: e.Value.dir, Rule: e.Value.rule, Hits: e.Hits, LastHit: e.LastHit.UnixNano()})
	}
	slices.SortFunc(out, func(a, b Flow) int { return compareKeys(a.Key, b.Key) })
	return out
}

func compareKeys(a, b wire.FlowKey) int {
	return cmp.Or(a.Src.Compare(b.Src), a.Dst.Compare(b.Dst), cmp.Compare(a.SrcPort, b.SrcPort), cmp.Compare(a.DstPort, b.DstPort),
		cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.ICMPType, b.ICMPType), cmp.Compare(a.EchoID, b.EchoID))
}

// Stats is what the port did.
func (p *Port) Stats() Stats { return p.stats.snapshot() }
