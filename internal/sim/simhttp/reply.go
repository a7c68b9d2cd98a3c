package simhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// MaxBodyBytes bounds request bodies but GET's (BodyBounds); bigger ones
// are refused with 413.
const MaxBodyBytes = 1 << 20

// ErrorBody is the upstream (dropshot) error body.
type ErrorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// Reply writes the answer to one request, with a fresh request id in the
// x-request-id header and in error bodies, and remembers the status for
// the log.
type Reply struct {
	w      http.ResponseWriter
	id     string
	status int
	// req is the request answered, once its body is bounded.
	req *http.Request
}

func newReply(w http.ResponseWriter) *Reply {
	rp := &Reply{w: w, id: uuid.NewString()}
	w.Header().Set("x-request-id", rp.id)
	return rp
}

// Header is the answer's header, to set before writing.
func (r *Reply) Header() http.Header { return r.w.Header() }

// JSON answers status with v encoded as JSON.
func (r *Reply) JSON(status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		r.Error(http.StatusInternalServerError, "Internal", "encoding answer: "+err.Error())
		return
	}
	r.status = status
	r.w.Header().Set("Content-Type", "application/json")
	r.w.WriteHeader(status)
	r.w.Write(b)
}

// NoContent answers 204 without a body.
func (r *Reply) NoContent() {
	r.status = http.StatusNoContent
	r.w.WriteHeader(http.StatusNoContent)
}

// Error answers status with the upstream error body; code may be empty. A
// 400 for a body its bounds cut (httpbound) is their 413 or 408, so that
// handlers need not tell a body cut short from a bad one.
func (r *Reply) Error(status int, code, msg string) {
	if status == http.StatusBadRequest && r.req != nil {
		if st, m := httpbound.Status(httpbound.Failure(r.req)); st != 0 {
			status, code, msg = st, "", m
		}
	}
	r.JSON(status, ErrorBody{RequestID: r.id, ErrorCode: code, Message: msg})
}

// bound bounds req's body by rt, and answers a Content-Length over the
// limit: it reports whether the request may be served.
func (r *Reply) bound(req *http.Request, rt httpbound.Route) bool {
	if err := rt.Apply(r.w, req); err != nil {
		st, msg := httpbound.Status(err)
		r.Error(st, "", msg)
		return false
	}
	r.req = req
	return true
}

// ReadBody reads a request body that must be JSON: a Content-Type other
// than application/json is refused (a missing one is taken as JSON, as
// dropshot does), and so is a body over MaxBodyBytes. The errors are meant
// for a 400 answer.
func ReadBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, fmt.Errorf("expected content type \"application/json\", got %q", ct)
		}
	}
	// Under a Server the body is bounded already (BodyBounds); the limit
	// here is for a handler served some other way.
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading body: %w", err)
	}
	if len(data) > MaxBodyBytes {
		return nil, errors.New(httpbound.TooLargeMessage(MaxBodyBytes))
	}
	return data, nil
}

// DecodeStrict decodes the JSON value at the start of rd into v, refusing
// unknown fields. It is meant for control bodies.
func DecodeStrict(rd io.Reader, v any) error {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
