// Package nexussim is a simulated Nexus internal API (omicron's
// nexus-internal 1.0.0): a real HTTP server speaking the operations a sled
// agent calls, with upstream Nexus's semantics, that tests can make refuse,
// hang, fail, decommission a sled or refuse VMM updates with a 4xx.
//
// Served like Nexus's internal server (every request needs an api-version
// header of 1.0.0 or older):
//
//	GET  /sled-agents/{sled_id}  → 200 SledAgentInfo held, or 404 ObjectNotFound
//	POST /sled-agents/{sled_id}  SledAgentInfo → 204; 500 when not applied (see below)
//	PUT  /vmms/{propolis_id}     SledVmmState → 204
//
// Sleds, as upstream's sled_upsert (omicron nexus/src/app/sled.rs
// upsert_sled, nexus/db-queries/src/db/datastore/sled.rs sled_upsert): a
// new sled's record is inserted whatever its generation. An existing
// record is replaced only when the body's generation is newer and the sled
// is not decommissioned; then the baseboard stays the first one reported.
// Otherwise nothing changes and the answer is 500 "Internal Server Error"
// (upstream's conditional upsert returns no row, which it reports as an
// internal error). So is a reservoir_size not below usable_physical_ram
// (upstream's database refuses it). The body's "decommissioned" is ignored:
// only Nexus sets it (here, Decommission), and GET answers it.
//
// VMMs, as upstream's notify_vmm_updated (omicron nexus/src/app/instance.rs
// process_vmm_update, nexus/db-queries/src/db/datastore/vmm.rs
// vmm_and_migration_update_runtime): an update whose vmm_state.gen is not
// newer than the one held is answered 204 but changes nothing; one whose
// migration_in and migration_out name the same migration is 409. Every
// update answered 204 is kept, in arrival order, and the newest by
// generation is the VMM's latest state.
//
// Errors carry the upstream body {"request_id","error_code","message"}: 400
// for bad input or version, 404 for unknown sleds and paths, 405 for a
// wrong method, 500 for refused upserts and simulated failures.
//
// Simulator-only control endpoints, under /__sim/, need no api-version
// header and are not counted by Requests:
//
//	PUT    /__sim/fault                 {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"} → 204
//	POST   /__sim/restart-empty         → 204: forget every sled and VMM, drop every connection
//	POST   /__sim/decommission/{sled_id} → 204 (as Decommission); 404 for an unknown sled
//	PUT    /__sim/sleds/{sled_id}       SledAgentInfo → 204 (as SetSled)
//	POST   /__sim/vmm-faults            {"status": 4xx, "vmm": "<uuid>", "count": n} → 204 (as AddVMMFault)
//	DELETE /__sim/vmm-faults            → 204 (as ClearVMMFaults)
//	GET    /__sim/state                 → 200 {"fault", "sleds", "vmms", "vmm_faults", "requests"}
//
// A "refuse" fault closes the listener, so nothing can clear it over HTTP:
// give "refuse_for" (a Go duration; it implies "refuse") to have it clear
// itself, or use the Go API.
//
// Where this differs from upstream: it knows no instances, so it takes
// updates for any VMM (upstream answers 500 for a VMM it has no record
// of); it keeps a VMM's whole body by vmm_state.gen, where upstream keeps
// each migration's state by its own generation (this agent does not
// migrate); and it refuses body fields the document does not have, which
// upstream ignores, so that a misspelt field fails the agent's tests.
package nexussim

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// APIVersion is the newest api-version the simulator serves.
const APIVersion = "1.0.0"

// Fault is a failure the simulator is told to show (see simhttp.Fault).
type Fault = simhttp.Fault

// The faults, as described at simhttp.Fault.
const (
	FaultNone   = simhttp.FaultNone
	FaultRefuse = simhttp.FaultRefuse
	FaultHang   = simhttp.FaultHang
	FaultError  = simhttp.FaultError
)

var (
	// ErrClosed is returned by operations on a closed Server.
	ErrClosed = errors.New("nexussim: server closed")
	// ErrNoSled is returned for a sled the simulator holds no record of.
	ErrNoSled = errors.New("nexussim: no such sled")
)

// Config configures a simulator.
type Config struct {
	// Log may be nil.
	Log *slog.Logger
}

// VMMFault makes PUT /vmms/{propolis_id} answer Status, a 4xx, to a
// well-formed update instead of taking it, as Nexus does when it refuses
// an update for good.
type VMMFault struct {
	// Status is the answer, 400 to 499.
	Status int `json:"status"`
	// VMM limits the fault to one VMM's updates; "" is every VMM's.
	VMM string `json:"vmm,omitempty"`
	// Count is how many updates the fault refuses before it ends; 0 is
	// until ClearVMMFaults. In state, it is how many are left.
	Count int `json:"count,omitempty"`
}

