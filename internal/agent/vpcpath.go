package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm/service"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
	"github.com/sled-agent/sled-agent/internal/vpc/vpcd"
)

// vpcPath is the data path the record of what the sled was told drives
// (told.DataPath): the sled's vpcd, given each port with the link it is
// (a guest's tap in its VMM's zone, a service zone's NIC's host end), its
// rules and routes, its external addresses and attached subnets, and the
// sled's v2p mappings.
type vpcPath struct {
	a *Agent
	d dataPathAPI
}

// dataPathAPI is the data path as the agent drives it: in this process
// (vpcd.Local) or a service of its own (vpcd.Client).
type dataPathAPI interface {
	Boot(ctx context.Context) (string, error)
	State(ctx context.Context) (vpcd.State, error)
	EnsurePort(ctx context.Context, name string, spec vpcd.PortSpec) error
	DeletePort(ctx context.Context, name string) error
	SetFirewall(ctx context.Context, name string, rs []rules.FirewallRule) error
	ApplyRoutes(ctx context.Context, name string, c vpcd.RouteChange) error
	SetExternalIPs(ctx context.Context, name string, ch vpcd.ExternalChange) error
	AttachSubnet(ctx context.Context, name string, s vpcd.AttachSubnet) error
	DetachSubnet(ctx context.Context, name string, s vpcd.DetachSubnet) error
	SetV2B(ctx context.Context, want []mappings.Boundary) error
	SetV2P(ctx context.Context, m vpcd.V2P) error
	ClearV2P(ctx context.Context, m vpcd.V2P) error
}

var _ told.DataPath = vpcPath{}

// portName is the data path's name of a port: its kind and NIC id.
func portName(ref told.PortRef) string { return ref.Kind + "-" + strings.ToLower(ref.NICID) }

// link is where the port's frames are: a VMM's NIC's tap (vn<mac>) in the
// VMM's zone with the linux runtime, in the agent's namespace with the sim
// runtime (a stand-in guest's); a service zone's or a probe's zone's NIC's
// host end, named alike from the sled's tag and the zone's or probe's id.
func (v vpcPath) link(p told.Port, mac [6]byte) vpcd.Link {
	switch p.NIC.Kind.Type {
	case "service", "probe":
		_, nic := zonenet.LinkNames(v.a.cfg.ZoneTag, p.Owner)
		if v.a.cfg.ZoneTag == "" {
			_, nic = zonenet.LinkNames(DefaultZoneTag, p.Owner)
		}
		return vpcd.Link{Name: nic}
	default:
		tap := spec.VNICName(mac[:])
		if v.a.cfg.Runtime != "linux" {
			return vpcd.Link{Name: tap}
		}
		return vpcd.Link{Netns: zonenet.NetnsPath(v.a.cfg.NetnsPrefix + service.ZoneName(p.Owner)), Name: tap}
	}
}

// portSpec is what the data path makes of a port.
func (v vpcPath) portSpec(pc told.PortConfig) (vpcd.PortSpec, error) {
	nic := pc.Port.NIC
	mac, err := rules.ParseMAC(nic.MAC)
	if err != nil {
		return vpcd.PortSpec{}, err
	}
	s := vpcd.PortSpec{Link: v.link(pc.Port, mac), VNI: nic.VNI, MAC: mac, Service: nic.Kind.Type == "service"}
	s.IPv4, s.IPv6, err = ipSpecs(nic.IPConfig)
	if err != nil {
		return s, err
	}
	if s.Firewall, err = convert[[]rules.FirewallRule](pc.Rules); err != nil {
		return s, fmt.Errorf("firewall rules: %w", err)
	}
	if s.System, err = convert[[]rules.Route](pc.System); err != nil {
		return s, fmt.Errorf("system routes: %w", err)
	}
	if s.Custom, err = convert[[]rules.Route](pc.Custom); err != nil {
		return s, fmt.Errorf("custom routes: %w", err)
	}
	ch, err := external(pc.Port.External, pc.Gateways)
	if err != nil {
		return s, err
	}
	s.ExternalIPs, s.EIPGateways = ch.ExternalIPs, ch.EIPGateways
	if d := pc.Port.DHCP; d != nil {
		if s.DHCP, err = convert[*vpcd.DHCPSpec](d); err != nil {
			return s, fmt.Errorf("dhcp: %w", err)
		}
	}
	// The record's attached subnets, those of a family the port has an
	// address in (upstream's port manager leaves the others out when it
	// makes a port: build_opte_ipv4_config, build_opte_ipv6_config).
	for _, a := range pc.Subnets {
		x, err := attachedSubnet(a)
		if err != nil {
			return s, err
		}
		if x.CIDR.Addr().Is4() && s.IPv4 != nil || x.CIDR.Addr().Is6() && s.IPv6 != nil {
			s.AttachedSubnets = append(s.AttachedSubnets, x)
		}
	}
	return s, nil
}

