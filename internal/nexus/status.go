package nexus

import (
	"strconv"
	"strings"
)

// Status is what the agent knows of Nexus, for people (GET
// /agent/inventory).
type Status struct {
	// FoundBy is how Nexus is found: "dns" (its SRV records) or "--nexus"
	// (the addresses given).
	FoundBy string `json:"found_by"`
	// LastAnswered is the Nexus address that last answered; empty before
	// any did.
	LastAnswered string       `json:"last_answered,omitempty"`
	Registration Registration `json:"registration"`
	// VMMStates is where each VMM's state stands with Nexus.
	VMMStates []Delivery `json:"vmm_states"`
}

// Summary says in one line where the sled stands with Nexus:
// "knows sled (generation 3); VMM states: 2 delivered, 1 pending".
func (s Status) Summary() string {
	r := s.Registration
	var b strings.Builder
	switch {
	case r.State == "decommissioned":
		b.WriteString("decommissioned the sled: nothing more is sent")
	case r.State == "registered" && r.Known != nil:
		b.WriteString("knows the sled (generation " + strconv.FormatUint(r.Known.Generation, 10) + ")")
	case r.State == "retrying":
		b.WriteString("not reached: " + r.LastError)
	default:
		b.WriteString(r.State)
	}
	if r.Outstanding != "" {
		b.WriteString("; " + r.Outstanding + " outstanding")
	}
	delivered, pending, refused := 0, 0, 0
	for _, d := range s.VMMStates {
		switch {
		case d.Pending:
			pending++
		case d.Delivered == d.Latest.Gen:
			delivered++
		default:
			refused++
		}
	}
	if len(s.VMMStates) > 0 {
		b.WriteString("; VMM states: " + strconv.Itoa(delivered) + " delivered, " + strconv.Itoa(pending) + " pending")
		if refused > 0 {
			b.WriteString(", " + strconv.Itoa(refused) + " refused")
		}
	}
	return b.String()
}
