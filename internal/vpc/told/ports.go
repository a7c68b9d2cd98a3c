package told

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// The sled's ports are derived, never told: each active VMM's NICs (its
// registration's local_config.nics), each service zone's NIC (nexus,
// external_dns and boundary_ntp zones of the sled config, VNI 100) and
// each probe's. Upstream's port manager creates a VMM's ports when it is
// asked to run (instance.rs setup_propolis_zone); this agent makes a VMM's
// zone, where its guest's NICs live, when it is registered, so a VMM has
// ports from registration until it is stopped, failed or destroyed.

// PortRef names a port as upstream's port manager keys it: the NIC's id and
// kind.
type PortRef struct {
	NICID string `json:"nic_id"`
	Kind  string `json:"kind" enum:"instance,service,probe"`
}

func (r PortRef) String() string { return r.Kind + "/" + r.NICID }

// Port is one port of the sled.
type Port struct {
	NIC NIC `json:"nic"`
	// Owner is the VMM, zone or probe the port is for.
	Owner string `json:"owner"`
	// External is the port's external addresses: a VMM's from its
	// registration and what it was told since, a service zone's from the
	// sled config, a probe's from its ProbeCreate.
	External ExternalIPs `json:"external_ips"`
	// Rules are the firewall rules the port is made with when the sled
	// was told none for its VNI since (a VMM's local_config.firewall_rules;
	// none for a service; upstream's allow-all-inbound for a probe).
	Rules []FirewallRule `json:"-"`
	// Since is when the port's rules were given (a VMM's registration).
	Since time.Time `json:"-"`
	// DHCP is what the gateway's DHCP hands a VMM's guest besides its
	// address (nil: nothing else; services and probes).
	DHCP *DHCP `json:"dhcp,omitempty"`
}

// DHCP is a VMM's local_config.hostname and dhcp_config (upstream's
// DhcpConfig): what its guest's DHCP answers carry.
type DHCP struct {
	Hostname      string   `json:"hostname"`
	HostDomain    *string  `json:"host_domain"`
	SearchDomains []string `json:"search_domains"`
	DNSServers    []string `json:"dns_servers"`
}

// Ref is the port's name.
func (p Port) Ref() PortRef { return PortRef{NICID: strings.ToLower(p.NIC.ID), Kind: p.NIC.Kind.Type} }

// subnets are the port's private subnets, v4 then v6 (those it has).
func (p Port) subnets() []string {
	var out []string
	v := p.NIC.IPConfig.Value
	switch p.NIC.IPConfig.Type {
	case "v4", "v6":
		out = append(out, v.Subnet)
	case "dual_stack":
		if v.V4 != nil {
			out = append(out, v.V4.Subnet)
		}
		if v.V6 != nil {
			out = append(out, v.V6.Subnet)
		}
	}
	for i, s := range out {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			out[i] = pfx.String()
		}
	}
	return out
}

// RouterKeys are the RouterIDs the port needs (omicron illumos-utils
// opte/port.rs *_router_key): its VPC's system router, and the custom
// router of each of its subnets.
func (p Port) RouterKeys() []RouterID {
	keys := []RouterID{{VNI: p.NIC.VNI, Kind: RouterKind{Type: "system"}}}
	for _, s := range p.subnets() {
		keys = append(keys, RouterID{VNI: p.NIC.VNI, Kind: RouterKind{Type: "custom", Subnet: s}})
	}
	return keys
}

// ExternalIPs is upstream's ExternalIpConfig (a VMM's
// local_config.external_ips): per IP stack, its source NAT, ephemeral IP
// and floating IPs.
type ExternalIPs struct {
	V4 *ExternalIPStack `json:"v4,omitempty"`
	V6 *ExternalIPStack `json:"v6,omitempty"`
}

// ExternalIPStack is one IP stack's external addresses.
type ExternalIPStack struct {
	SourceNAT   *SourceNAT `json:"source_nat,omitempty"`
	EphemeralIP *string    `json:"ephemeral_ip,omitempty"`
	FloatingIPs []string   `json:"floating_ips"`
}

// SourceNAT is upstream's SourceNatConfig.
type SourceNAT struct {
	IP        string `json:"ip"`
	FirstPort uint16 `json:"first_port"`
	LastPort  uint16 `json:"last_port"`
}

func (e ExternalIPs) clone() ExternalIPs {
	b, _ := json.Marshal(e)
	var out ExternalIPs
	_ = json.Unmarshal(b, &out)
	return out
}

func (e *ExternalIPs) stack(a netip.Addr) **ExternalIPStack {
	if a.Is4() {
		return &e.V4
	}
	return &e.V6
}

// Merge is upstream's merge_existing_ip_stack_with_request: the same
// ephemeral IP again changes nothing, another one is an error (upstream's
// ImplicitEphemeralIpDetach), a floating IP joins the set.
func (e ExternalIPs) Merge(b ExternalIPBody) (ExternalIPs, error) {
	out := e.clone()
	a := netip.MustParseAddr(b.Value)
	st := out.stack(a)
	if *st == nil {
		*st = &ExternalIPStack{FloatingIPs: []string{}}
	}
	switch b.Type {
	case "ephemeral":
		switch eip := (*st).EphemeralIP; {
		case eip == nil:
			v := b.Value
			(*st).EphemeralIP = &v
		case *eip != b.Value:
			return ExternalIPs{}, fmt.Errorf("%w: cannot attach ephemeral IP %s while %s is attached (detach it first)", ErrEphemeralAttached, b.Value, *eip)
		}
	case "floating":
		if !slices.Contains((*st).FloatingIPs, b.Value) {
			(*st).FloatingIPs = append((*st).FloatingIPs, b.Value)
			slices.Sort((*st).FloatingIPs)
		}
	}
	return out, nil
}

