package vpcd

import (
	"context"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// Local is a data path in this process, with a Client's methods.
type Local struct{ D *Daemon }

// Boot names the data path's run.
func (l Local) Boot(context.Context) (string, error) { return l.D.Boot(), nil }

// State is the data path's whole state.
func (l Local) State(context.Context) (State, error) { return l.D.State(), nil }

// EnsurePort makes or changes the port called name.
func (l Local) EnsurePort(_ context.Context, name string, spec PortSpec) error {
	return l.D.EnsurePort(name, spec)
}

// DeletePort removes the port called name.
func (l Local) DeletePort(_ context.Context, name string) error {
	l.D.DeletePort(name)
	return nil
}

// SetFirewall replaces the firewall rules of the port called name.
func (l Local) SetFirewall(_ context.Context, name string, rs []rules.FirewallRule) error {
	return l.D.SetFirewall(name, rs)
}

// ApplyRoutes changes the router entries of the port called name.
func (l Local) ApplyRoutes(_ context.Context, name string, c RouteChange) error {
	class := rules.System
	if c.Class == "custom" {
		class = rules.Custom
	}
	return l.D.ApplyRoutes(name, class, c.Del, c.Add)
}

// SetV2P sets a mapping.
func (l Local) SetV2P(_ context.Context, m V2P) error { return l.D.SetV2P(m) }

// ClearV2P clears a mapping.
func (l Local) ClearV2P(_ context.Context, m V2P) error {
	l.D.ClearV2P(m)
	return nil
}

// SetExternalIPs replaces the external addresses of the port called name.
func (l Local) SetExternalIPs(_ context.Context, name string, ch ExternalChange) error {
	return l.D.SetExternalIPs(name, ch.ExternalIPs, ch.EIPGateways)
}

// SetV2B makes the boundary table want.
func (l Local) SetV2B(_ context.Context, want []mappings.Boundary) error {
	m := map[netip.Prefix][]mappings.TEP{}
	for _, b := range want {
		m[b.Prefix] = append(m[b.Prefix], b.TEPs...)
	}
	_, err := l.D.eng.V2B().Replace(m)
	return wrapBad(err)
}

// AttachSubnet attaches a subnet to the port called name.
func (l Local) AttachSubnet(_ context.Context, name string, s AttachSubnet) error {
	return l.D.AttachSubnet(name, s)
}

// DetachSubnet detaches a subnet from the port called name.
func (l Local) DetachSubnet(_ context.Context, name string, s DetachSubnet) error {
	return l.D.DetachSubnet(name, s.CIDR)
}
