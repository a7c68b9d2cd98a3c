// Package simhttp serves a simulated daemon's HTTP API the way the upstream
// dropshot servers do (api-version check, upstream error body, 404/405),
// with faults tests can inject: refuse, hang, error, and dropped connections.
//
// A simulator supplies its routes, its own /__sim/ control endpoints and
// how to forget its state; simhttp serves these two itself:
//
//	PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"} → 204
//	POST /__sim/restart-empty  → 204 (as Server.RestartEmpty)
//
// A "refuse" fault closes the listener, so nothing can clear it over HTTP:
// "refuse_for" (a Go duration; it implies "refuse") has it clear itself.
package simhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

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

// Valid reports whether f is one of the faults above.
func (f Fault) Valid() bool {
	switch f {
	case FaultNone, FaultRefuse, FaultHang, FaultError:
		return true
	}
	return false
}

// Config describes one simulated daemon.
type Config struct {
	// Name is the daemon's short name, e.g. "ddm": logs say "ddm
	// simulator …" and errors start "ddmsim: ".
	Name string
	// APIVersion is the newest api-version served.
	APIVersion string
	// Log may be nil.
	Log *slog.Logger
	// ErrClosed is returned by operations on a closed Server.
	ErrClosed error
	// API serves the daemon's endpoints. Requests to it are counted,
	// subject to the fault in force, and need an api-version header.
	API *Router
	// Control serves the simulator's /__sim/ endpoints besides
	// PUT /__sim/fault and POST /__sim/restart-empty; nil serves only those.
	Control *Router
	// Forget drops the daemon's state when it restarts empty; nil for a
	// daemon without state. It is called with no lock of the Server held.
	Forget func()
	// BodyReadTimeout, if set, replaces every route's body read deadline
	// (tests).
	BodyReadTimeout time.Duration
}

// Server is the HTTP side of a simulator. It is safe for concurrent use; no
// lock is held while a request waits or a handler runs.
type Server struct {
	cfg  Config
	log  *slog.Logger
	pkg  string // error prefix, e.g. "ddmsim"
	http *http.Server
	// running counts serve loops and API handlers in flight. Add is only
	// called under mu while !closed, so Close's Wait sees every one of them.
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
	requests    map[string]int // "METHOD /route" → count
}

// connKey is the request context key of the request's connection.
type connKey struct{}

// Conn is the connection r arrived on (nil outside a Server).
func Conn(r *http.Request) net.Conn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	return c
}

// New returns a server that is not listening yet.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.API == nil {
		cfg.API = &Router{}
	}
	if cfg.Control == nil {
		cfg.Control = &Router{}
	}
	if cfg.Forget == nil {
		cfg.Forget = func() {}
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Log,
		pkg:      cfg.Name + "sim",
		conns:    map[net.Conn]struct{}{},
		fault:    FaultNone,
		requests: map[string]int{},
	}
	s.http = httpbound.NewServer(http.HandlerFunc(s.serveHTTP))
	boundState, boundContext := s.http.ConnState, s.http.ConnContext
	s.http.ConnState = func(c net.Conn, st http.ConnState) {
		boundState(c, st)
		s.connState(c, st)
	}
	s.http.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(boundContext(ctx, c), connKey{}, c)
	}
	s.http.ErrorLog = slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug)
	return s
}

// builtins are the control routes simhttp serves itself.
var builtins = []Operation{
	{http.MethodPut, "/__sim/fault", BodyBounds(http.MethodPut)},
	{http.MethodPost, "/__sim/restart-empty", BodyBounds(http.MethodPost)},
}

// Operations lists every route served: the API's, then the control ones.
func (s *Server) Operations() []Operation {
	ops := append(s.cfg.API.Operations(), builtins...)
	return append(ops, s.cfg.Control.Operations()...)
}

// bounds is rt with the configured read deadline.
func (s *Server) bounds(rt httpbound.Route) httpbound.Route {
	if s.cfg.BodyReadTimeout > 0 {
		rt.ReadTimeout = s.cfg.BodyReadTimeout
	}
	return rt
}

// Start listens on addr (e.g. "127.0.0.1:0" or "[::1]:8000") and serves in
// the background until Close.
func (s *Server) Start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return s.cfg.ErrClosed
	case s.started:
		return fmt.Errorf("%s: already started on %s", s.pkg, s.addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", s.pkg, err)
	}
	s.started = true
	s.addr = ln.Addr().String()
	if s.fault == FaultRefuse {
		ln.Close() // told to refuse before starting: keep only the address
	} else {
		s.serveLocked(ln)
	}
	s.log.Info(s.cfg.Name+" simulator listening", "addr", s.addr)
	return nil
}

// serveLocked serves ln in the background.
func (s *Server) serveLocked(ln net.Listener) {
	s.ln = ln
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		err := s.http.Serve(httpbound.Listener(ln, httpbound.MaxConns(), s.log))
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error(s.cfg.Name+" simulator stopped serving", "err", err)
		}
	}()
}

// Addr is the address the server listens on, once started.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URL is the server's base URL, "http://" + Addr().
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops the server: it stops listening, drops every connection and
// returns once every API handler and serve loop has returned.
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

// Requests counts the API requests received, keyed "METHOD /route" (the
// route pattern, e.g. "GET /nat/ipv4/{ip}", or the path when no route
// matched), whatever their outcome. Control requests are not counted.
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

