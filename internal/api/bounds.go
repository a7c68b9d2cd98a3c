package api

import (
	"net/http"
	"slices"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// Every operation's body is bounded in size and read time (httpbound.Route),
// sized to its largest legitimate request and documented in its
// description. Upstream's dropshot server has one request_body_max_bytes
// for the whole sled-agent API; we bound each operation by its own need.
var (
	// configRoute is PUT /omicron-config's: what the ledger stores.
	configRoute = httpbound.Sized(MaxConfigBytes)
	// vmmRegisterRoute is PUT /vmms/{id}'s: an InstanceEnsureBody.
	vmmRegisterRoute = httpbound.Sized(MaxVMMBodyBytes)
	// vmmStateRoute is PUT /vmms/{id}/state's: {"state": {"type": …}}
	// is some 30 bytes; the rest leaves room for members we ignore.
	vmmStateRoute = httpbound.Sized(4 << 10)
	// faultsRoute is PUT /debug/sim/faults's: a fault map for every zone
	// and disk of a sled.
	faultsRoute = httpbound.Sized(1 << 20)
)

// boundsKey is the key of an operation's httpbound.Route in its Metadata.
const boundsKey = "body-bounds"

// bounded is op bounded by rt: documented, kept for dropshotErrors (which
// applies it before huma sees the request), and told to huma, which sets
// its own read deadline and refuses a body of exactly MaxBodyBytes
// (huma.go readBody: count == maxBytes is 413); so huma's MaxBodyBytes is
// one more than the limit, which httpbound enforces.
func (s *Server) bounded(op huma.Operation, rt httpbound.Route) huma.Operation {
	op.Description = joinSentences(op.Description, rt.Doc())
	if s.deps.BodyReadTimeout > 0 {
		rt.ReadTimeout = s.deps.BodyReadTimeout
	}
	op.MaxBodyBytes = rt.MaxBodyBytes + 1
	op.BodyReadTimeout = rt.ReadTimeout
	op.Metadata = map[string]any{boundsKey: rt}
	for _, st := range []int{http.StatusRequestTimeout, http.StatusRequestEntityTooLarge} {
		if !slices.Contains(op.Errors, st) {
			op.Errors = append(op.Errors, st)
		}
	}
	slices.Sort(op.Errors)
	s.bounds[op.Method+" "+op.Path] = rt
	return op
}

// route is the bounds of the route pattern names (as the mux reports it);
// a request that matches no operation (404, 405, GET /metrics) gets a small
// body's.
func (s *Server) route(pattern string) httpbound.Route {
	if rt, ok := s.bounds[pattern]; ok {
		return rt
	}
	rt := httpbound.Small
	if s.deps.BodyReadTimeout > 0 {
		rt.ReadTimeout = s.deps.BodyReadTimeout
	}
	return rt
}

// Bounds is the body bounds of the operation op of the API, and whether it
// has any.
func Bounds(op *huma.Operation) (httpbound.Route, bool) {
	rt, ok := op.Metadata[boundsKey].(httpbound.Route)
	return rt, ok
}

func joinSentences(a, b string) string {
	if a == "" {
		return b
	}
	return a + " " + b
}
