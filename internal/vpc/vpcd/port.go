package vpcd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/vpc/engine"
	"github.com/sled-agent/sled-agent/internal/vpc/gateway"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// IPSpec is a port's address in one family.
type IPSpec struct {
	Private netip.Addr     `json:"private"`
	Subnet  netip.Prefix   `json:"subnet"`
	Transit []netip.Prefix `json:"transit,omitempty"`
}

// ExternalSpec is a port's external addresses per IP stack, upstream's
// ExternalIpConfig (what OPTE's set_external_ips is given).
type ExternalSpec struct {
	V4 *ExternalStack `json:"v4,omitempty"`
	V6 *ExternalStack `json:"v6,omitempty"`
}

// ExternalStack is one stack's source NAT, ephemeral address and floating
// addresses.
type ExternalStack struct {
	SourceNAT   *SourceNAT   `json:"source_nat,omitempty"`
	EphemeralIP *netip.Addr  `json:"ephemeral_ip,omitempty"`
	FloatingIPs []netip.Addr `json:"floating_ips"`
}

// SourceNAT is upstream's SourceNatConfig: an address and the ports of it
// the port may use.
type SourceNAT struct {
	IP        netip.Addr `json:"ip"`
	FirstPort uint16     `json:"first_port"`
	LastPort  uint16     `json:"last_port"`
}

// PortSpec is all a port is (OPTE's create_xde with what the port manager
// sets on it next: external addresses, firewall rules and router entries).
type PortSpec struct {
	Link     Link                 `json:"link"`
	VNI      uint32               `json:"vni"`
	MAC      rules.MAC            `json:"mac"`
	IPv4     *IPSpec              `json:"ipv4,omitempty"`
	IPv6     *IPSpec              `json:"ipv6,omitempty"`
	Service  bool                 `json:"service"`
	Firewall []rules.FirewallRule `json:"firewall_rules"`
	System   []rules.Route        `json:"system_routes"`
	Custom   []rules.Route        `json:"custom_routes"`
	// ExternalIPs and EIPGateways are what the port manager's
	// set_external_ips gives OPTE: the port's external addresses, and the
	// internet gateways each may leave through (PUT /eip-gateways; an
	// address it does not name leaves through the system gateway).
	ExternalIPs ExternalSpec               `json:"external_ips"`
	EIPGateways map[netip.Addr][]uuid.UUID `json:"eip_gateways,omitempty"`
	// DHCP is what the gateway's DHCP hands the guest besides its address
	// (upstream's DhcpCfg, built from its hostname and dhcp_config).
	DHCP *DHCPSpec `json:"dhcp,omitempty"`
	// MTU is the port's MTU (1500 if 0; 8500 for an instance with jumbo
	// frames), announced in router advertisements.
	MTU uint32 `json:"mtu,omitempty"`
	// AttachedSubnets are the port's attached subnets (OPTE's
	// attach_subnet for each).
	AttachedSubnets []AttachSubnet `json:"attached_subnets,omitempty"`
}

// AttachSubnet is a subnet attached to a port (OPTE's AttachSubnetReq):
// its prefix, and whether it is a block of external addresses.
type AttachSubnet struct {
	CIDR       netip.Prefix `json:"cidr"`
	IsExternal bool         `json:"is_external"`
}

func (s PortSpec) attached() []engine.AttachedSubnet {
	var out []engine.AttachedSubnet
	for _, a := range s.AttachedSubnets {
		out = append(out, engine.AttachedSubnet{Prefix: a.CIDR, External: a.IsExternal})
	}
	return out
}

// DHCPSpec is a guest's DHCP options besides its address.
type DHCPSpec struct {
	Hostname      string       `json:"hostname"`
	HostDomain    *string      `json:"host_domain,omitempty"`
	SearchDomains []string     `json:"search_domains,omitempty"`
	DNSServers    []netip.Addr `json:"dns_servers,omitempty"`
}

func sameIdentity(a, b PortSpec) bool {
	if a.Link != b.Link || a.VNI != b.VNI || a.MAC != b.MAC || a.Service != b.Service {
		return false
	}
	same := func(x, y *IPSpec) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Private == y.Private && x.Subnet == y.Subnet && slices.Equal(x.Transit, y.Transit)
	}
	// The gateway layer is made with its DHCP options and MTU.
	return same(a.IPv4, b.IPv4) && same(a.IPv6, b.IPv6) && a.MTU == b.MTU && reflect.DeepEqual(a.DHCP, b.DHCP)
}