// RestartEmpty simulates the daemon restarting: Config.Forget drops its
// state and every open connection is dropped, so in-flight requests fail
// and kept-alive connections are reset. The listener stays open and the
// fault stays in force.
func (s *Server) RestartEmpty() { s.restartEmpty(nil) }

// restartEmpty is RestartEmpty, keeping the connection keep (which may be
// nil) open.
func (s *Server) restartEmpty(keep net.Conn) {
	s.cfg.Forget()
	s.mu.Lock()
	s.dropConnsLocked(keep)
	s.mu.Unlock()
	s.log.Info(s.cfg.Name + " simulator restarted empty")
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
	if !f.Valid() {
		return fmt.Errorf("%s: unknown fault %q", s.pkg, f)
	}
	if s.closed {
		return s.cfg.ErrClosed
	}
	if f != FaultRefuse && s.started && s.ln == nil {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("%s: listening again: %w", s.pkg, err)
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
	s.log.Info(s.cfg.Name+" simulator fault", "fault", f, "was", s.fault)
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
		s.log.Error(s.cfg.Name+" simulator could not end the refuse fault", "err", err)
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

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/__sim/") {
		s.serveControl(w, r)
		return
	}
	rp := newReply(w)
	route, h, allow, bounds := s.cfg.API.match(r)

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		// End the connection without an answer: returning would make
		// net/http answer 200 with no body.
		panic(http.ErrAbortHandler)
	}
	s.running.Add(1)
	defer s.running.Done()
	s.requests[r.Method+" "+route]++
	s.mu.Unlock()

	switch s.waitOutFault(r.Context(), rp) {
	case answered:
		return
	case dropped:
		panic(http.ErrAbortHandler) // no answer, as from a daemon gone away
	}
	defer func() {
		s.log.Debug(s.cfg.Name+" request", "method", r.Method, "path", r.URL.Path, "status", rp.status, "request_id", rp.id)
	}()
	if !rp.bound(r, s.bounds(bounds)) {
		return
	}
	// The version is checked before the path, as in dropshot.
	if err := CheckVersion(r.Header.Get("api-version"), s.cfg.APIVersion); err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	switch {
	case h != nil:
		h(rp, r)
	case allow != nil:
		w.Header().Set("Allow", strings.Join(allow, ", "))
		rp.Error(http.StatusMethodNotAllowed, "", "Method Not Allowed")
	default:
		rp.Error(http.StatusNotFound, "", "Not Found")
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
func (s *Server) waitOutFault(ctx context.Context, rp *Reply) faultOutcome {
	for {
		s.mu.Lock()
		fault, release, closed := s.fault, s.hangRelease, s.closed
		s.mu.Unlock()
		switch {
		case closed, fault == FaultRefuse:
			return dropped
		case fault == FaultError:
			rp.Error(http.StatusInternalServerError, "Internal", "simulated internal error")
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

// serveControl serves the simulator-only /__sim/ endpoints.
func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	rp := newReply(w)
	_, h, _, bounds := s.cfg.Control.match(r)
	for _, b := range builtins {
		if r.Method == b.Method && r.URL.Path == b.Path {
			bounds = b.Bounds
		}
	}
	if !rp.bound(r, s.bounds(bounds)) {
		return
	}
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/__sim/fault":
		s.serveFault(rp, r)
		return
	case r.Method == http.MethodPost && r.URL.Path == "/__sim/restart-empty":
		s.restartEmpty(Conn(r))
		rp.NoContent()
		return
	}
	if h != nil {
		h(rp, r)
		return
	}
	rp.Error(http.StatusNotFound, "", "Not Found")
}

// serveFault serves PUT /__sim/fault.
func (s *Server) serveFault(rp *Reply, r *http.Request) {
	var req struct {
		Fault     Fault  `json:"fault"`
		RefuseFor string `json:"refuse_for"`
	}
	if err := DecodeStrict(r.Body, &req); err != nil { // bounded by BodyBounds
		rp.Error(http.StatusBadRequest, "", "fault body: "+err.Error())
		return
	}
	var d time.Duration
	if req.RefuseFor != "" {
		var err error
		if d, err = time.ParseDuration(req.RefuseFor); err != nil || d <= 0 {
			rp.Error(http.StatusBadRequest, "", fmt.Sprintf("refuse_for %q: want a positive Go duration like 5s", req.RefuseFor))
			return
		}
		if req.Fault == "" {
			req.Fault = FaultRefuse
		}
		if req.Fault != FaultRefuse {
			rp.Error(http.StatusBadRequest, "", "refuse_for goes with fault \"refuse\" only")
			return
		}
	}
	if req.Fault == "" || !req.Fault.Valid() {
		rp.Error(http.StatusBadRequest, "", fmt.Sprintf("fault %q: want none, hang, error or refuse", req.Fault))
		return
	}
	s.mu.Lock()
	err := s.setFaultLocked(req.Fault, d, Conn(r))
	s.mu.Unlock()
	if err != nil {
		rp.Error(http.StatusInternalServerError, "Internal", err.Error())
		return
	}
	if req.Fault == FaultRefuse {
		// Nothing listens any more: do not keep this connection alive.
		rp.Header().Set("Connection", "close")
	}
	rp.NoContent()
}