// Prune is upstream's prune_existing_ip_stack_with_request: the address
// leaves only if it is the one attached.
func (e ExternalIPs) Prune(b ExternalIPBody) ExternalIPs {
	out := e.clone()
	a := netip.MustParseAddr(b.Value)
	st := *out.stack(a)
	if st == nil {
		return out
	}
	switch b.Type {
	case "ephemeral":
		if st.EphemeralIP != nil && *st.EphemeralIP == b.Value {
			st.EphemeralIP = nil
		}
	case "floating":
		st.FloatingIPs = slices.DeleteFunc(st.FloatingIPs, func(s string) bool { return s == b.Value })
	}
	return out
}

// VMM is what the store needs of a registered VMM.
type VMM struct {
	ID string
	// Active: the VMM has its ports now (stopped, failed and destroyed
	// VMMs have none).
	Active bool
	// Registered is when it was registered: firewall rules told for its
	// VNI before then are older than the ones its registration carries.
	Registered time.Time
	NICs       []NIC
	External   ExternalIPs
	Rules      []FirewallRule
	DHCP       *DHCP
}

// ParseVMM reads the networking of a VMM's registration (upstream's
// InstanceEnsureBody): local_config's nics, external_ips and
// firewall_rules. A registration whose NICs do not check is an error.
func ParseVMM(id string, registration []byte) (VMM, error) {
	var b struct {
		LocalConfig struct {
			NICs          []NIC          `json:"nics"`
			ExternalIPs   *ExternalIPs   `json:"external_ips"`
			FirewallRules []FirewallRule `json:"firewall_rules"`
			Hostname      string         `json:"hostname"`
			DHCPConfig    *struct {
				DNSServers    []string `json:"dns_servers"`
				HostDomain    *string  `json:"host_domain"`
				SearchDomains []string `json:"search_domains"`
			} `json:"dhcp_config"`
		} `json:"local_config"`
	}
	if err := json.Unmarshal(registration, &b); err != nil {
		return VMM{}, fmt.Errorf("VMM %s: local_config: %w", id, err)
	}
	v := VMM{ID: id, NICs: b.LocalConfig.NICs, Rules: b.LocalConfig.FirewallRules}
	for i := range v.NICs {
		if err := checkNIC(fmt.Sprintf("local_config.nics[%d]", i), &v.NICs[i]); err != nil {
			return VMM{}, fmt.Errorf("VMM %s: %w", id, err)
		}
	}
	if b.LocalConfig.ExternalIPs != nil {
		v.External = *b.LocalConfig.ExternalIPs
	}
	if lc := b.LocalConfig; lc.Hostname != "" || lc.DHCPConfig != nil {
		v.DHCP = &DHCP{Hostname: lc.Hostname}
		if c := lc.DHCPConfig; c != nil {
			v.DHCP.HostDomain, v.DHCP.SearchDomains, v.DHCP.DNSServers = c.HostDomain, c.SearchDomains, c.DNSServers
		}
	}
	return v, nil
}

// primary is the VMM's primary NIC, which upstream's external IP and
// attached subnet operations act on.
func (v VMM) primary() (NIC, bool) {
	for _, n := range v.NICs {
		if n.Primary {
			return n, true
		}
	}
	return NIC{}, false
}

// ServicePorts are the ports of a sled config's zones: upstream gives one
// to each nexus, external_dns and boundary_ntp zone (services.rs
// opte_ports_needed), with nexus's external_ip and external DNS's
// dns_address as floating IPs and boundary NTP's snat_cfg as source NAT.
func ServicePorts(cfg *sledconfig.Config) []Port {
	if cfg == nil {
		return nil
	}
	var out []Port
	for _, z := range cfg.Zones {
		t := z.ZoneType
		if t.NIC == nil {
			continue
		}
		p := Port{NIC: *t.NIC, Owner: strings.ToLower(z.ID)}
		floating := func(ip string) {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				return
			}
			st := p.External.stack(a)
			*st = &ExternalIPStack{FloatingIPs: []string{a.String()}}
		}
		switch t.Type {
		case "nexus":
			floating(t.ExternalIP)
		case "external_dns":
			if ap, err := netip.ParseAddrPort(t.DNSAddress); err == nil {
				floating(ap.Addr().String())
			}
		case "boundary_ntp":
			if t.SNAT != nil {
				if a, err := netip.ParseAddr(t.SNAT.IP); err == nil {
					*p.External.stack(a) = &ExternalIPStack{FloatingIPs: []string{},
						SourceNAT: &SourceNAT{IP: a.String(), FirstPort: t.SNAT.FirstPort, LastPort: t.SNAT.LastPort}}
				}
			}
		default:
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Port) int { return strings.Compare(a.Ref().String(), b.Ref().String()) })
	return out
}

// probePort is a probe's port: upstream makes it with one firewall rule,
// allow all inbound at priority 100 (probe_manager.rs).
func probePort(p Probe) Port {
	port := Port{NIC: p.Interface, Owner: p.ID, Rules: []FirewallRule{{
		Status: "enabled", Direction: "inbound", Targets: []NIC{}, Action: "allow", Priority: 100,
	}}}
	for _, e := range p.ExternalIPs {
		a := netip.MustParseAddr(e.IP)
		st := port.External.stack(a)
		if *st == nil {
			*st = &ExternalIPStack{FloatingIPs: []string{}}
		}
		switch e.Kind {
		case "snat":
			(*st).SourceNAT = &SourceNAT{IP: e.IP, FirstPort: e.FirstPort, LastPort: e.LastPort}
		case "ephemeral":
			ip := e.IP
			(*st).EphemeralIP = &ip
		case "floating":
			(*st).FloatingIPs = append((*st).FloatingIPs, e.IP)
		}
	}
	return port
}
