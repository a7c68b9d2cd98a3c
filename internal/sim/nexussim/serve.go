package nexussim

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// pathID returns the canonical form of the UUID path parameter name; when
// it is not a UUID it answers 400 naming the problem and returns false.
func pathID(rp *simhttp.Reply, r *http.Request, name string) (string, bool) {
	raw := r.PathValue(name)
	u, err := uuid.Parse(raw)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", fmt.Sprintf("bad parameter in URL path: unable to parse %q as %s: not a UUID: %v", raw, name, err))
		return "", false
	}
	return u.String(), true
}

// request reads an operation's UUID path parameter and its body, decoded
// with decode; when either is bad it answers 400 naming the problem and
// returns false.
func request[T any](rp *simhttp.Reply, r *http.Request, param string, decode func([]byte) (T, error)) (string, T, bool) {
	var zero T
	id, ok := pathID(rp, r, param)
	if !ok {
		return "", zero, false
	}
	data, err := simhttp.ReadBody(r)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return "", zero, false
	}
	v, err := decode(data)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", "unable to parse JSON body: "+err.Error())
		return "", zero, false
	}
	return id, v, true
}

// serveSledGet serves GET /sled-agents/{sled_id}.
func (s *Server) serveSledGet(rp *simhttp.Reply, r *http.Request) {
	id, ok := pathID(rp, r, "sled_id")
	if !ok {
		return
	}
	s.mu.Lock()
	info, ok := s.sleds[id]
	s.mu.Unlock()
	if !ok {
		// As upstream's lookup of a sled it has no record of.
		rp.Error(http.StatusNotFound, "ObjectNotFound", fmt.Sprintf("not found: sled with id %q", id))
		return
	}
	rp.JSON(http.StatusOK, info)
}

// serveSledPut serves POST /sled-agents/{sled_id}.
func (s *Server) serveSledPut(rp *simhttp.Reply, r *http.Request) {
	id, info, ok := request(rp, r, "sled_id", decodeSledAgentInfo)
	if !ok {
		return
	}
	s.mu.Lock()
	err := s.upsertLocked(id, info)
	s.mu.Unlock()
	if err != nil {
		// Upstream says no more than this; the reason is in its log.
		s.log.Info("nexus simulator refused a sled upsert", "sled_id", id, "err", err)
		rp.Error(http.StatusInternalServerError, "Internal", "Internal Server Error")
		return
	}
	s.log.Debug("nexus simulator upserted a sled", "sled_id", id, "generation", info.Generation)
	rp.NoContent()
}

// serveVMMPut serves PUT /vmms/{propolis_id}.
func (s *Server) serveVMMPut(rp *simhttp.Reply, r *http.Request) {
	id, st, ok := request(rp, r, "propolis_id", decodeSledVmmState)
	if !ok {
		return
	}
	conflict := st.MigrationIn != nil && st.MigrationOut != nil && st.MigrationIn.MigrationID == st.MigrationOut.MigrationID
	s.mu.Lock()
	status := s.vmmFaultLocked(id)
	var newer bool
	switch {
	case status != 0:
		v := s.vmmLocked(id)
		v.Refused = append(v.Refused, st)
	case conflict:
	default:
		newer = s.takeVMMLocked(id, st)
	}
	s.mu.Unlock()
	switch {
	case status != 0:
		s.log.Info("nexus simulator refused a VMM update (VMM fault)", "propolis_id", id, "status", status)
		code, msg := clientError(status)
		rp.Error(status, code, msg)
	case conflict:
		rp.Error(http.StatusConflict, "Conflict", "migrating from a VMM to itself is nonsensical")
	default:
		s.log.Debug("nexus simulator VMM update", "propolis_id", id, "gen", st.VmmState.Gen,
			"state", st.VmmState.State, "applied", newer)
		rp.NoContent()
	}
}

// clientError is the error code and message upstream gives with status.
func clientError(status int) (code, msg string) {
	switch status {
	case http.StatusBadRequest:
		return "InvalidRequest", "simulated invalid request"
	case http.StatusForbidden:
		return "Forbidden", "Forbidden"
	case http.StatusNotFound:
		return "ObjectNotFound", "not found: simulated"
	case http.StatusConflict:
		return "Conflict", "simulated conflict"
	case http.StatusGone:
		return "Gone", "Gone"
	}
	return "", fmt.Sprintf("simulated %d %s", status, http.StatusText(status))
}

// serveDecommission serves POST /__sim/decommission/{sled_id}.
func (s *Server) serveDecommission(rp *simhttp.Reply, r *http.Request) {
	id, ok := pathID(rp, r, "sled_id")
	if !ok {
		return
	}
	if err := s.Decommission(id); errors.Is(err, ErrNoSled) {
		rp.Error(http.StatusNotFound, "ObjectNotFound", err.Error())
		return
	} else if err != nil {
		rp.Error(http.StatusInternalServerError, "Internal", err.Error())
		return
	}
	rp.NoContent()
}

// serveSetSled serves PUT /__sim/sleds/{sled_id}.
func (s *Server) serveSetSled(rp *simhttp.Reply, r *http.Request) {
	id, info, ok := request(rp, r, "sled_id", decodeSledAgentInfo)
	if !ok {
		return
	}
	if err := s.SetSled(id, info); err != nil {
		rp.Error(http.StatusBadRequest, "", "sled body: "+err.Error())
		return
	}
	rp.NoContent()
}

// serveAddVMMFault serves POST /__sim/vmm-faults.
func (s *Server) serveAddVMMFault(rp *simhttp.Reply, r *http.Request) {
	var f VMMFault
	err := simhttp.DecodeStrict(io.LimitReader(r.Body, simhttp.MaxBodyBytes), &f)
	if err == nil {
		err = s.AddVMMFault(f)
	}
	if err != nil {
		rp.Error(http.StatusBadRequest, "", "VMM fault body: "+err.Error())
		return
	}
	rp.NoContent()
}

// serveState serves GET /__sim/state.
func (s *Server) serveState(rp *simhttp.Reply, _ *http.Request) {
	fault, requests := s.Fault(), s.Requests()
	s.mu.Lock()
	st := struct {
		Fault     Fault                    `json:"fault"`
		Sleds     map[string]SledAgentInfo `json:"sleds"`
		VMMs      map[string]VMM           `json:"vmms"`
		VMMFaults []VMMFault               `json:"vmm_faults"`
		Requests  map[string]int           `json:"requests"`
	}{fault, map[string]SledAgentInfo{}, map[string]VMM{}, s.vmmFaultsLocked(), requests}
	for id, info := range s.sleds {
		st.Sleds[id] = info
	}
	for id, v := range s.vmms {
		st.VMMs[id] = v.clone()
	}
	s.mu.Unlock()
	rp.JSON(http.StatusOK, st)
}
