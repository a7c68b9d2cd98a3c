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
//	PUT    /tunnel_endpoint  [TunnelOrigin, ...] → 204 (originate; idempotent)
//	DELETE /tunnel_endpoint  [TunnelOrigin, ...] → 204 (withdraw; absent is fine)
//	GET    /originated_tunnel_endpoints → 200 sorted [TunnelOrigin, ...]
//	GET    /tunnel_endpoints → 200 sorted [{"nexthop", "origin": TunnelOrigin}, ...]
//
// A TunnelOrigin is {"overlay_prefix": "<ip net>", "boundary_addr":
// "<ipv6>", "vni": <24 bits>, "metric": <u64, 0 if absent>}; unknown fields
// are ignored, as by ddmd, and a VNI over 24 bits is refused (ddmd stores
// it, but no Geneve header can carry it).
//
// Entries are keyed by address bits and width with host bits not masked, as
// in ddmd: fd00::1/64 and fd00::/64 are two entries. Tunnel origins are
// keyed by every field, as in ddmd: the same prefix at two metrics is two
// origins.
//
// Tunnel endpoints: ddmd answers GET /tunnel_endpoints with the routes it
// learned from its peers (the nexthop is the peer's address), not with what
// it originates. In a rack the sleds originate none: each switch's mgd
// originates boundary services (VNI 99), and every sled learns them through
// each switch, which hands every origin to all its peers, the originator
// included. One simulator stands for the whole underlay: every endpoint
// originated here (PUT by whoever plays the switch: a test, curl) is also
// answered as learned through one peer, Peer. Sleds sharing one simulator
// thus learn each other's endpoints as sleds of a rack do; they also share
// one originated set, which real sleds do not (a test that needs a set per
// sled runs a simulator per sled, and then nothing is learned across them).
// The learned routes are all of them, not ddmd's effective set (metric
// above zero preferred), as ddmd answers.
//
// Errors carry the upstream body {"request_id","error_code","message"}: 400
// for bad input or version, 404 for unknown paths, 405 for a wrong method,
// 500 for internal (simulated) failures.
//
// Simulator-only control endpoints, under /__sim/, need no api-version
// header and are not counted by Requests:
//
//	PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"} → 204
//	POST /__sim/restart-empty  → 204 (as RestartEmpty)
//	GET  /__sim/state          → 200 {"fault", "originated", "tunnel_originated", "requests"}
//
// A "refuse" fault closes the listener, so nothing can clear it over HTTP:
// give "refuse_for" (a Go duration; it implies "refuse") to have it clear
// itself, or use the Go API.
package ddmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// APIVersion is the newest api-version the simulator serves.
const APIVersion = "2.0.0"

// Fault is a failure the simulator is told to show (see simhttp.Fault).
type Fault = simhttp.Fault

// The faults, as described at simhttp.Fault.
const (
	FaultNone   = simhttp.FaultNone
	FaultRefuse = simhttp.FaultRefuse
	FaultHang   = simhttp.FaultHang
	FaultError  = simhttp.FaultError
)

// ErrClosed is returned by operations on a closed Server.
var ErrClosed = errors.New("ddmsim: server closed")

// httpServer names simhttp.Server for embedding without exporting it.
type httpServer = simhttp.Server

// Server is a simulated ddmd. It is safe for concurrent use; no lock is held
// while a request waits.
//
// Its HTTP side is a simhttp.Server, whose Start, Addr, URL, Close,
// Requests, Fault and SetFault it has. Requests are keyed "METHOD /path"
// (e.g. "PUT /prefix").
type Server struct {
	*httpServer

	// mu guards originated and tunnels. It is never held while calling
	// into httpServer.
	mu         sync.Mutex
	originated map[netip.Prefix]struct{}
	tunnels    map[ddm.TunnelOrigin]struct{} // originated tunnel endpoints
}

// New returns a simulator that is not listening yet. log may be nil.
func New(log *slog.Logger) *Server {
	s := &Server{originated: map[netip.Prefix]struct{}{}, tunnels: map[ddm.TunnelOrigin]struct{}{}}
	api := &simhttp.Router{}
	api.Handle("GET /originated", s.serveOriginated)
	api.Handle("PUT /prefix", s.servePrefix)
	api.Handle("DELETE /prefix", s.servePrefix)
	api.Handle("GET /peers", serveEmptyMap)
	api.Handle("GET /prefixes", serveEmptyMap)
	api.Handle("PUT /tunnel_endpoint", s.serveTunnel)
	api.Handle("DELETE /tunnel_endpoint", s.serveTunnel)
	api.Handle("GET /originated_tunnel_endpoints", s.serveOriginatedTunnels)
	api.Handle("GET /tunnel_endpoints", s.serveTunnelRoutes)
	control := &simhttp.Router{}
	control.Handle("GET /__sim/state", s.serveState)
	s.httpServer = simhttp.New(simhttp.Config{
		Name:       "ddm",
		APIVersion: APIVersion,
		Log:        log,
		ErrClosed:  ErrClosed,
		API:        api,
		Control:    control,
		Forget:     s.forget,
	})
	return s
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

// RestartEmpty simulates ddmd restarting: every originated prefix and
// tunnel endpoint is lost and every open connection is dropped, so in-flight requests fail and
// kept-alive connections are reset. The listener stays open and the fault
// stays in force.
func (s *Server) RestartEmpty() { s.httpServer.RestartEmpty() }

// forget drops every originated prefix and tunnel endpoint.
func (s *Server) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.originated)
	clear(s.tunnels)
}

func (s *Server) serveOriginated(rp *simhttp.Reply, _ *http.Request) {
	list := s.Originated()
	out := make([]string, len(list))
	for i, p := range list {
		out[i] = p.String()
	}
	rp.JSON(http.StatusOK, out)
}

// servePrefix serves PUT and DELETE /prefix.
func (s *Server) servePrefix(rp *simhttp.Reply, r *http.Request) {
	prefixes, err := readPrefixes(r)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
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
	rp.NoContent()
}

func serveEmptyMap(rp *simhttp.Reply, _ *http.Request) {
	rp.JSON(http.StatusOK, struct{}{})
}

// readPrefixes decodes a body that must be a JSON array of IPv6 nets.
func readPrefixes(r *http.Request) ([]netip.Prefix, error) {
	data, err := simhttp.ReadBody(r)
	if err != nil {
		return nil, err
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

// serveState serves GET /__sim/state.
func (s *Server) serveState(rp *simhttp.Reply, _ *http.Request) {
	st := struct {
		Fault            Fault              `json:"fault"`
		Originated       []netip.Prefix     `json:"originated"`
		TunnelOriginated []ddm.TunnelOrigin `json:"tunnel_originated"`
		Requests         map[string]int     `json:"requests"`
	}{s.Fault(), append([]netip.Prefix{}, s.Originated()...), append([]ddm.TunnelOrigin{}, s.TunnelOrigins()...), s.Requests()}
	rp.JSON(http.StatusOK, st)
}