// attachedSubnet is an attached subnet as the data path takes it.
func attachedSubnet(a told.AttachedSubnet) (vpcd.AttachSubnet, error) {
	p, err := netip.ParsePrefix(a.Subnet)
	if err != nil {
		return vpcd.AttachSubnet{}, fmt.Errorf("attached subnet: %w", err)
	}
	return vpcd.AttachSubnet{CIDR: p, IsExternal: a.Kind == "external"}, nil
}

// external is a port's external addresses and their gateways as the data
// path takes them.
func external(ips told.ExternalIPs, gateways map[string][]string) (vpcd.ExternalChange, error) {
	var ch vpcd.ExternalChange
	var err error
	if ch.ExternalIPs, err = convert[vpcd.ExternalSpec](ips); err != nil {
		return ch, fmt.Errorf("external addresses: %w", err)
	}
	if len(gateways) > 0 {
		if ch.EIPGateways, err = convert[map[netip.Addr][]uuid.UUID](gateways); err != nil {
			return ch, fmt.Errorf("internet gateways: %w", err)
		}
	}
	return ch, nil
}

// convert reads a value of the record's upstream shape as the data path's
// type of the same shape.
func convert[T any](v any) (T, error) {
	var out T
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

// ipSpecs are a NIC's private addresses.
func ipSpecs(c sledconfig.IPConfig) (v4, v6 *vpcd.IPSpec, err error) {
	one := func(ip, subnet string, transit []string) (*vpcd.IPSpec, error) {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, err
		}
		p, err := netip.ParsePrefix(subnet)
		if err != nil {
			return nil, err
		}
		s := &vpcd.IPSpec{Private: a, Subnet: p}
		for _, t := range transit {
			tp, err := netip.ParsePrefix(t)
			if err != nil {
				return nil, err
			}
			s.Transit = append(s.Transit, tp)
		}
		return s, nil
	}
	switch c.Type {
	case "v4":
		v4, err = one(c.Value.IP, c.Value.Subnet, c.Value.TransitIPs)
	case "v6":
		v6, err = one(c.Value.IP, c.Value.Subnet, c.Value.TransitIPs)
	case "dual_stack":
		if c.Value.V4 != nil {
			if v4, err = one(c.Value.V4.IP, c.Value.V4.Subnet, c.Value.V4.TransitIPs); err != nil {
				return nil, nil, err
			}
		}
		if c.Value.V6 != nil {
			v6, err = one(c.Value.V6.IP, c.Value.V6.Subnet, c.Value.V6.TransitIPs)
		}
	default:
		err = fmt.Errorf("ip_config type %q", c.Type)
	}
	return v4, v6, err
}

func (v vpcPath) CreatePort(ctx context.Context, pc told.PortConfig) error {
	s, err := v.portSpec(pc)
	if err != nil {
		return fmt.Errorf("port %s: %w", pc.Port.Ref(), err)
	}
	return v.d.EnsurePort(ctx, portName(pc.Port.Ref()), s)
}

func (v vpcPath) DeletePort(ctx context.Context, ref told.PortRef) error {
	return v.d.DeletePort(ctx, portName(ref))
}

func (v vpcPath) SetV2P(ctx context.Context, m told.V2P) error {
	x, err := convert[vpcd.V2P](m)
	if err != nil {
		return err
	}
	return v.d.SetV2P(ctx, x)
}

func (v vpcPath) ClearV2P(ctx context.Context, m told.V2P) error {
	x, err := convert[vpcd.V2P](m)
	if err != nil {
		return err
	}
	return v.d.ClearV2P(ctx, x)
}

