package propolisapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// The API, as upstream's propolis-server answers it (bin/propolis-server/
// src/lib/server.rs). Every request must carry api-version: 6.0.0, or
// 5.0.0 to be read and answered in that version's shapes (versions.go). Errors
// are dropshot's body {"request_id","error_code","message"}; bad input is a
// 400 naming the problem, before anything else is looked at.
//
//	PUT  /instance                  201 {"migrate":null}; 400 bad body, init
//	                                method MigrationTarget, or a spec the
//	                                backend refuses; 409 AlreadyInitialized
//	GET  /instance                  200 {"instance":{properties,state}}
//	GET  /instance/spec             200 {properties,state,spec:{type:Present,value}}
//	GET  /instance/state-monitor    200 {gen,state,migration} once gen ≥ the
//	                                body's gen, or after MonitorWait
//	PUT  /instance/state            204; 403 the state change is not allowed
//	GET  /instance/serial/history   200 {data,last_byte_offset}; 400 bad offsets
//	GET  /instance/serial           101 websocket (serial.go)
//	POST /instance/nmi              200 null; 501 when the backend cannot
//	GET  /instance/migration-status 200 {"migration_in":null,"migration_out":null}
//	GET  /instance/migrate/{id}/start  501: no live migration
//	/instance/disk/{id}/...         404: no Crucible disks
//
// Before PUT /instance, every operation on the instance answers 424
// NoInstance, as upstream does.

const (
	// maxBodyBytes caps PUT /instance's body (an instance spec), as
	// upstream's server config caps every body; the other operations take
	// small bodies or none (httpbound.Small).
	maxBodyBytes = 1 << 20
	// requestIDHeader carries the request's id, as dropshot sends it.
	requestIDHeader = "x-request-id"
)

// Body bounds of the operations (httpbound.Route).
var (
	instanceRoute = httpbound.Sized(maxBodyBytes)
	// vcrRoute is a volume construction request's: a JSON document
	// within a JSON string.
	vcrRoute = httpbound.Sized(maxBodyBytes)
)

type handler struct {
	b   Backend
	log *slog.Logger
	mux *http.ServeMux
	// small bounds requests no operation serves, and ones refused
	// before routing.
	small httpbound.Route
}

// operation is one route's method: its handler and body bounds.
type operation struct {
	method string
	f      http.HandlerFunc
	bounds httpbound.Route
}

// routes are the API's paths and their operations.
func (h *handler) routes() []struct {
	path string
	ops  []operation
} {
	small := httpbound.Small
	return []struct {
		path string
		ops  []operation
	}{
		{"/instance", []operation{{"PUT", h.ensure, instanceRoute}, {"GET", h.get, small}}},
		{"/instance/spec", []operation{{"GET", h.spec, small}}},
		{"/instance/state-monitor", []operation{{"GET", h.stateMonitor, small}}},
		{"/instance/state", []operation{{"PUT", h.putState, small}}},
		{"/instance/serial/history", []operation{{"GET", h.serialHistory, small}}},
		{"/instance/serial", []operation{{"GET", h.serial, small}}},
		{"/instance/nmi", []operation{{"POST", h.nmi, small}}},
		{"/instance/migration-status", []operation{{"GET", h.migrationStatus, small}}},
		{"/instance/migrate/{migration_id}/start", []operation{{"GET", h.migrateStart, small}}},
		{"/instance/disk/{id}/snapshot/{snapshot_id}", []operation{{"POST", h.diskSnapshot, small}}},
		{"/instance/disk/{id}/status", []operation{{"GET", h.diskStatus, small}}},
		{"/instance/disk/{id}/vcr", []operation{{"PUT", h.diskVCR, vcrRoute}}},
	}
}

// Operation is one operation the handler serves.
type Operation struct {
	Method, Path string
	Bounds       httpbound.Route
}

// Operations lists every operation NewHandler serves, with its body
// bounds.
func Operations() []Operation {
	var ops []Operation
	for _, rt := range (&handler{}).routes() {
		for _, op := range rt.ops {
			ops = append(ops, Operation{op.method, rt.path, op.bounds})
		}
	}
	return ops
}

// NewHandler returns the API over b. Long polls and serial consoles end
// when their request's context does: serve it with a BaseContext that ends
// at shutdown, since http.Server.Shutdown does not wait for upgraded
// connections. A nil log discards. Every operation's body is bounded in
// size and read time (httpbound.Route): a body over the limit is answered
// 413, one that does not arrive in time 408.
func NewHandler(b Backend, log *slog.Logger) http.Handler { return newHandler(b, log, 0) }

