// Package ddmsim is a simulated DDM admin server (maghemite's ddmd): a real
// HTTP server speaking the subset of the API the agent uses, with the real
// server's behaviour, that tests can make refuse, hang, fail or restart.
//
// Served like ddmd (every request needs an api-version header of 2.0.0 or
// older):
//
//	GET    /originated  → 200 sorted JSON array of originated prefixes
//	PUT    /prefix      ["<ipv6 net>", ...] → 204 (advertise; idempotent)
//	DELETE /prefix      ["<ipv6 net>", ...] → 204 (withdraw; absent is fine)
//	GET    /peers       → 200 {}
//	GET    /prefixes    → 200 {}
//
// Entries are keyed by address bits and width with host bits not masked, as
// in ddmd: fd00::1/64 and fd00::/64 are two entries. Errors carry the
// upstream body {"request_id","error_code","message"}: 400 for bad input or
// version, 404 for unknown paths, 405 for a wrong method, 500 for internal
// (simulated) failures.
//
// Simulator-only control endpoints, under /__sim/, need no api-version
// header and are not counted by Requests:
//
//	PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"} → 204
//	POST /__sim/restart-empty  → 204
//	GET  /__sim/state          → 200 {"fault", "originated", "requests"}
//
// A "refuse" fault closes the listener, so nothing can clear it over HTTP:
// give "refuse_for" (a Go duration; it implies "refuse") to have it clear
// itself, or use the Go API.
package ddmsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// APIVersion is the newest api-version the simulator serves.
const APIVersion = "2.0.0"

// maxBodyBytes bounds request bodies; bigger ones are refused with 400.
const maxBodyBytes = 1 << 20

// Fault is a failure the simulator is told to show.
type Fault string

const (
	// FaultNone: serve normally.
	FaultNone Fault = "none"
	// FaultRefuse: stop listening and drop every connection, so clients get
	// connection refused. Clearing it listens again on the same address.
	FaultRefuse Fault = "refuse"
	// FaultHang: requests hang until the client gives up or the fault is
	// cleared (then they are served as usual).
	FaultHang Fault = "hang"
	// FaultError: answer every request 500 with the upstream error body.
	FaultError Fault = "error"
)

func (f Fault) valid() bool {
	switch f {
	case FaultNone, FaultRefuse, FaultHang, FaultError:
		return true
	}
	return false
}

// ErrClosed is returned by operations on a closed Server.
var ErrClosed = errors.New("ddmsim: server closed")

// Server is a simulated ddmd. It is safe for concurrent use; no lock is held
// while a request waits.
type Server struct {
	log  *slog.Logger
	http *http.Server
	// running counts serve loops and handlers in flight. Add is only called
	// under mu while !closed, so Close's Wait sees every one of them.
	running sync.WaitGroup

	mu sync.Mutex
	// The fields below are guarded by mu.
	started, closed bool
	// addr is the address actually listened on (the port chosen by ":0"
	// included), kept so that re-listening reuses it.
	addr string
	// ln is the current listener; nil while refusing.
	ln net.Listener
	// conns are the open connections, dropped on refuse and restart.
	conns map[net.Conn]struct{}
	fault Fault
	// faultGen counts fault changes, so a "refuse_for" timer only clears
	// the fault it set.
	faultGen    uint64
	refuseTimer *time.Timer
	// hangRelease is non-nil while fault is FaultHang; it is closed when the
	// fault changes or the server closes, waking the hanging requests.
	hangRelease chan struct{}
	originated  map[netip.Prefix]struct{}
	requests    map[string]int // "METHOD /path" → count
}

// connKey is the request context key of the request's connection.
type connKey struct{}

// New returns a simulator that is not listening yet. log may be nil.
func New(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		log:        log,
		conns:      map[net.Conn]struct{}{},
		fault:      FaultNone,
		originated: map[netip.Prefix]struct{}{},
		requests:   map[string]int{},
	}
	s.http = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: 10 * time.Second,
		ConnState:         s.connState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return s
}

// Start listens on addr (e.g. "127.0.0.1:0" or "[::1]:8000") and serves in
// the background until Close.
func (s *Server) Start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.started:
		return fmt.Errorf("ddmsim: already started on %s", s.addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ddmsim: %w", err)
	}
	s.started = true
	s.addr = ln.Addr().String()
	if s.fault == FaultRefuse {
		ln.Close() // told to refuse before starting: keep only the address
	} else {
		s.serveLocked(ln)
	}
	s.log.Info("ddm simulator listening", "addr", s.addr)
	return nil
}

