package api

import (
	"context"
	"time"

	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/nexus"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/servers"
)

// AgentInventory is this agent's own view of the sled, at GET
// /agent/inventory: what upstream's Inventory has no room for (the ledger's
// copies, every zone's state, VMMs, NAT, DDM, what the restore found) and
// short forms of the configs and reconciliations, with when the last one
// completed.
type AgentInventory struct {
	SledID             string                   `json:"sled_id"`
	SledAgentAddress   string                   `json:"sled_agent_address"`
	SledRole           string                   `json:"sled_role" enum:"gimlet,scrimlet"`
	LedgeredConfig     *ConfigSummary           `json:"ledgered_config" doc:"The ledgered config's generation and zone count; null when there is none."`
	Ledger             LedgerStatus             `json:"ledger" doc:"State of every ledger copy."`
	ReconcilerStatus   AgentReconcilerStatus    `json:"reconciler_status"`
	LastReconciliation *ReconciliationSummary   `json:"last_reconciliation" doc:"The last completed pass; null before the first."`
	ZoneStates         []ZoneSummary            `json:"zone_states" doc:"Every zone the agent manages, sorted by name."`
	VMMs               []VMMSummary             `json:"vmms" doc:"Every VMM: its zone, state and what last happened to it (details in GET /agent/vmms)."`
	VMMHost            VMMHost                  `json:"vmm_host" doc:"How this sled runs guests: the accelerator chosen and why, and the VMM reservoir with what its VMMs hold."`
	NAT                *nat.Status              `json:"nat" doc:"This sled's service NAT entries (VNI 100; instances' entries are left alone) on every switch: how the switches were found, each switch's slot, last success and error, entries wanted and present, conflicts, zones ignored for a NIC outside VNI 100; null when the agent manages none."`
	DDM                *DDMStatus               `json:"ddm" doc:"The routing prefixes this sled originates in DDM: desired, last observed, last success and error, recent changes; null when the agent manages none."`
	Restore            reconciler.RestoreStatus `json:"restore" doc:"What the agent found at start-up and did about it (as GET /agent/restore)."`
	Storage            *storage.Status          `json:"storage" doc:"The storage reconciler's status: every configured disk's and dataset's result, attempts, next retry and call in flight; the disks, pools and datasets last observed; the orphaned datasets kept (with why) and the last destroyed; null when the agent manages no storage."`
	NTPServers         *servers.Status          `json:"ntp_servers" doc:"The rack's boundary NTP servers as internal DNS last named them, and what the agent set in each running internal NTP zone; null when the agent does not follow them (no --dns-server, or not the linux runtime)."`
	Nexus              *nexus.Status            `json:"nexus" doc:"Where the sled stands with Nexus: how Nexus is found, the sled record Nexus holds (as last learned) with the last success and error and any request outstanding, and where each VMM's state stands (the newest, the generation Nexus took, retries, refusals); null when Nexus is told nothing (no --nexus, no --dns-server)."`
	Probes             *probes.Status           `json:"probes" doc:"The probes' zones (PUT /probes): each probe's zone, where it is, its state and last error; null when the agent makes none (no --vpc-data-path, or not the linux runtime)."`
	TimeSync           *timesync.Status         `json:"timesync" doc:"Whether the sled's time is synchronized, as its NTP zone's ntp-admin last said: the reason when it is not, the source, stratum and offset, since when, and when it first was; zones that need synchronized time start only while it is. Null when the agent does not check."`
}

// NTPServers is the follower of the boundary NTP servers, as inventory
// sees it.
type NTPServers interface {
	Status() servers.Status
}

// Nexus is the agent's link to Nexus, as inventory sees it.
type Nexus interface {
	Status() nexus.Status
}

// Probes is the maker of the probes' zones, as inventory sees it.
type Probes interface {
	Status() probes.Status
}

// TimeSync is the time-sync watcher, as inventory sees it.
type TimeSync interface {
	Status() timesync.Status
}

// VMMHost is how the sled runs guests.
type VMMHost struct {
	Accelerator    string `json:"accelerator" doc:"kvm or tcg (QEMU's emulation); empty with the sim runtime, whose guests are simulated."`
	AcceleratorWhy string `json:"accelerator_why,omitempty" doc:"Why that accelerator: what was found of hardware virtualisation."`
	ReservoirBytes uint64 `json:"reservoir_bytes" doc:"The VMM reservoir, guests' memory (inventory's reservoir_size)."`
	ReservoirUsed  uint64 `json:"reservoir_used_bytes" doc:"What the registered VMMs hold of it."`
}

// Reservoir is the VMM reservoir's account.
type Reservoir interface {
	Size() uint64
	Used() uint64
}

// ConfigSummary names a config by its generation and size.
type ConfigSummary struct {
	Generation uint64 `json:"generation"`
	Zones      int    `json:"zones"`
}

