package api

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/sled-agent/sled-agent/internal/prefix"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

var jsonMarshal = json.Marshal

// ReconcilerStatus is upstream ConfigReconcilerInventoryStatus.
type ReconcilerStatus struct {
	Status      string             `json:"status" enum:"not_yet_run,running,idle"`
	Config      *sledconfig.Config `json:"config,omitempty"`
	StartedAt   *time.Time         `json:"started_at,omitempty"`
	RunningFor  *Duration          `json:"running_for,omitempty"`
	CompletedAt *time.Time         `json:"completed_at,omitempty"`
	RanFor      *Duration          `json:"ran_for,omitempty"`
}

// Duration is upstream's (Rust) Duration.
type Duration struct {
	Secs  uint64 `json:"secs"`
	Nanos uint32 `json:"nanos"`
}

func duration(d time.Duration) *Duration {
	d = max(d, 0)
	return &Duration{Secs: uint64(d / time.Second), Nanos: uint32(d % time.Second)}
}

// ResultStatus is upstream ConfigReconcilerInventoryResult.
type ResultStatus struct {
	Result  string `json:"result" enum:"ok,err"`
	Message string `json:"message,omitempty"`
}

// LedgerStatus says where the ledger stands.
type LedgerStatus struct {
	Copies []LedgerCopy `json:"copies"`
	// Problem is set when the agent started without a usable ledgered
	// config, or with one that fails validation.
	Problem string `json:"problem,omitempty"`
}

// LedgerCopy is one copy of the ledger.
type LedgerCopy struct {
	Path       string `json:"path"`
	State      string `json:"state"`
	Generation uint64 `json:"generation,omitempty"`
	Error      string `json:"error,omitempty"`
}

// VMMSummary is one VMM in inventory.
type VMMSummary struct {
	ID        string           `json:"propolis_id"`
	Status    string           `json:"status" enum:"known,unknown" doc:"unknown: no record of the VMM is readable; its zone is left running (detail says why)."`
	Zone      string           `json:"zone"`
	State     vmm.RuntimeState `json:"vmm_state"`
	Detail    string           `json:"detail,omitempty"`
	LastEvent *vmm.LogEntry    `json:"last_event,omitempty"`
}

// DDMStatus is the prefix reconciler's status, with the routing daemon's
// address.
type DDMStatus struct {
	URL string `json:"url"`
	prefix.Status
}

// ZoneSummary is one zone's state, without its history.
type ZoneSummary struct {
	Name       string            `json:"name"`
	ID         string            `json:"id"`
	Kind       string            `json:"kind"`
	Wanted     bool              `json:"wanted"`
	State      string            `json:"state" enum:"pending,starting,running,stopping,failed,waiting,unmanaged" doc:"waiting: its start is held until its storage is ready or time is synchronized (waiting_for says which, and why); it has not failed."`
	Since      time.Time         `json:"since"`
	ConfigHash string            `json:"config_hash,omitempty"`
	Attempts   int               `json:"attempts"`
	LastError  string            `json:"last_error,omitempty"`
	WaitingFor string            `json:"waiting_for,omitempty" doc:"Why a waiting zone does not start yet: storage not ready: …, or time not yet synchronized: …."`
	NextRetry  *time.Time        `json:"next_retry,omitempty" doc:"When a failed zone is tried again, or a waiting one looked at again (at once if its gate says something changed first)."`
	Incidents  int               `json:"incidents"`
	Activity   string            `json:"activity,omitempty" doc:"The runtime call in flight: what, for how long, its deadline, what it waits for."`
	Health     reconciler.Health `json:"health" doc:"What the periodic health checks of the running zone found."`
	RemovedAt  *time.Time        `json:"removed_at,omitempty" doc:"When the zone, removed from the config, was torn down: GET /agent/zones/{zone} still shows a removed zone (the last ones, with their history); the zone lists do not."`
}

// ZoneDetail is one zone's state and history.
type ZoneDetail struct {
	ZoneSummary
	History []reconciler.Event `json:"history"`
}

func summary(zs reconciler.ZoneStatus) ZoneSummary {
	return ZoneSummary{
		Name: zs.Name, ID: zs.ID, Kind: zs.Kind, Wanted: zs.Wanted, State: string(zs.State),
		Since: zs.Since, ConfigHash: zs.ConfigHash, Attempts: zs.Attempts, LastError: zs.LastError,
		WaitingFor: zs.WaitingFor, NextRetry: zs.NextRetry, Incidents: zs.Incidents, Activity: zs.Activity, Health: zs.Health,
		RemovedAt: zs.RemovedAt,
	}
}

type zonesOutput struct {
	Body []string
}

func (s *Server) zonesList(context.Context, *struct{}) (*zonesOutput, error) {
	names := s.deps.Reconciler.RunningZones()
	if names == nil {
		names = []string{}
	}
	return &zonesOutput{Body: names}, nil
}

type agentZonesOutput struct {
	Body []ZoneSummary
}

func (s *Server) agentZones(context.Context, *struct{}) (*agentZonesOutput, error) {
	out := []ZoneSummary{}
	for _, zs := range s.deps.Reconciler.Zones() {
		out = append(out, summary(zs))
	}
	return &agentZonesOutput{Body: out}, nil
}

type agentRestoreOutput struct {
	Body reconciler.RestoreStatus
}

func (s *Server) agentRestore(context.Context, *struct{}) (*agentRestoreOutput, error) {
	return &agentRestoreOutput{Body: s.deps.Reconciler.Restore()}, nil
}

type agentZoneInput struct {
	Zone string `path:"zone" maxLength:"128" doc:"Zone name (oxz_…) or zone id."`
}

type agentZoneOutput struct {
	Body *ZoneDetail
}

func (s *Server) agentZone(ctx context.Context, in *agentZoneInput) (*agentZoneOutput, error) {
	zs, ok := s.deps.Reconciler.Zone(in.Zone)
	if !ok {
		// Gone from the config: what it was, and when it went.
		zs, ok = s.deps.Reconciler.Removed(in.Zone)
	}
	if !ok {
		return nil, apiError(ctx, http.StatusNotFound, "no zone named or with id "+in.Zone)
	}
	return &agentZoneOutput{Body: &ZoneDetail{ZoneSummary: summary(zs), History: zs.History}}, nil
}
