package api

import (
	"context"
	"net/http"
)

// SledIdentifiers is upstream's SledIdentifiers: the sled's ids and what its
// board is, as timeseries label it.
type SledIdentifiers struct {
	RackID   string `json:"rack_id" format:"uuid" doc:"Control plane ID of the rack this sled is a member of"`
	SledID   string `json:"sled_id" format:"uuid" doc:"Control plane ID for the sled itself"`
	Model    string `json:"model" doc:"Model name of the sled"`
	Revision uint32 `json:"revision" doc:"Revision number of the sled"`
	Serial   string `json:"serial" doc:"Serial number of the sled"`
}

type sledIdentifiersOutput struct {
	Body *SledIdentifiers
}

// errNoRackID is why GET /sled-identifiers has no answer yet.
const errNoRackID = "the rack id is not configured (--rack-id): this sled is not yet part of a rack"

// sledIdentifiers answers from Identity. Upstream's sled agent serves this
// API only once the sled has joined a rack, so it always knows its rack id;
// rack_id is a required UUID, so rather than invent one (or send an empty
// string no client could decode) this agent answers 503 until it is told
// its rack id, with a message saying so.
func (s *Server) sledIdentifiers(ctx context.Context, _ *struct{}) (*sledIdentifiersOutput, error) {
	id := s.deps.Identity
	if id.RackID == "" {
		return nil, apiError(ctx, http.StatusServiceUnavailable, errNoRackID)
	}
	b := id.Hardware.Baseboard
	return &sledIdentifiersOutput{Body: &SledIdentifiers{
		RackID: id.RackID, SledID: id.SledID, Model: b.Part, Revision: b.Revision, Serial: b.Serial,
	}}, nil
}