// AgentReconcilerStatus is the reconciler's phase and timings, naming the
// config being realised by its generation.
type AgentReconcilerStatus struct {
	Status      string     `json:"status" enum:"not_yet_run,running,idle"`
	Generation  uint64     `json:"generation,omitempty" doc:"Generation of the config being realised (running)."`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	RunningFor  *Duration  `json:"running_for,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	RanFor      *Duration  `json:"ran_for,omitempty"`
	Passes      uint64     `json:"passes" doc:"Passes completed since the agent started."`
}

// ReconciliationSummary is the last completed pass: the generation it
// realised, when it completed, and every zone's result (as upstream's
// last_reconciliation.zones).
type ReconciliationSummary struct {
	Generation  uint64                  `json:"generation"`
	CompletedAt time.Time               `json:"completed_at" doc:"When the pass completed."`
	Zones       map[string]ResultStatus `json:"zones"`
}

type agentInventoryOutput struct {
	Body *AgentInventory
}

func (s *Server) agentInventory(context.Context, *struct{}) (*agentInventoryOutput, error) {
	now := time.Now()
	id := s.deps.Identity
	inv := &AgentInventory{
		SledID:           id.SledID,
		SledAgentAddress: id.Address,
		SledRole:         id.Role,
		Ledger:           LedgerStatus{Problem: s.deps.Configs.LoadProblem(), Copies: []LedgerCopy{}},
		ZoneStates:       []ZoneSummary{},
		VMMs:             []VMMSummary{},
		Restore:          s.deps.Reconciler.Restore(),
	}
	if cfg := s.deps.Configs.Current(); cfg != nil {
		inv.LedgeredConfig = &ConfigSummary{Generation: cfg.Generation, Zones: len(cfg.Zones)}
	}
	for _, c := range s.deps.Configs.CopyStatus() {
		inv.Ledger.Copies = append(inv.Ledger.Copies, LedgerCopy{Path: c.Path, State: string(c.State), Generation: c.Generation, Error: c.Err})
	}
	st := s.deps.Reconciler.Status()
	pending := false
	if st.Last != nil {
		if e, err := s.storageMembers(st.Last.Config); err == nil {
			pending = e.pending
		}
	}
	rs := reconcilerStatus(st, pending, now)
	inv.ReconcilerStatus = AgentReconcilerStatus{
		Status: rs.Status, StartedAt: rs.StartedAt, RunningFor: rs.RunningFor,
		CompletedAt: rs.CompletedAt, RanFor: rs.RanFor, Passes: st.Passes,
	}
	if rs.Config != nil {
		inv.ReconcilerStatus.Generation = rs.Config.Generation
	}
	if st.Last != nil {
		sum := &ReconciliationSummary{CompletedAt: st.Last.CompletedAt, Zones: map[string]ResultStatus{}}
		if zones, _, err := s.zoneResults(st.Last); err == nil {
			sum.Zones = zones
		}
		if st.Last.Config != nil {
			sum.Generation = st.Last.Config.Generation
		}
		inv.LastReconciliation = sum
	}
	if s.deps.VMMs != nil {
		for _, v := range s.deps.VMMs.List() {
			sum := VMMSummary{ID: v.ID, Status: v.Status, Zone: v.Zone, State: v.State, Detail: v.Detail}
			if n := len(v.History); n > 0 {
				sum.LastEvent = &v.History[n-1]
			}
			inv.VMMs = append(inv.VMMs, sum)
		}
	}
	inv.VMMHost = VMMHost{Accelerator: s.deps.Accel, AcceleratorWhy: s.deps.AccelWhy}
	if r := s.deps.Reservoir; r != nil {
		inv.VMMHost.ReservoirBytes, inv.VMMHost.ReservoirUsed = r.Size(), r.Used()
	}
	if s.deps.NAT != nil {
		st := s.deps.NAT.Status()
		inv.NAT = &st
	}
	if s.deps.Storage != nil {
		st := s.deps.Storage.Status()
		inv.Storage = &st
	}
	if s.deps.Nexus != nil {
		st := s.deps.Nexus.Status()
		inv.Nexus = &st
	}
	if s.deps.NTPServers != nil {
		st := s.deps.NTPServers.Status()
		inv.NTPServers = &st
	}
	if s.deps.Probes != nil {
		st := s.deps.Probes.Status()
		inv.Probes = &st
	}
	if s.deps.TimeSync != nil {
		st := s.deps.TimeSync.Status()
		inv.TimeSync = &st
	}
	if s.deps.Prefixes != nil {
		inv.DDM = &DDMStatus{URL: s.deps.DDMURL, Status: s.deps.Prefixes.Status()}
	}
	for _, zs := range s.deps.Reconciler.Zones() {
		inv.ZoneStates = append(inv.ZoneStates, summary(zs))
	}
	return &agentInventoryOutput{Body: inv}, nil
}