func (s PortSpec) engineConfig(name string) (engine.PortConfig, error) {
	c := engine.PortConfig{Name: name, VNI: s.VNI, MAC: wire.MAC(s.MAC), Service: s.Service, MTU: s.MTU}
	if d := s.DHCP; d != nil {
		var err error
		if c.DHCP, err = gateway.NewDHCP(d.Hostname, d.HostDomain, d.SearchDomains, d.DNSServers); err != nil {
			return c, fmt.Errorf("port %s: dhcp: %w", name, err)
		}
	}
	if s.IPv4 != nil {
		c.IPv4 = &engine.IPConfig{Private: s.IPv4.Private, Subnet: s.IPv4.Subnet, Transit: s.IPv4.Transit}
	}
	if s.IPv6 != nil {
		c.IPv6 = &engine.IPConfig{Private: s.IPv6.Private, Subnet: s.IPv6.Subnet, Transit: s.IPv6.Transit}
	}
	c.External = s.external()
	c.Attached = s.attached()
	return c, nil
}

// external is the engine's form of the port's external addresses.
func (s PortSpec) external() engine.External {
	stack := func(st *ExternalStack) *engine.ExternalIPs {
		if st == nil {
			return nil
		}
		x := &engine.ExternalIPs{Floating: st.FloatingIPs}
		if st.SourceNAT != nil {
			x.SNAT = &engine.SNAT{IP: st.SourceNAT.IP, First: st.SourceNAT.FirstPort, Last: st.SourceNAT.LastPort}
		}
		if st.EphemeralIP != nil {
			x.Ephemeral = *st.EphemeralIP
		}
		return x
	}
	return engine.External{IPv4: stack(s.ExternalIPs.V4), IPv6: stack(s.ExternalIPs.V6), Gateways: s.EIPGateways}
}

// attached is a port and its link: the loop that attaches to the link,
// reads what the guest sends and hands it to the engine.
type attached struct {
	d    *Daemon
	port *engine.Port
	spec PortSpec

	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	io     *netio.Port
	status string
	since  time.Time
}

// EnsurePort makes the port called name as spec says, or makes an existing
// one so: its external addresses (when they changed), rules and routes are
// replaced, and a port whose link, VNI, MAC or private addresses change is
// made again.
func (d *Daemon) EnsurePort(name string, spec PortSpec) error {
	if spec.Link.Name == "" {
		return fmt.Errorf("%w: port %s has no link", ErrBadPort, name)
	}
	// One change of the ports at a time; the lock of the map is never held
	// while a port's loop is waited for (it takes that lock to deliver).
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.mu.Lock()
	old, ok := d.ports[name]
	if ok && sameIdentity(old.spec, spec) {
		d.mu.Unlock()
		if err := setRules(old.port, spec); err != nil {
			return wrapBad(err)
		}
		d.mu.Lock()
		old.spec = spec
		d.mu.Unlock()
		return nil
	}
	delete(d.ports, name)
	d.mu.Unlock()
	if ok {
		old.stop()
		d.eng.DeletePort(name)
	}
	ec, err := spec.engineConfig(name)
	if err != nil {
		return wrapBad(err)
	}
	p, err := d.eng.CreatePort(ec)
	if err != nil {
		return wrapBad(err)
	}
	if err := setRules(p, spec); err != nil {
		d.eng.DeletePort(name)
		return wrapBad(err)
	}
	ctx, cancel := context.WithCancel(d.ctx)
	a := &attached{d: d, port: p, spec: spec, cancel: cancel, done: make(chan struct{}), status: "attaching", since: time.Now()}
	d.mu.Lock()
	d.ports[name] = a
	d.mu.Unlock()
	go a.run(ctx, spec.Link)
	return nil
}