// VMM is what the simulator holds of one VMM.
type VMM struct {
	// Latest is the update with the newest vmm_state.gen (the first of
	// equal ones); nil before any was taken.
	Latest *SledVmmState `json:"latest"`
	// Received are the updates taken (answered 204), in arrival order.
	Received []SledVmmState `json:"received"`
	// Refused are the well-formed updates a VMMFault refused, in arrival
	// order.
	Refused []SledVmmState `json:"refused"`
}

// clone is a deep copy of v, with empty lists rather than nil ones.
func (v *VMM) clone() VMM {
	out := VMM{Received: cloneStates(v.Received), Refused: cloneStates(v.Refused)}
	if v.Latest != nil {
		l := v.Latest.clone()
		out.Latest = &l
	}
	return out
}

func cloneStates(list []SledVmmState) []SledVmmState {
	out := make([]SledVmmState, len(list))
	for i, st := range list {
		out[i] = st.clone()
	}
	return out
}

// httpServer names simhttp.Server for embedding without exporting it.
type httpServer = simhttp.Server

// Server is a simulated Nexus internal API. It is safe for concurrent use;
// no lock is held while a request waits.
//
// Its HTTP side is a simhttp.Server, whose Start, Addr, URL, Close,
// Requests, Fault, SetFault and RestartEmpty it has. Requests are keyed by
// method and route pattern (e.g. "PUT /vmms/{propolis_id}"; the path when
// no route matched). Sled and VMM ids are UUIDs; the Go API takes them in
// any form uuid.Parse does and keys everything by the canonical form.
type Server struct {
	*httpServer
	log *slog.Logger

	// mu guards the fields below. It is never held while calling into
	// httpServer or doing I/O.
	mu    sync.Mutex
	sleds map[string]SledAgentInfo // by sled id
	vmms  map[string]*VMM          // by propolis id
	// vmmFaults are in force in the order added; the first that matches
	// an update refuses it. A Count is what is left of that fault, and 0
	// is until cleared: a limited fault is dropped when it is used up.
	vmmFaults []VMMFault
}

// New returns a simulator that is not listening yet.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: cfg.Log, sleds: map[string]SledAgentInfo{}, vmms: map[string]*VMM{}}
	api := &simhttp.Router{}
	api.Handle("GET /sled-agents/{sled_id}", s.serveSledGet)
	api.Handle("POST /sled-agents/{sled_id}", s.serveSledPut)
	api.Handle("PUT /vmms/{propolis_id}", s.serveVMMPut)
	control := &simhttp.Router{}
	control.Handle("GET /__sim/state", s.serveState)
	control.Handle("POST /__sim/decommission/{sled_id}", s.serveDecommission)
	control.Handle("PUT /__sim/sleds/{sled_id}", s.serveSetSled)
	control.Handle("POST /__sim/vmm-faults", s.serveAddVMMFault)
	control.Handle("DELETE /__sim/vmm-faults", func(rp *simhttp.Reply, _ *http.Request) {
		s.ClearVMMFaults()
		rp.NoContent()
	})
	s.httpServer = simhttp.New(simhttp.Config{
		Name:       "nexus",
		APIVersion: APIVersion,
		Log:        cfg.Log,
		ErrClosed:  ErrClosed,
		API:        api,
		Control:    control,
		Forget:     s.forget,
	})
	return s
}

// canonical returns id's canonical form.
func canonical(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", fmt.Errorf("nexussim: %q is not a UUID: %w", id, err)
	}
	return u.String(), nil
}

// Sled is the record held of a sled, if any.
func (s *Server) Sled(id string) (SledAgentInfo, bool) {
	id, err := canonical(id)
	if err != nil {
		return SledAgentInfo{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info, ok := s.sleds[id]
	return info, ok
}

// Sleds is every sled record held, by canonical sled id.
func (s *Server) Sleds() map[string]SledAgentInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sleds)
}