// newHandler is NewHandler with every body read deadline readTimeout (0:
// each operation's own).
func newHandler(b Backend, log *slog.Logger, readTimeout time.Duration) *handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{b: b, log: log, mux: http.NewServeMux(), small: httpbound.Small}
	if readTimeout > 0 {
		h.small.ReadTimeout = readTimeout
	}
	for _, rt := range h.routes() {
		var allow []string
		for _, op := range rt.ops {
			if readTimeout > 0 {
				op.bounds.ReadTimeout = readTimeout
			}
			h.mux.HandleFunc(op.method+" "+rt.path, bounded(op.bounds, op.f))
			allow = append(allow, op.method)
		}
		slices.Sort(allow)
		h.mux.HandleFunc(rt.path, bounded(h.small, methodNotAllowed(strings.Join(allow, ", "))))
	}
	h.mux.HandleFunc("/", bounded(h.small, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "", "Not Found")
	}))
	return h
}

// bounded is f behind the body bounds rt, answering a Content-Length over
// the limit at once.
func bounded(rt httpbound.Route, f http.HandlerFunc) http.HandlerFunc {
	return rt.Handler(f, func(w http.ResponseWriter, status int, msg string) {
		writeError(w, status, "", msg)
	}).ServeHTTP
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(requestIDHeader, uuid.NewString())
	// Dropshot checks the version before it routes.
	v, msg := checkVersion(r.Header.Values(versionHeader))
	if msg != "" {
		if r.ContentLength != 0 {
			httpbound.StopReading(w) // answered without reading it
		}
		writeError(w, http.StatusBadRequest, "", msg)
		return
	}
	h.mux.ServeHTTP(w, r.WithContext(withVersion(r.Context(), v)))
}

// checkVersion returns the version a request is served in, or what is
// wrong with its api-version header (versions.go). As dropshot, a missing
// header is refused.
func checkVersion(vals []string) (version, string) {
	if len(vals) == 0 {
		return 0, fmt.Sprintf("missing expected header %q", versionHeader)
	}
	v := vals[0]
	parts := strings.Split(v, ".")
	var n [3]uint64
	ok := len(parts) == 3
	for i := 0; ok && i < 3; i++ {
		var err error
		n[i], err = strconv.ParseUint(parts[i], 10, 64)
		ok = err == nil
	}
	switch {
	case !ok:
		return 0, fmt.Sprintf("bad value for header %q: not a version: %s", versionHeader, v)
	case n[0] > 6 || (n[0] == 6 && (n[1] > 0 || n[2] > 0)):
		return 0, fmt.Sprintf("server does not support this API version: %s", v)
	case n[0] == 6:
		return v6, ""
	case n[0] == 5:
		return v5, ""
	default:
		return 0, fmt.Sprintf("server serves API versions %s to %s only, not %s", Version5, APIVersion, v)
	}
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "", "Method Not Allowed")
	}
}

// wireProperties is InstanceProperties with every required member told
// apart from a zero value.
type wireProperties struct {
	ID          *string `json:"id"`
	Name        *string `json:"name"`
	Description *string `json:"description"`
	Metadata    *struct {
		ProjectID    *string `json:"project_id"`
		SiloID       *string `json:"silo_id"`
		SledID       *string `json:"sled_id"`
		SledSerial   *string `json:"sled_serial"`
		SledRevision *uint32 `json:"sled_revision"`
		SledModel    *string `json:"sled_model"`
	} `json:"metadata"`
}

