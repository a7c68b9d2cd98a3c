package vpcd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/vpc/engine"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// V2P is one virtual-to-physical mapping (PUT /v2p's body, upstream's
// VirtualNetworkInterfaceHost).
type V2P struct {
	VirtualIP      netip.Addr `json:"virtual_ip"`
	VirtualMAC     rules.MAC  `json:"virtual_mac"`
	PhysicalHostIP netip.Addr `json:"physical_host_ip"`
	VNI            uint32     `json:"vni"`
}

// SetV2P maps m's address in its VNI to its guest's MAC and sled.
func (d *Daemon) SetV2P(m V2P) error {
	_, err := d.eng.V2P().Set(m.VNI, m.VirtualIP, mappings.Phys{MAC: m.VirtualMAC, Sled: m.PhysicalHostIP})
	return wrapBad(err)
}

// ClearV2P removes the mapping of m's address in its VNI.
func (d *Daemon) ClearV2P(m V2P) { d.eng.V2P().Del(m.VNI, m.VirtualIP) }

// PortState is one port as the operator sees it: what it is, whether it
// is attached to its link, its rules, routes and flows, and what it did.
type PortState struct {
	Name     string               `json:"name"`
	Spec     PortSpec             `json:"spec"`
	Status   string               `json:"status"`
	Since    time.Time            `json:"since"`
	Inbound  []string             `json:"firewall_inbound"`
	Outbound []string             `json:"firewall_outbound"`
	Routes   []string             `json:"routes"`
	Flows    []string             `json:"flows"`
	NATFlows []string             `json:"nat_flows"`
	Stats    engine.Stats         `json:"stats"`
	Rules    []rules.FirewallRule `json:"-"`
}

// State is the whole data path as the operator sees it.
type State struct {
	// Boot names this run of the data path.
	Boot      string              `json:"boot"`
	Underlay  netip.Addr          `json:"underlay"`
	Ports     []PortState         `json:"ports"`
	V2P       []V2P               `json:"v2p"`
	V2B       []mappings.Boundary `json:"v2b"`
	Unmatched engine.Stats        `json:"unmatched"`
}

// State is what the data path holds now.
func (d *Daemon) State() State {
	st := State{Boot: d.boot, Underlay: d.opts.Underlay, Unmatched: d.eng.Unmatched(), V2B: d.eng.V2B().Dump()}
	for _, m := range d.eng.V2P().Dump() {
		st.V2P = append(st.V2P, V2P{VirtualIP: m.VirtualIP, VirtualMAC: rules.MAC(m.MAC), PhysicalHostIP: m.Sled, VNI: m.VNI})
	}
	d.mu.Lock()
	ports := make([]*attached, 0, len(d.ports))
	specs := make([]PortSpec, 0, len(d.ports))
	for _, a := range d.ports {
		ports = append(ports, a)
		specs = append(specs, a.spec) // changes under mu
	}
	d.mu.Unlock()
	for i, a := range ports {
		status, since := a.state()
		ps := PortState{Name: a.port.Config().Name, Spec: specs[i], Status: status, Since: since, Stats: a.port.Stats()}
		fw := a.port.Firewall()
		for _, r := range fw.Rules(rules.In) {
			ps.Inbound = append(ps.Inbound, r.String())
		}
		for _, r := range fw.Rules(rules.Out) {
			ps.Outbound = append(ps.Outbound, r.String())
		}
		for _, e := range a.port.Routes() {
			ps.Routes = append(ps.Routes, e.String())
		}
		for _, f := range a.port.Flows() {
			ps.Flows = append(ps.Flows, fmt.Sprintf("%s %s rule %d hits %d", f.Dir, flowString(f), f.Rule, f.Hits))
		}
		for _, f := range a.port.NATFlows() {
			ps.NATFlows = append(ps.NATFlows, fmt.Sprintf("%s %s as %s hits %d", f.Kind, flowString(engine.Flow{Key: f.Out}), f.External, f.Hits))
		}
		st.Ports = append(st.Ports, ps)
	}
	slices.SortFunc(st.Ports, func(a, b PortState) int { return strings.Compare(a.Name, b.Name) })
	return st
}

func flowString(f engine.Flow) string {
	k := f.Key
	return fmt.Sprintf("proto %d %s:%d → %s:%d", k.Proto, k.Src, k.SrcPort, k.Dst, k.DstPort)
}