// serveLocked serves ln in the background.
func (s *Server) serveLocked(ln net.Listener) {
	s.ln = ln
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		err := s.http.Serve(ln)
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("ddm simulator stopped serving", "err", err)
		}
	}()
}

// Addr is the address the simulator listens on, once started.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URL is the simulator's base URL, "http://" + Addr().
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops the simulator: it stops listening, drops every connection
// and returns once every handler and serve loop has returned.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.ln = nil
	if s.hangRelease != nil {
		close(s.hangRelease)
		s.hangRelease = nil
	}
	if s.refuseTimer != nil {
		s.refuseTimer.Stop()
		s.refuseTimer = nil
	}
	s.mu.Unlock()
	err := s.http.Close()
	s.running.Wait()
	return err
}

// Originated is a sorted snapshot of the originated prefixes.
func (s *Server) Originated() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.originatedLocked()
}

func (s *Server) originatedLocked() []netip.Prefix {
	return slices.SortedFunc(maps.Keys(s.originated), comparePrefix)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Inject makes prefixes appear as originated, as if another process had
// advertised them. It panics on a prefix that is not IPv6: that is a bug in
// the test.
func (s *Server) Inject(prefixes ...netip.Prefix) {
	for _, p := range prefixes {
		if !p.IsValid() || !p.Addr().Is6() {
			panic(fmt.Sprintf("ddmsim: Inject(%v): not an IPv6 prefix", p))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range prefixes {
		s.originated[p] = struct{}{}
	}
}

// Requests counts the API requests received, keyed "METHOD /path" (e.g.
// "PUT /prefix"), whatever their outcome. Control requests are not counted.
func (s *Server) Requests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.requests)
}

// Fault is the fault in force.
func (s *Server) Fault() Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// RestartEmpty simulates ddmd restarting: every originated prefix is lost
// and every open connection is dropped, so in-flight requests fail and
// kept-alive connections are reset. The listener stays open and the fault
// stays in force.
func (s *Server) RestartEmpty() { s.restartEmpty(nil) }

func (s *Server) restartEmpty(keep net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.originated)
	s.dropConnsLocked(keep)
	s.log.Info("ddm simulator restarted empty")
}

// SetFault puts f in force, replacing any other fault. Clearing FaultRefuse
// listens again on the same address, which fails if someone else took it;
// the fault then stays FaultRefuse.
func (s *Server) SetFault(f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setFaultLocked(f, 0, nil)
}

// setFaultLocked puts f in force; a refuseFor > 0 clears FaultRefuse after
// that long. keep is a connection not to drop (a control request's own).
func (s *Server) setFaultLocked(f Fault, refuseFor time.Duration, keep net.Conn) error {
	if f == "" {
		f = FaultNone
	}
	if !f.valid() {
		return fmt.Errorf("ddmsim: unknown fault %q", f)
	}
	if s.closed {
		return ErrClosed
	}
	if f != FaultRefuse && s.started && s.ln == nil {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("ddmsim: listening again: %w", err)
		}
		s.serveLocked(ln)
	}
	if s.refuseTimer != nil {
		s.refuseTimer.Stop()
		s.refuseTimer = nil
	}
	s.faultGen++
	if s.fault == FaultHang && f != FaultHang {
		close(s.hangRelease)
		s.hangRelease = nil
	}
	if f == FaultHang && s.fault != FaultHang {
		s.hangRelease = make(chan struct{})
	}
	if f == FaultRefuse {
		if s.ln != nil {
			s.ln.Close()
			s.ln = nil
		}
		s.dropConnsLocked(keep)
		if refuseFor > 0 {
			gen := s.faultGen
			s.refuseTimer = time.AfterFunc(refuseFor, func() { s.endRefuse(gen) })
		}
	}
	s.log.Info("ddm simulator fault", "fault", f, "was", s.fault)
	s.fault = f
	return nil
}

// endRefuse clears the timed refuse fault of generation gen, unless another
// fault was set since.
func (s *Server) endRefuse(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.faultGen != gen {
		return
	}
	if err := s.setFaultLocked(FaultNone, 0, nil); err != nil {
		s.log.Error("ddm simulator could not end the refuse fault", "err", err)
	}
}

// dropConnsLocked closes every open connection but keep.
func (s *Server) dropConnsLocked(keep net.Conn) {
	for c := range s.conns {
		if c != keep {
			c.Close()
		}
	}
}

func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// errorBody is the upstream error body.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