// setRules gives p spec's external addresses, firewall rules, attached
// subnets and router entries. What the port would refuse is found before
// anything is changed; routes that cannot be entries are reported and the
// rest applied, as OPTE's router entries are one by one. The addresses
// are set only when they changed: OPTE checks every NAT flow again after
// set_external_ips.
func setRules(p *engine.Port, spec PortSpec) error {
	ext := spec.external()
	if err := errors.Join(p.CheckExternalIPs(ext), p.CheckFirewall(spec.Firewall), p.CheckAttachedSubnets(spec.attached())); err != nil {
		return err
	}
	if err := p.SetFirewall(spec.Firewall); err != nil {
		return err
	}
	if !p.ExternalIPs().Equal(ext) {
		if err := p.SetExternalIPs(ext); err != nil {
			return err
		}
	}
	if _, err := p.SetAttachedSubnets(spec.attached()); err != nil {
		return err
	}
	return errors.Join(p.SetRoutes(rules.System, spec.System), p.SetRoutes(rules.Custom, spec.Custom))
}

// DeletePort removes the port called name; it reports whether there was
// one.
func (d *Daemon) DeletePort(name string) bool {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.mu.Lock()
	a, ok := d.ports[name]
	delete(d.ports, name)
	d.mu.Unlock()
	if !ok {
		return false
	}
	a.stop()
	d.eng.DeletePort(name)
	return true
}

// Port is the port called name, for its rules and routes.
func (d *Daemon) Port(name string) (*engine.Port, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.ports[name]
	if !ok {
		return nil, false
	}
	return a.port, true
}

func (a *attached) setIO(p *netio.Port, status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.io, a.status, a.since = p, status, time.Now()
}

func (a *attached) state() (status string, since time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status, a.since
}

// run attaches the port to its link, again whenever it is lost, until ctx
// ends. (The link is the port's for its life: a.spec, which changes under
// the daemon's mu, is not read here.)
func (a *attached) run(ctx context.Context, link Link) {
	defer close(a.done)
	const first = 50 * time.Millisecond
	delay := first
	ns := link.Netns
	if ns == "" {
		ns = a.d.opts.Netns
	}
	for ctx.Err() == nil {
		p, err := netio.OpenPort(ns, link.Name)
		if err != nil {
			a.setIO(nil, "waiting for its link: "+err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, a.d.opts.MaxAttachDelay)
			continue
		}
		a.setIO(p, "attached")
		frames, err := a.read(ctx, p)
		p.Close()
		if ctx.Err() != nil {
			return
		}
		a.setIO(nil, "its link went: "+err.Error())
		if frames > 0 {
			delay = first
			continue
		}
		// Lost before a frame came: a link that is down (a packet
		// socket bound to it reads only ENETDOWN) is tried again with
		// the capped delay, not at once and again.
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, a.d.opts.MaxAttachDelay)
	}
}

// read hands what the guest sends to the engine until the link fails or
// ctx ends, and says how many frames it read. It reads the frames waiting
// in one system call, and sends what the engine encapsulated of them to
// the underlay in one.
func (a *attached) read(ctx context.Context, p *netio.Port) (int, error) {
	rs := netio.NewReads(batch, frameRoom(p.MTU()), engine.Headroom)
	ws := netio.NewWrites(batch)
	frames := 0
	for ctx.Err() == nil {
		if err := p.ReadBatch(rs); err != nil {
			return frames, err
		}
		for i := range rs.Len() {
			n, cut := rs.Size(i)
			if cut {
				continue
			}
			frames++
			r := a.d.eng.Outbound(a.port, rs.Buf(i), n)
			if r.Verdict == engine.ToUnderlay {
				if err := ws.AddDatagram(a.d.ul, r.Data, r.Dst, r.SrcPort); err != nil {
					a.d.opts.Log.Debug("vpcd: sending to the underlay", "dst", r.Dst, "err", err)
				}
				continue
			}
			a.d.dispatch(r)
		}
		a.d.writeUnderlay(ws)
	}
	return frames, ctx.Err()
}

// frameRoom is how long a frame a port's reads take on a link of MTU mtu:
// a jumbo frame at least, and the link's whole frame, with a VLAN tag. A
// guest's link sends no longer frames: its offloads are off (a tap without
// a virtio-net header, a zone's NIC made so); a longer one is read cut and
// dropped.
func frameRoom(mtu int) int { return max(9216, mtu+18) }

// write sends a frame to the guest, if the port is attached.
func (a *attached) write(frame []byte) {
	a.mu.Lock()
	p := a.io
	a.mu.Unlock()
	if p != nil {
		p.Write(frame)
	}
}

