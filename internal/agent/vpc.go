package agent

import (
	"slices"
	"time"

	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// The sled's record of what Nexus told it about guest networking
// (internal/vpc/told): kept in the ledger directories beside the sled
// config, its ports derived from the VMMs and the sled config. No data
// path is given it yet: what it is told is recorded, answered as upstream
// answers, and shown (GET /agent/vpc).

// vpcSled is what the record reads of the sled.
type vpcSled struct{ a *Agent }

// activeVMMStates are the states of a VMM that has its ports: its zone,
// where its guest's NICs live, is made at registration and torn down when
// it stops, fails or is destroyed.
var activeVMMStates = []string{"starting", "running", "rebooting", "migrating", "stopping"}

// VMMs are the VMMs the agent holds a record of.
func (s vpcSled) VMMs() []told.VMM {
	var out []told.VMM
	for _, info := range s.a.vmms.List() {
		if info.Status != "known" {
			continue
		}
		v, err := told.ParseVMM(info.ID, info.Registration)
		if err != nil {
			s.a.log.Debug("a VMM's NICs cannot be read; it has no ports", "component", "vpc", "vmm", info.ID, "err", err)
			v = told.VMM{ID: info.ID}
		}
		v.Active = slices.Contains(activeVMMStates, info.State.State)
		v.Registered = registeredAt(info)
		out = append(out, v)
	}
	return out
}

// registeredAt is when a VMM was registered: its history's first line.
func registeredAt(info vmm.Info) (at time.Time) {
	if len(info.History) > 0 {
		return info.History[0].At
	}
	return at
}

// ServicePorts are the ports of the config's zones.
func (s vpcSled) ServicePorts() []told.Port { return told.ServicePorts(s.a.wanted.Load()) }

// VPC is the record of what the sled was told about guest networking.
func (a *Agent) VPC() *told.Store { return a.vpc }