// reply writes answers and remembers the status for the log.
type reply struct {
	w      http.ResponseWriter
	id     string
	status int
}

func (r *reply) json(status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		r.error(http.StatusInternalServerError, "Internal", "encoding answer: "+err.Error())
		return
	}
	r.status = status
	r.w.Header().Set("Content-Type", "application/json")
	r.w.WriteHeader(status)
	r.w.Write(b)
}

func (r *reply) noContent() {
	r.status = http.StatusNoContent
	r.w.WriteHeader(http.StatusNoContent)
}

func (r *reply) error(status int, code, msg string) {
	r.json(status, errorBody{RequestID: r.id, ErrorCode: code, Message: msg})
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/__sim/") {
		s.serveControl(w, r)
		return
	}
	rp := &reply{w: w, id: uuid.NewString()}
	w.Header().Set("x-request-id", rp.id)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		// End the connection without an answer: returning would make
		// net/http answer 200 with no body.
		panic(http.ErrAbortHandler)
	}
	s.running.Add(1)
	defer s.running.Done()
	s.requests[r.Method+" "+r.URL.Path]++
	s.mu.Unlock()

	switch s.waitOutFault(r.Context(), rp) {
	case answered:
		return
	case dropped:
		panic(http.ErrAbortHandler) // no answer, as from a daemon gone away
	}
	defer func() {
		s.log.Debug("ddm request", "method", r.Method, "path", r.URL.Path, "status", rp.status, "request_id", rp.id)
	}()
	if err := checkVersion(r.Header.Get("api-version")); err != nil {
		rp.error(http.StatusBadRequest, "", err.Error())
		return
	}
	allow := map[string][]string{
		"/originated": {http.MethodGet},
		"/prefix":     {http.MethodPut, http.MethodDelete},
		"/peers":      {http.MethodGet},
		"/prefixes":   {http.MethodGet},
	}[r.URL.Path]
	switch {
	case allow == nil:
		rp.error(http.StatusNotFound, "", "Not Found")
		return
	case !slices.Contains(allow, r.Method):
		w.Header().Set("Allow", strings.Join(allow, ", "))
		rp.error(http.StatusMethodNotAllowed, "", "Method Not Allowed")
		return
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /originated":
		s.mu.Lock()
		list := s.originatedLocked()
		s.mu.Unlock()
		out := make([]string, len(list))
		for i, p := range list {
			out[i] = p.String()
		}
		rp.json(http.StatusOK, out)
	case "PUT /prefix", "DELETE /prefix":
		prefixes, err := readPrefixes(r)
		if err != nil {
			rp.error(http.StatusBadRequest, "", err.Error())
			return
		}
		s.mu.Lock()
		for _, p := range prefixes {
			if r.Method == http.MethodPut {
				s.originated[p] = struct{}{}
			} else {
				delete(s.originated, p)
			}
		}
		s.mu.Unlock()
		rp.noContent()
	case "GET /peers", "GET /prefixes":
		rp.json(http.StatusOK, struct{}{})
	}
}

// faultOutcome is what the fault in force does to a request.
type faultOutcome int

const (
	serve    faultOutcome = iota // serve it
	answered                     // an answer was written, or the client left
	dropped                      // the connection is being dropped
)

// waitOutFault applies the fault in force to a request.
func (s *Server) waitOutFault(ctx context.Context, rp *reply) faultOutcome {
	for {
		s.mu.Lock()
		fault, release, closed := s.fault, s.hangRelease, s.closed
		s.mu.Unlock()
		switch {
		case closed, fault == FaultRefuse:
			return dropped
		case fault == FaultError:
			rp.error(http.StatusInternalServerError, "Internal", "simulated internal error")
			return answered
		case fault == FaultHang:
			select {
			case <-ctx.Done():
				return answered
			case <-release:
				// The fault changed (or the server closed): look again.
			}
		default:
			return serve
		}
	}
}

// checkVersion refuses a missing or malformed api-version, or one newer
// than APIVersion, as ddmd does.
func checkVersion(v string) error {
	if v == "" {
		return errors.New(`missing expected header "api-version"`)
	}
	got, ok := parseSemver(v)
	if !ok {
		return fmt.Errorf("api-version %q is not a semantic version", v)
	}
	// A pre-release of a version is older than it, so comparing the cores
	// is enough: 2.0.0-rc1 is served, 2.0.1-rc1 is not.
	want, _ := parseSemver(APIVersion)
	if slices.Compare(got[:], want[:]) > 0 {
		return fmt.Errorf("server does not support this API version: %s", v)
	}
	return nil
}

