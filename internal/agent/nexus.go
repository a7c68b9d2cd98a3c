package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/sled-agent/sled-agent/internal/dns"
	"github.com/sled-agent/sled-agent/internal/nexus"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// nexusLink is how the agent speaks first to Nexus: its registration and
// its VMMs' states (internal/nexus).
type nexusLink struct {
	foundBy   string
	client    *nexus.Client
	registrar *nexus.Registrar
	publisher *nexus.Publisher
}

// newNexus prepares the link to Nexus, found through --nexus, else
// internal DNS through r (the resolver of --dns-server, nil without);
// with neither, the agent tells Nexus nothing (nil). What the sled tells
// of itself is read when the registrar runs, once the agent listens.
func newNexus(cfg Config, a *Agent, r *dns.Resolver) (*nexusLink, error) {
	l := &nexusLink{}
	var finder nexus.Finder
	switch {
	case len(cfg.Nexus) > 0:
		addrs, err := parseAddrPorts("nexus", cfg.Nexus)
		if err != nil {
			return nil, err
		}
		finder, l.foundBy = nexus.Static(addrs), "--nexus"
	case r != nil:
		finder, l.foundBy = nexus.DNS{Resolver: r}, "dns"
	default:
		a.log.Info("Nexus is not told of this sled: neither --nexus nor --dns-server is given", "component", "nexus")
		return nil, nil
	}
	log := a.log.With("component", "nexus")
	l.client = nexus.NewClient(finder, 0)
	l.publisher = nexus.NewPublisher(l.client, nexus.PublisherOptions{Log: log})
	l.registrar = nexus.NewRegistrar(l.client, cfg.SledID, a.sledAgentInfo, nexus.RegistrarOptions{Log: log})
	return l, nil
}

// run registers the sled and publishes VMM states until ctx ends.
func (l *nexusLink) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { l.registrar.Run(ctx) })
	wg.Go(func() { l.publisher.Run(ctx) })
	wg.Wait()
}

// Status is what the agent knows of Nexus.
func (l *nexusLink) Status() nexus.Status {
	st := nexus.Status{FoundBy: l.foundBy, Registration: l.registrar.Status(), VMMStates: l.publisher.Status()}
	if a := l.client.Last(); a.IsValid() {
		st.LastAnswered = a.String()
	}
	return st
}

// VMMState hands a VMM's new state to Nexus (vmm.States).
func (l *nexusLink) VMMState(id string, st vmm.RuntimeState) {
	l.publisher.Publish(id, nexus.VmmRuntimeState{Gen: st.Gen, State: st.State, TimeUpdated: st.TimeUpdated})
}

// VMMForgotten drops a VMM once its last state is delivered (vmm.States).
func (l *nexusLink) VMMForgotten(id string) { l.publisher.Forget(id) }

// sledAgentInfo is what the sled tells Nexus of itself: host truth, as
// inventory reports it.
func (a *Agent) sledAgentInfo() nexus.SledAgentInfo {
	id := a.identity
	hw := id.Hardware
	return nexus.SledAgentInfo{
		SAAddress: id.Address,
		// No repo depot is served here (upstream's is at 12348): port 0
		// says so rather than name a port nothing answers on.
		RepoDepotPort:         0,
		Role:                  id.Role,
		Baseboard:             nexus.Baseboard{Serial: hw.Baseboard.Serial, Part: hw.Baseboard.Part, Revision: hw.Baseboard.Revision},
		CPUFamily:             string(hw.Family()),
		UsableHardwareThreads: hw.HardwareThreads,
		UsablePhysicalRAM:     hw.PhysicalRAM,
		ReservoirSize:         a.reservoir.Size(),
	}
}

// parseAddrPorts parses a repeatable "[addr]:port" flag.
func parseAddrPorts(flag string, list []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range list {
		ap, err := netip.ParseAddrPort(s)
		if err != nil || ap.Port() == 0 {
			return nil, fmt.Errorf("%s %q: want an address and port, like [fd00:1122:3344:1::1]:53", flag, s)
		}
		out = append(out, ap)
	}
	return out, nil
}