func (v vpcPath) SetFirewallRules(ctx context.Context, ref told.PortRef, rs []told.FirewallRule) error {
	x, err := convert[[]rules.FirewallRule](rs)
	if err != nil {
		return err
	}
	return v.d.SetFirewall(ctx, portName(ref), x)
}

func (v vpcPath) route(r told.Route) (rules.Route, error) { return convert[rules.Route](r) }

func class(c told.RouterClass) string {
	if c == told.ClassSystem {
		return "system"
	}
	return "custom"
}

func (v vpcPath) AddRouterEntry(ctx context.Context, ref told.PortRef, c told.RouterClass, r told.Route) error {
	x, err := v.route(r)
	if err != nil {
		return err
	}
	return v.d.ApplyRoutes(ctx, portName(ref), vpcd.RouteChange{Class: class(c), Add: []rules.Route{x}})
}

func (v vpcPath) DelRouterEntry(ctx context.Context, ref told.PortRef, c told.RouterClass, r told.Route) error {
	x, err := v.route(r)
	if err != nil {
		return err
	}
	return v.d.ApplyRoutes(ctx, portName(ref), vpcd.RouteChange{Class: class(c), Del: []rules.Route{x}})
}

func (v vpcPath) SetExternalIPs(ctx context.Context, ref told.PortRef, ips told.ExternalIPs, gateways map[string][]string) error {
	ch, err := external(ips, gateways)
	if err != nil {
		return err
	}
	return v.d.SetExternalIPs(ctx, portName(ref), ch)
}

// AttachSubnet attaches a subnet to the port (OPTE's attach_subnet); one
// of a family the port has no address in is refused, as OPTE refuses it.
func (v vpcPath) AttachSubnet(ctx context.Context, ref told.PortRef, s told.AttachedSubnet) error {
	x, err := attachedSubnet(s)
	if err != nil {
		return err
	}
	return v.d.AttachSubnet(ctx, portName(ref), x)
}

// DetachSubnet detaches one (OPTE's detach_subnet); one not attached is no
// error.
func (v vpcPath) DetachSubnet(ctx context.Context, ref told.PortRef, subnet string) error {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return fmt.Errorf("attached subnet: %w", err)
	}
	return v.d.DetachSubnet(ctx, portName(ref), vpcd.DetachSubnet{CIDR: p})
}

// vpcSyncPeriod is how often the data path's ports are made the sled's
// when nothing asked sooner: VMMs start and stop, zones come and go.
const vpcSyncPeriod = time.Second

// runVPC keeps the data path's ports the sled's until ctx ends: every
// second, and at once when the data path restarted (it lost what it was
// given, and is given it all again; restarted tells runV2B). A data path
// in this process also serves its API on <run-dir>/vpcd.sock, and stops
// with the agent; one run as a service of its own (the linux runtime) is
// started if it is not running, and outlives the agent.
func (a *Agent) runVPC(ctx context.Context, restarted chan<- struct{}) {
	var served chan struct{}
	if a.vpcd != nil {
		defer a.vpcd.Close()
		served = make(chan struct{})
		go func() {
			defer close(served)
			if err := a.vpcd.Serve(ctx, a.vpcSocket()); err != nil && ctx.Err() == nil {
				a.log.Error("the VPC data path's API", "component", "vpcd", "socket", a.vpcSocket(), "err", err)
			}
		}()
	}
	t := time.NewTicker(vpcSyncPeriod)
	defer t.Stop()
	var boot string
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		b, err := a.vpcAPI.Boot(sctx)
		if err != nil && a.vpcd == nil && ctx.Err() == nil {
			// The service is not there: start it (runsv restarts it
			// when it dies; this covers runsv itself).
			if serr := a.startVPCService(sctx); serr != nil {
				a.log.Warn("starting the VPC data path", "component", "vpcd", "err", serr)
			}
			b, err = a.vpcAPI.Boot(sctx)
		}
		if err == nil && b != boot {
			if boot != "" {
				a.log.Warn("the VPC data path restarted: giving it everything again", "component", "vpcd")
				select {
				case restarted <- struct{}{}:
				default: // told already
				}
			}
			if err := a.vpc.DataPathRestarted(sctx); err == nil {
				boot = b
			}
		}
		if err == nil {
			if err := a.vpc.Sync(sctx); err != nil && ctx.Err() == nil {
				a.log.Warn("making the data path's ports the sled's", "component", "vpcd", "err", err)
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			if served != nil {
				<-served
			}
			return
		case <-t.C:
		}
	}
}

