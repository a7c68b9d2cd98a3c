package propolis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// The HTTP API inside a VMM zone. Errors are the upstream body
// {"request_id","error_code","message"}.
//
//	GET /health                          200 health (zoneservice.Health plus "status":"ok")
//	GET /state                           200 Status
//	GET /state?after_gen=N[&wait=5s]     200 Status once Gen > N, or the current
//	                                     Status when wait (default DefaultWait,
//	                                     at most MaxWait) ends; at once when N is
//	                                     ahead of Gen (another incarnation)
//	PUT /state {"state":"running"}       200 Status once the request is taken;
//	                                     400 bad body; 409 invalid transition

// Long-poll bounds of GET /state?after_gen=N&wait=D.
const (
	DefaultWait = 10 * time.Second
	MaxWait     = 30 * time.Second
)

// ZoneKind is the kind a VMM zone's service reports in its health.
const ZoneKind = "propolis-server"

// ZoneName is the name of the zone of the VMM propolisID,
// oxz_propolis-server_<id>, as upstream names it.
func ZoneName(propolisID string) string {
	return "oxz_" + ZoneKind + "_" + strings.ToLower(propolisID)
}

const (
	// shutdownTimeout bounds the graceful shutdown once ctx ends. Long
	// polls end with ctx, so only short requests remain by then.
	shutdownTimeout = 2 * time.Second
	// maxBodyBytes caps a PUT body.
	maxBodyBytes = 64 << 10
)

// health is the body of GET /health: what zoneservice.Get reads, plus the
// status field of a propolis-style health answer.
type health struct {
	Status string `json:"status"`
	zoneservice.Health
}

// Serve listens on the TCP address addr and serves the VMM propolisID's
// simulated guest until ctx ends, then shuts down gracefully within a short
// bound. It returns nil after a shutdown caused by ctx.
func Serve(ctx context.Context, addr, propolisID string, opts Options) error {
	if err := checkID(propolisID); err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("vmm service: %w", err)
	}
	return ServeListener(ctx, ln, propolisID, opts)
}

// ServeListener is Serve on a listener the caller opened (tests listen on
// port 0). It closes ln.
func ServeListener(ctx context.Context, ln net.Listener, propolisID string, opts Options) error {
	if err := checkID(propolisID); err != nil {
		ln.Close()
		return err
	}
	h := health{Status: "ok", Health: zoneservice.Health{
		Zone:      ZoneName(propolisID),
		ID:        propolisID,
		Kind:      ZoneKind,
		PID:       os.Getpid(),
		StartedAt: time.Now().UTC(),
	}}
	hb, err := json.Marshal(h)
	if err != nil {
		ln.Close()
		return fmt.Errorf("vmm service: %w", err)
	}
	g := NewGuest(opts)
	defer g.Close()
	srv := &http.Server{
		Handler: newHandler(g, hb),
		// Requests live in ctx: when it ends, long polls answer at once
		// and Shutdown has only short requests to wait for.
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      MaxWait + 10*time.Second,
		IdleTimeout:       60 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("vmm service on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if err != nil {
		err = errors.Join(fmt.Errorf("vmm service: graceful shutdown: %w", err), srv.Close())
	}
	<-errc // Serve returns ErrServerClosed at once after Shutdown or Close
	return err
}

// checkID accepts only a UUID in its 36-character form: the id names the
// zone.
func checkID(id string) error {
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return fmt.Errorf("vmm service: propolis id %q is not a UUID", id)
	}
	return nil
}

// errorBody is the upstream error body.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// putStateBody is the body of PUT /state.
type putStateBody struct {
	State Request `json:"state"`
}

type handler struct {
	guest  *Guest
	health []byte
}

func newHandler(g *Guest, healthBody []byte) http.Handler {
	h := &handler{guest: g, health: healthBody}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", h.getHealth)
	mux.HandleFunc("GET /state", h.getState)
	mux.HandleFunc("PUT /state", h.putState)
	mux.HandleFunc("/health", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/state", methodNotAllowed("GET, HEAD, PUT"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "ObjectNotFound", "no such path: "+r.URL.Path)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", uuid.NewString())
		mux.ServeHTTP(w, r)
	})
}

func (h *handler) getHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(h.health)
}

func (h *handler) getState(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("after_gen") {
		if q.Has("wait") {
			writeError(w, http.StatusBadRequest, "InvalidRequest", "wait needs after_gen")
			return
		}
		writeJSON(w, http.StatusOK, h.guest.Status())
		return
	}
	after, err := strconv.ParseUint(q.Get("after_gen"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("after_gen %q: want a generation number", q.Get("after_gen")))
		return
	}
	wait := DefaultWait
	if q.Has("wait") {
		wait, err = time.ParseDuration(q.Get("wait"))
		if err != nil || wait < 0 || wait > MaxWait {
			writeError(w, http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("wait %q: want a duration from 0s to %s, e.g. 5s", q.Get("wait"), MaxWait))
			return
		}
	}
	st := h.guest.Status()
	if after > st.Gen {
		// The caller saw a generation this guest never had: it followed
		// another incarnation of the service. Answer at once so that it
		// notices.
		writeJSON(w, http.StatusOK, st)
		return
	}
	// The request's context ends when the client goes away or the server
	// shuts down: the wait ends with it and nothing is left behind.
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	st, _ = h.guest.Wait(ctx, after)
	writeJSON(w, http.StatusOK, st)
}

func (h *handler) putState(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("expected content type \"application/json\", got %q", ct))
			return
		}
	}
	body, err := decodeBody(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequest", "body: "+err.Error())
		return
	}
	if !body.State.valid() {
		writeError(w, http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("state %q: want %q, %q or %q", body.State, RequestRunning, RequestStopped, RequestReboot))
		return
	}
	st, err := h.guest.Request(body.State)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, st)
	case errors.Is(err, ErrInvalidTransition):
		writeError(w, http.StatusConflict, "InvalidTransition", err.Error())
	case errors.Is(err, errUnknownRequest):
		writeError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "Internal", err.Error())
	}
}

// decodeBody reads exactly one putStateBody object with a state and no
// other field.
func decodeBody(r io.Reader) (putStateBody, error) {
	var raw struct {
		State *Request `json:"state"`
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return putStateBody{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return putStateBody{}, errors.New("unexpected data after the JSON object")
	}
	if raw.State == nil {
		return putStateBody{}, errors.New(`missing field "state"`)
	}
	return putStateBody{State: *raw.State}, nil
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Internal", "encoding answer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(errorBody{RequestID: w.Header().Get("x-request-id"), ErrorCode: code, Message: msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