// parseSemver parses MAJOR.MINOR.PATCH[-PRE][+BUILD] and returns the core.
func parseSemver(v string) (core [3]uint64, ok bool) {
	rest, build, hasBuild := strings.Cut(v, "+")
	if hasBuild && !validIdents(build, false) {
		return core, false
	}
	rest, pre, hasPre := strings.Cut(rest, "-")
	if hasPre && !validIdents(pre, true) {
		return core, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return core, false
	}
	for i, p := range parts {
		if !numeric(p) {
			return core, false
		}
		var n uint64
		for _, c := range p {
			n = n*10 + uint64(c-'0')
		}
		core[i] = n
	}
	return core, true
}

// numeric reports whether p is a number without leading zeros that fits
// comfortably in a uint64.
func numeric(p string) bool {
	if p == "" || len(p) > 18 || (len(p) > 1 && p[0] == '0') {
		return false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validIdents checks dot-separated semver identifiers.
func validIdents(s string, pre bool) bool {
	for id := range strings.SplitSeq(s, ".") {
		if id == "" {
			return false
		}
		allDigits := true
		for _, c := range id {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				allDigits = false
			default:
				return false
			}
		}
		if pre && allDigits && len(id) > 1 && id[0] == '0' {
			return false
		}
	}
	return true
}

// readPrefixes decodes a body that must be a JSON array of IPv6 nets.
func readPrefixes(r *http.Request) ([]netip.Prefix, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, fmt.Errorf("expected content type \"application/json\", got %q", ct)
		}
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading body: %w", err)
	}
	if len(data) > maxBodyBytes {
		return nil, fmt.Errorf("request body exceeded maximum size of %d bytes", maxBodyBytes)
	}
	var raw []string
	if trimmed := strings.TrimSpace(string(data)); !strings.HasPrefix(trimmed, "[") {
		return nil, errors.New("unable to parse JSON body: expected an array of IPv6 nets")
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("unable to parse JSON body: %w", err)
	}
	out := make([]netip.Prefix, 0, len(raw))
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is6() {
			return nil, fmt.Errorf("unable to parse JSON body: %q is not an IPv6 net", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// serveControl serves the simulator-only /__sim/ endpoints.
func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	rp := &reply{w: w, id: uuid.NewString()}
	w.Header().Set("x-request-id", rp.id)
	conn, _ := r.Context().Value(connKey{}).(net.Conn)
	switch r.Method + " " + r.URL.Path {
	case "PUT /__sim/fault":
		var req struct {
			Fault     Fault  `json:"fault"`
			RefuseFor string `json:"refuse_for"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			rp.error(http.StatusBadRequest, "", "fault body: "+err.Error())
			return
		}
		var d time.Duration
		if req.RefuseFor != "" {
			var err error
			if d, err = time.ParseDuration(req.RefuseFor); err != nil || d <= 0 {
				rp.error(http.StatusBadRequest, "", fmt.Sprintf("refuse_for %q: want a positive Go duration like 5s", req.RefuseFor))
				return
			}
			if req.Fault == "" {
				req.Fault = FaultRefuse
			}
			if req.Fault != FaultRefuse {
				rp.error(http.StatusBadRequest, "", "refuse_for goes with fault \"refuse\" only")
				return
			}
		}
		if req.Fault == "" || !req.Fault.valid() {
			rp.error(http.StatusBadRequest, "", fmt.Sprintf("fault %q: want none, hang, error or refuse", req.Fault))
			return
		}
		s.mu.Lock()
		err := s.setFaultLocked(req.Fault, d, conn)
		s.mu.Unlock()
		if err != nil {
			rp.error(http.StatusInternalServerError, "Internal", err.Error())
			return
		}
		if req.Fault == FaultRefuse {
			// Nothing listens any more: do not keep this connection alive.
			w.Header().Set("Connection", "close")
		}
		rp.noContent()
	case "POST /__sim/restart-empty":
		s.restartEmpty(conn)
		rp.noContent()
	case "GET /__sim/state":
		s.mu.Lock()
		st := struct {
			Fault      Fault          `json:"fault"`
			Originated []netip.Prefix `json:"originated"`
			Requests   map[string]int `json:"requests"`
		}{s.fault, append([]netip.Prefix{}, s.originatedLocked()...), maps.Clone(s.requests)}
		s.mu.Unlock()
		rp.json(http.StatusOK, st)
	default:
		rp.error(http.StatusNotFound, "", "Not Found")
	}
}