// vpcSocket is where the data path serves its API.
func (a *Agent) vpcSocket() string { return VPCSocket(a.cfg) }

// VPCSocket is where the data path of an agent of cfg serves its API.
func VPCSocket(cfg Config) string {
	return filepath.Join(cmp.Or(cfg.RunDir, DefaultRunDir), cmp.Or(cfg.ZoneTag, DefaultZoneTag)+"-vpcd.sock")
}

// v2bPeriod is how often the switches' tunnel endpoints are read from the
// routing daemon (ddmd programs OPTE when they change; this polls).
const v2bPeriod = 10 * time.Second

// runV2B keeps the data path's boundary table what the routing daemon
// learned of the switches' tunnel endpoints (ddmd's sys.rs on illumos),
// until ctx ends.
func (a *Agent) runV2B(ctx context.Context, restarted <-chan struct{}) {
	keepV2B(ctx, a.log, a.ddm, a.vpcAPI, restarted)
}

// tunnelEndpoints is the routing daemon as keepV2B reads it.
type tunnelEndpoints interface {
	TunnelEndpoints(ctx context.Context) ([]ddm.TunnelRoute, error)
}

// v2bSetter is the data path as keepV2B gives it the boundary table.
type v2bSetter interface {
	SetV2B(ctx context.Context, want []mappings.Boundary) error
}

// keepV2B gives dp the boundary table of what src learned every
// v2bPeriod (every second while that fails), and at once when restarted
// says the data path came back with an empty table, until ctx ends.
func keepV2B(ctx context.Context, log *slog.Logger, src tunnelEndpoints, dp v2bSetter, restarted <-chan struct{}) {
	var last []mappings.Boundary
	for {
		// A failure is tried again sooner: the data path may be starting.
		next := time.Second
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		routes, err := src.TunnelEndpoints(rctx)
		if err == nil {
			want := v2bFrom(routes)
			// Given again every time: a restarted data path has none.
			if err := dp.SetV2B(rctx, want); err != nil {
				if ctx.Err() == nil {
					log.Debug("giving the data path the switches' tunnel endpoints", "component", "vpcd", "err", err)
				}
			} else {
				next = v2bPeriod
				if !slices.EqualFunc(last, want, sameBoundary) {
					log.Info("the switches' tunnel endpoints", "component", "vpcd", "v2b", want)
					last = want
				}
			}
		} else if ctx.Err() == nil {
			log.Debug("reading the switches' tunnel endpoints", "component", "vpcd", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-restarted:
		}
	}
}

// v2bFrom is the boundary table of what the routing daemon learned: per
// overlay prefix its endpoints, those of a metric above zero only if there
// are any (ddmd's effective set).
func v2bFrom(routes []ddm.TunnelRoute) []mappings.Boundary {
	best := map[netip.Prefix][]ddm.TunnelOrigin{}
	for _, r := range routes {
		p := r.Origin.OverlayPrefix.Masked()
		best[p] = append(best[p], r.Origin)
	}
	var out []mappings.Boundary
	for _, p := range slices.SortedFunc(maps.Keys(best), func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	}) {
		origins := best[p]
		if slices.ContainsFunc(origins, func(o ddm.TunnelOrigin) bool { return o.Metric > 0 }) {
			origins = slices.DeleteFunc(origins, func(o ddm.TunnelOrigin) bool { return o.Metric == 0 })
		}
		b := mappings.Boundary{Prefix: p}
		for _, o := range origins {
			t := mappings.TEP{Addr: o.BoundaryAddr, VNI: o.VNI}
			if !slices.Contains(b.TEPs, t) {
				b.TEPs = append(b.TEPs, t)
			}
		}
		slices.SortFunc(b.TEPs, func(x, y mappings.TEP) int { return x.Addr.Compare(y.Addr) })
		out = append(out, b)
	}
	return out
}

func sameBoundary(a, b mappings.Boundary) bool {
	return a.Prefix == b.Prefix && slices.Equal(a.TEPs, b.TEPs)
}