// writeBatch sends ws's frames to the guest, if the port is attached, and
// empties ws.
func (a *attached) writeBatch(ws *netio.Writes) {
	a.mu.Lock()
	p := a.io
	a.mu.Unlock()
	if p == nil {
		ws.Reset()
		return
	}
	p.WriteBatch(ws)
}

// stop ends the port's loop and lets go of its link.
func (a *attached) stop() {
	a.cancel()
	a.mu.Lock()
	if a.io != nil {
		a.io.Close() // ends a read in progress
	}
	a.mu.Unlock()
	<-a.done
}

// SetFirewall replaces the rules of the port called name (OPTE's
// set_fw_rules).
func (d *Daemon) SetFirewall(name string, rs []rules.FirewallRule) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	a, ok := d.lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoPort, name)
	}
	if err := a.port.SetFirewall(rs); err != nil {
		return wrapBad(err)
	}
	d.mu.Lock()
	a.spec.Firewall = rs
	d.mu.Unlock()
	return nil
}

// ApplyRoutes removes del from the router entries of the port called name
// and adds add, in class (OPTE's del_router_entry and add_router_entry).
func (d *Daemon) ApplyRoutes(name string, class rules.Class, del, add []rules.Route) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	a, ok := d.lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoPort, name)
	}
	err := a.port.ApplyRoutes(class, del, add)
	var sys, custom []rules.Route
	for _, e := range a.port.Routes() {
		r := rules.Route{Dest: e.Dest, Target: e.Target}
		if e.Class == rules.System {
			sys = append(sys, r)
		} else {
			custom = append(custom, r)
		}
	}
	d.mu.Lock()
	a.spec.System, a.spec.Custom = sys, custom
	d.mu.Unlock()
	return wrapBad(err)
}

func (d *Daemon) lookup(name string) (*attached, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.ports[name]
	return a, ok
}

// ErrNoPort is a change of a port the data path does not have.
var ErrNoPort = errors.New("vpcd: no such port")

// SetExternalIPs replaces the external addresses of the port called name
// and the internet gateways they leave through (OPTE's set_external_ips).
func (d *Daemon) SetExternalIPs(name string, ext ExternalSpec, gateways map[netip.Addr][]uuid.UUID) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	a, ok := d.lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoPort, name)
	}
	d.mu.Lock()
	spec := a.spec
	d.mu.Unlock()
	spec.ExternalIPs, spec.EIPGateways = ext, gateways
	e := spec.external()
	if err := a.port.CheckExternalIPs(e); err != nil {
		return wrapBad(err)
	}
	if !a.port.ExternalIPs().Equal(e) {
		if err := a.port.SetExternalIPs(e); err != nil {
			return wrapBad(err)
		}
	}
	d.mu.Lock()
	a.spec = spec
	d.mu.Unlock()
	return nil
}

// ExternalChange is a port's external addresses and their gateways, as the
// API takes them.
type ExternalChange struct {
	ExternalIPs ExternalSpec               `json:"external_ips"`
	EIPGateways map[netip.Addr][]uuid.UUID `json:"eip_gateways,omitempty"`
}

// AttachSubnet attaches a subnet to the port called name, or changes
// whether it is external (OPTE's attach_subnet); the same again changes
// nothing.
func (d *Daemon) AttachSubnet(name string, s AttachSubnet) error {
	return d.changeSubnets(name, func(p *engine.Port) error {
		_, err := p.AttachSubnet(engine.AttachedSubnet{Prefix: s.CIDR, External: s.IsExternal})
		return err
	})
}

// DetachSubnet detaches a subnet from the port called name (OPTE's
// detach_subnet); one it does not have is no error.
func (d *Daemon) DetachSubnet(name string, cidr netip.Prefix) error {
	return d.changeSubnets(name, func(p *engine.Port) error {
		_, err := p.DetachSubnet(cidr)
		return err
	})
}

func (d *Daemon) changeSubnets(name string, f func(*engine.Port) error) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	a, ok := d.lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoPort, name)
	}
	if err := f(a.port); err != nil {
		return wrapBad(err)
	}
	var now []AttachSubnet
	for _, s := range a.port.AttachedSubnets() {
		now = append(now, AttachSubnet{CIDR: s.Prefix, IsExternal: s.External})
	}
	d.mu.Lock()
	a.spec.AttachedSubnets = now
	d.mu.Unlock()
	return nil
}