// SetSled makes Nexus hold info for a sled, replacing any record, as if
// Nexus had been told so earlier: its generation and decommissioned are
// kept as given.
func (s *Server) SetSled(id string, info SledAgentInfo) error {
	id, err := canonical(id)
	if err != nil {
		return err
	}
	if err := checkSledAgentInfo(info); err != nil {
		return fmt.Errorf("nexussim: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sleds[id] = info
	return nil
}

// Decommission marks a sled held decommissioned, as Nexus does once the
// sled leaves the rack: GET answers it, and upserts are refused from now
// on. It is idempotent; a sled without a record is ErrNoSled.
func (s *Server) Decommission(id string) error {
	id, err := canonical(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	info, ok := s.sleds[id]
	if ok {
		info.Decommissioned = true
		s.sleds[id] = info
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoSled, id)
	}
	s.log.Info("nexus simulator decommissioned a sled", "sled_id", id)
	return nil
}

// errNotApplied says an upsert was refused; why is for the log only, as
// upstream answers every such refusal with a bare internal error.
var errNotApplied = errors.New("sled upsert not applied")

// upsertLocked applies a sled agent's report as upstream's sled_upsert.
func (s *Server) upsertLocked(id string, info SledAgentInfo) error {
	if info.ReservoirSize >= info.UsablePhysicalRAM {
		return fmt.Errorf("%w: reservoir_size %d is not below usable_physical_ram %d",
			errNotApplied, info.ReservoirSize, info.UsablePhysicalRAM)
	}
	// Upstream keeps the address's IP and port only.
	a := info.SAAddress
	info.SAAddress = netip.AddrPortFrom(a.Addr().WithZone(""), a.Port())
	old, ok := s.sleds[id]
	switch {
	case !ok:
		info.Decommissioned = false
	case old.Decommissioned:
		return fmt.Errorf("%w: the sled is decommissioned", errNotApplied)
	case info.Generation <= old.Generation:
		return fmt.Errorf("%w: generation %d is not newer than the %d held", errNotApplied, info.Generation, old.Generation)
	default:
		info.Baseboard = old.Baseboard
		info.Decommissioned = false
	}
	s.sleds[id] = info
	return nil
}

// VMMStates are the updates of a VMM taken (answered 204), in arrival
// order, whatever their generation.
func (s *Server) VMMStates(id string) []SledVmmState {
	v, _ := s.VMM(id)
	return v.Received
}

// LatestVMM is the update of a VMM with the newest vmm_state.gen.
func (s *Server) LatestVMM(id string) (SledVmmState, bool) {
	v, _ := s.VMM(id)
	if v.Latest == nil {
		return SledVmmState{}, false
	}
	return *v.Latest, true
}

// RefusedVMMStates are the updates of a VMM a VMMFault refused, in arrival
// order.
func (s *Server) RefusedVMMStates(id string) []SledVmmState {
	v, _ := s.VMM(id)
	return v.Refused
}

// VMM is a copy of what is held of a VMM; false if no update of it
// arrived.
func (s *Server) VMM(id string) (VMM, bool) {
	empty := VMM{Received: []SledVmmState{}, Refused: []SledVmmState{}}
	id, err := canonical(id)
	if err != nil {
		return empty, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vmms[id]
	if !ok {
		return empty, false
	}
	return v.clone(), true
}

// VMMs is a copy of what is held of every VMM, by canonical id.
func (s *Server) VMMs() map[string]VMM {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]VMM, len(s.vmms))
	for id, v := range s.vmms {
		out[id] = v.clone()
	}
	return out
}

// AddVMMFault puts f in force after those already in force.
func (s *Server) AddVMMFault(f VMMFault) error {
	if f.Status < 400 || f.Status > 499 {
		return fmt.Errorf("nexussim: VMM fault status %d: want a 4xx", f.Status)
	}
	if f.Count < 0 {
		return fmt.Errorf("nexussim: VMM fault count %d: want 0 (until cleared) or more", f.Count)
	}
	if f.VMM != "" {
		id, err := canonical(f.VMM)
		if err != nil {
			return err
		}
		f.VMM = id
	}
	s.mu.Lock()
	s.vmmFaults = append(s.vmmFaults, f)
	s.mu.Unlock()
	s.log.Info("nexus simulator VMM fault", "status", f.Status, "vmm", f.VMM, "count", f.Count)
	return nil
}

// ClearVMMFaults ends every VMMFault.
func (s *Server) ClearVMMFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vmmFaults = nil
}

// VMMFaults are the VMMFaults in force, Count being what is left of each.
func (s *Server) VMMFaults() []VMMFault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vmmFaultsLocked()
}

// vmmFaultsLocked is a copy of the VMMFaults in force, empty rather than
// nil.
func (s *Server) vmmFaultsLocked() []VMMFault {
	return append([]VMMFault{}, s.vmmFaults...)
}

// vmmFaultLocked returns the status a VMMFault answers an update of VMM
// id with, using it up, or 0 when none applies.
func (s *Server) vmmFaultLocked(id string) int {
	for i := range s.vmmFaults {
		f := &s.vmmFaults[i]
		if f.VMM != "" && f.VMM != id {
			continue
		}
		status := f.Status
		if f.Count > 0 {
			if f.Count--; f.Count == 0 {
				s.vmmFaults = slices.Delete(s.vmmFaults, i, i+1)
			}
		}
		return status
	}
	return 0
}

// vmmLocked returns the record of VMM id, making it if need be.
func (s *Server) vmmLocked(id string) *VMM {
	v, ok := s.vmms[id]
	if !ok {
		v = &VMM{}
		s.vmms[id] = v
	}
	return v
}

// takeVMMLocked records an update of VMM id taken, and reports whether it
// is newer than the latest held, which it then replaces.
func (s *Server) takeVMMLocked(id string, st SledVmmState) (newer bool) {
	v := s.vmmLocked(id)
	v.Received = append(v.Received, st)
	if v.Latest != nil && st.VmmState.Gen <= v.Latest.VmmState.Gen {
		return false
	}
	l := st.clone()
	v.Latest = &l
	return true
}

// forget drops every sled and VMM, as a Nexus with a new database; the
// VMM faults stay in force, as the fault does.
func (s *Server) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.sleds)
	clear(s.vmms)
}