// properties checks p and returns its Properties, with every UUID in its
// canonical form.
func (p *wireProperties) properties() (Properties, error) {
	if p == nil {
		return Properties{}, errors.New("missing field `properties`")
	}
	missing := func(name string) error { return fmt.Errorf("properties: missing field `%s`", name) }
	switch {
	case p.ID == nil:
		return Properties{}, missing("id")
	case p.Name == nil:
		return Properties{}, missing("name")
	case p.Description == nil:
		return Properties{}, missing("description")
	case p.Metadata == nil:
		return Properties{}, missing("metadata")
	}
	m := p.Metadata
	switch {
	case m.ProjectID == nil:
		return Properties{}, missing("metadata.project_id")
	case m.SiloID == nil:
		return Properties{}, missing("metadata.silo_id")
	case m.SledID == nil:
		return Properties{}, missing("metadata.sled_id")
	case m.SledSerial == nil:
		return Properties{}, missing("metadata.sled_serial")
	case m.SledRevision == nil:
		return Properties{}, missing("metadata.sled_revision")
	case m.SledModel == nil:
		return Properties{}, missing("metadata.sled_model")
	}
	ids := []struct {
		name string
		v    *string
	}{{"id", p.ID}, {"metadata.project_id", m.ProjectID}, {"metadata.silo_id", m.SiloID}, {"metadata.sled_id", m.SledID}}
	canon := make([]string, len(ids))
	for i, id := range ids {
		u, err := uuid.Parse(*id.v)
		if err != nil {
			return Properties{}, fmt.Errorf("properties.%s: %q is not a UUID", id.name, *id.v)
		}
		canon[i] = u.String()
	}
	return Properties{
		ID:          canon[0],
		Name:        *p.Name,
		Description: *p.Description,
		Metadata: Metadata{
			ProjectID:    canon[1],
			SiloID:       canon[2],
			SledID:       canon[3],
			SledSerial:   *m.SledSerial,
			SledRevision: *m.SledRevision,
			SledModel:    *m.SledModel,
		},
	}, nil
}

func (h *handler) ensure(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Properties *wireProperties `json:"properties"`
		Init       *struct {
			Method *string `json:"method"`
			Value  *struct {
				Spec json.RawMessage `json:"spec"`
			} `json:"value"`
		} `json:"init"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	props, err := req.Properties.properties()
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: "+err.Error())
		return
	}
	var spec json.RawMessage
	switch {
	case req.Init == nil:
		err = errors.New("missing field `init`")
	case req.Init.Method == nil:
		err = errors.New("init: missing field `method`")
	case *req.Init.Method == "MigrationTarget":
		writeError(w, http.StatusBadRequest, "", `init method "MigrationTarget" is not supported: this server cannot be a live migration target`)
		return
	case *req.Init.Method != "Spec":
		err = fmt.Errorf("init: unknown variant `%s`, expected `Spec` or `MigrationTarget`", *req.Init.Method)
	case req.Init.Value == nil:
		err = errors.New("init: missing field `value`")
	case len(req.Init.Value.Spec) == 0 || req.Init.Value.Spec[0] != '{':
		err = errors.New("init.value.spec: want an InstanceSpec object")
	default:
		var buf bytes.Buffer
		if err = json.Compact(&buf, req.Init.Value.Spec); err == nil {
			spec, err = specIn(versionOf(r.Context()), buf.Bytes())
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: "+err.Error())
		return
	}
	err = h.b.Ensure(r.Context(), props, spec)
	if se, ok := errors.AsType[*SpecError](err); ok {
		writeError(w, http.StatusBadRequest, "", "failed to generate internal instance spec: "+se.Msg)
		return
	}
	switch {
	case err == nil:
		h.log.Info("instance ensured", "id", props.ID, "name", props.Name)
		writeJSON(w, http.StatusCreated, ensureResponse{})
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, codeAlreadyInitialized, "instance already initialized")
	default:
		h.internal(w, r, fmt.Errorf("VM initialization failed: %w", err))
	}
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	props, _, st, ok := h.b.Instance()
	if !ok {
		writeNoInstance(w)
		return
	}
	writeJSON(w, http.StatusOK, getResponse{Instance: instanceBody{Properties: props, State: st.State}})
}

func (h *handler) spec(w http.ResponseWriter, r *http.Request) {
	props, spec, st, ok := h.b.Instance()
	if !ok {
		writeNoInstance(w)
		return
	}
	writeJSON(w, http.StatusOK, specResponse{
		Properties: props,
		Spec:       specStatus{Type: "Present", Value: specOut(versionOf(r.Context()), spec)},
		State:      st.State,
	})
}

// stateMonitor answers as soon as the status's generation is at least the
// one asked for, as upstream does (its clients ask for the last generation
// they saw plus one), or with the current status after MonitorWait.
func (h *handler) stateMonitor(w http.ResponseWriter, r *http.Request) {
	var req monitorRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Gen == nil {
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: missing field `gen`")
		return
	}
	_, _, st, ok := h.b.Instance()
	if !ok {
		writeNoInstance(w)
		return
	}
	if gen := *req.Gen; st.Gen < gen {
		ctx, cancel := context.WithTimeout(r.Context(), MonitorWait)
		st = h.b.Wait(ctx, gen-1)
		cancel()
	}
	writeJSON(w, http.StatusOK, monitorResponse{Gen: st.Gen, State: st.State, Detail: st.Detail})
}

func (h *handler) putState(w http.ResponseWriter, r *http.Request) {
	var req StateRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if !req.Valid() {
		writeError(w, http.StatusBadRequest, "", fmt.Sprintf("unable to parse JSON body: unknown variant `%s`, expected one of `Run`, `Stop`, `Reboot`", req))
		return
	}
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	err := h.b.Request(r.Context(), req)
	switch {
	case err == nil:
		h.log.Info("instance state requested", "request", req)
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, ErrInvalidTransition):
		// Upstream puts the reason in the error code and the status's
		// name in the message.
		writeError(w, http.StatusForbidden, err.Error(), "Forbidden")
	default:
		h.internal(w, r, fmt.Errorf("unexpected error from VM controller: %w", err))
	}
}

func (h *handler) nmi(w http.ResponseWriter, r *http.Request) {
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	err := h.b.NMI(r.Context())
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, nil)
	case errors.Is(err, ErrUnsupported):
		writeError(w, http.StatusNotImplemented, "", "this VM cannot take a non-maskable interrupt")
	default:
		h.internal(w, r, fmt.Errorf("injecting an NMI: %w", err))
	}
}

func (h *handler) migrationStatus(w http.ResponseWriter, r *http.Request) {
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	writeJSON(w, http.StatusOK, migrationStatus{})
}

// migrateStart refuses before upgrading: there is no live migration out
// of this server. Upstream upgrades first and fails on the upgraded
// connection, where no error can be told.
func (h *handler) migrateStart(w http.ResponseWriter, r *http.Request) {
	if !pathUUID(w, r, "migration_id") {
		return
	}
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	writeError(w, http.StatusNotImplemented, "", "live migration is not supported by this server")
}

// The instance has no Crucible disks: the disk operations find none, as
// upstream's do for an id it does not know (error code and message as
// upstream's).

func (h *handler) diskSnapshot(w http.ResponseWriter, r *http.Request) {
	if !pathUUID(w, r, "snapshot_id") {
		return
	}
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no disk with id %s!", r.PathValue("id")), "Not Found")
}

func (h *handler) diskStatus(w http.ResponseWriter, r *http.Request) {
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	writeError(w, http.StatusNotFound, "No crucible backend for id "+r.PathValue("id"), "Not Found")
}

func (h *handler) diskVCR(w http.ResponseWriter, r *http.Request) {
	var req struct {
		VCRJSON *string `json:"vcr_json"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if req.VCRJSON == nil {
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: missing field `vcr_json`")
		return
	}
	if _, _, _, ok := h.b.Instance(); !ok {
		writeNoInstance(w)
		return
	}
	writeError(w, http.StatusNotFound, "No crucible backend for id "+r.PathValue("id"), "Not Found")
}

// pathUUID checks that the path parameter name is a UUID, and answers 400
// when it is not.
func pathUUID(w http.ResponseWriter, r *http.Request, name string) bool {
	if _, err := uuid.Parse(r.PathValue(name)); err != nil {
		writeError(w, http.StatusBadRequest, "", fmt.Sprintf("bad parameter in URL path: %s: %q is not a UUID", name, r.PathValue(name)))
		return false
	}
	return true
}

// decodeBody reads exactly one JSON value into v, as dropshot's typed
// body does, and answers 400 when it cannot.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusBadRequest, "", fmt.Sprintf("expected content type \"application/json\", got %q", ct))
			return false
		}
	}
	data, err := io.ReadAll(r.Body) // bounded by the operation's httpbound.Route
	if st, msg := httpbound.Status(err); st != 0 {
		writeError(w, st, "", msg)
		return false
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "error processing request: "+err.Error())
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		if err == io.EOF {
			err = errors.New("empty body")
		}
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: "+err.Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "", "unable to parse JSON body: trailing characters after the JSON value")
		return false
	}
	return true
}

// internal answers 500 as dropshot does, with its message hidden from the
// client and logged.
func (h *handler) internal(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Warn("internal error", "method", r.Method, "path", r.URL.Path,
		"request_id", w.Header().Get(requestIDHeader), "err", err)
	writeError(w, http.StatusInternalServerError, codeInternal, "Internal Server Error")
}

func writeNoInstance(w http.ResponseWriter) {
	writeError(w, http.StatusFailedDependency, codeNoInstance, "Server not initialized (no instance)")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, codeInternal, "Internal Server Error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(errorBody{RequestID: w.Header().Get(requestIDHeader), ErrorCode: code, Message: msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
