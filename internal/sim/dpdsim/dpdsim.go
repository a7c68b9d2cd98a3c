// Package dpdsim is a simulated dpd (dendrite's switch daemon): a real HTTP
// server speaking the NAT subset of its API the agent uses, with dpd's
// semantics and wire format, that tests can make refuse, hang, fail or
// restart.
//
// Served like dpd (every request needs an api-version header of 12.0.0 or
// older); {v} is ipv4 or ipv6, and {ip} must be of that family:
//
//	PUT    /nat/{v}/{ip}/{low}/{high}  NatTarget → 204; the same entry again is
//	                                   a no-op; any other overlap on {ip} is 409
//	                                   "conflicting mapping"; low > high is 400
//	GET    /nat/{v}/{ip}/{low}         → 200 NatTarget of the entry holding low,
//	                                   or 404 "no mapping"
//	DELETE /nat/{v}/{ip}/{low}         → 204, removing the entry holding low if any
//	GET    /nat/{v}                    → 200 page of external addresses in use
//	GET    /nat/{v}/{ip}               → 200 page of {"external","low","high","target"}
//	GET    /switch/identifiers         → 200 {"sidecar_id", "slot", ...}
//
// A NatTarget is {"internal_ip": "<ipv6>", "inner_mac": {"a": [six bytes]},
// "vni": <24 bits>}. Listings take the query parameters limit (at least 1)
// and page_token, answer {"items": [...], "next_page": "<token>"|null} with
// at most 64 items a page, sorted by address then low port, and end with a
// null next_page. Errors carry the upstream body
// {"request_id","error_code","message"}: 400 for bad input or version, 404
// for unknown paths, 405 for a wrong method, 409 for conflicts, 500 for
// simulated failures.
//
// Simulator-only control endpoints, under /__sim/, need no api-version
// header and are not counted by Requests:
//
//	PUT  /__sim/fault          {"fault": "none"|"hang"|"error"|"refuse", "refuse_for": "5s"} → 204
//	POST /__sim/restart-empty  → 204 (as RestartEmpty)
//	POST /__sim/inject         {"external","low","high","target"} → 204 (as Inject)
//	GET  /__sim/state          → 200 {"fault", "entries", "requests"}
//
// A "refuse" fault closes the listener, so nothing can clear it over HTTP:
// give "refuse_for" (a Go duration; it implies "refuse") to have it clear
// itself, or use the Go API.
package dpdsim

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// APIVersion is the newest api-version the simulator serves.
const APIVersion = "12.0.0"

// maxPageItems is the most items a listing page holds.
const maxPageItems = 64

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
var ErrClosed = errors.New("dpdsim: server closed")

// httpServer names simhttp.Server for embedding without exporting it.
type httpServer = simhttp.Server

// Server is a simulated dpd. It is safe for concurrent use; no lock is held
// while a request waits.
//
// Its HTTP side is a simhttp.Server, whose Start, Addr, URL, Close,
// Requests, Fault and SetFault it has. Requests are keyed by method and
// route pattern (e.g. "PUT /nat/ipv4/{ip}/{low}/{high}"; the path when no
// route matched).
type Server struct {
	*httpServer
	ids dpd.SwitchIdentifiers // fixed for the server's life

	// mu guards nat. It is never held while calling into httpServer.
	mu sync.Mutex
	// nat holds the entries of each external address (IPv4 and IPv6 in one
	// map: netip.Addr tells them apart), sorted by Low, ranges disjoint.
	nat map[netip.Addr][]dpd.NatEntry
}

// New returns a simulator of the dpd of the switch in slot (0 or 1) that is
// not listening yet. log may be nil.
func New(log *slog.Logger, slot uint16) *Server {
	id := uuid.New()
	s := &Server{
		ids: dpd.SwitchIdentifiers{
			SidecarID:   id.String(),
			Slot:        slot,
			Model:       "sim",
			Serial:      "SIM-" + strings.ToUpper(id.String()[:8]),
			AsicBackend: "sim",
			Revision:    0,
		},
		nat: map[netip.Addr][]dpd.NatEntry{},
	}
	api := &simhttp.Router{}
	for _, v6 := range []bool{false, true} {
		fam := "/nat/" + family(v6)
		api.Handle("PUT "+fam+"/{ip}/{low}/{high}", func(rp *simhttp.Reply, r *http.Request) { s.serveCreate(rp, r, v6) })
		api.Handle("GET "+fam+"/{ip}/{low}", func(rp *simhttp.Reply, r *http.Request) { s.serveGet(rp, r, v6) })
		api.Handle("DELETE "+fam+"/{ip}/{low}", func(rp *simhttp.Reply, r *http.Request) { s.serveDelete(rp, r, v6) })
		api.Handle("GET "+fam, func(rp *simhttp.Reply, r *http.Request) { s.serveAddresses(rp, r, v6) })
		api.Handle("GET "+fam+"/{ip}", func(rp *simhttp.Reply, r *http.Request) { s.serveEntries(rp, r, v6) })
	}
	api.Handle("GET /switch/identifiers", func(rp *simhttp.Reply, _ *http.Request) {
		rp.JSON(http.StatusOK, s.ids)
	})
	control := &simhttp.Router{}
	control.Handle("POST /__sim/inject", s.serveInject)
	control.Handle("GET /__sim/state", s.serveState)
	s.httpServer = simhttp.New(simhttp.Config{
		Name:       "dpd",
		APIVersion: APIVersion,
		Log:        log,
		ErrClosed:  ErrClosed,
		API:        api,
		Control:    control,
		Forget:     s.forget,
	})
	return s
}

func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

// SwitchIdentifiers is what GET /switch/identifiers answers.
func (s *Server) SwitchIdentifiers() dpd.SwitchIdentifiers { return s.ids }

// Entries is a snapshot of every NAT entry, IPv4 then IPv6, sorted by
// address then low port.
func (s *Server) Entries() []dpd.NatEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []dpd.NatEntry
	for _, a := range s.addressesLocked(func(netip.Addr) bool { return true }) {
		out = append(out, s.nat[a]...)
	}
	return out
}

// Lookup is the target of the entry holding port on ip, as the switch
// matches a packet from outside (its destination and L4 destination port or
// ICMP echo identifier).
func (s *Server) Lookup(ip netip.Addr, port uint16) (dpd.NatTarget, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.nat[ip.Unmap()] {
		if e.Low <= port && port <= e.High {
			return e.Target, true
		}
	}
	return dpd.NatTarget{}, false
}

// addressesLocked is the sorted addresses with entries that keep accepts.
func (s *Server) addressesLocked(keep func(netip.Addr) bool) []netip.Addr {
	var out []netip.Addr
	for a := range s.nat {
		if keep(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Inject adds e as if another sled had created it; entries on the same
// address whose ranges overlap e's are replaced. It panics on an entry dpd
// would refuse: that is a bug in the test.
func (s *Server) Inject(e dpd.NatEntry) {
	if err := checkEntry(e); err != nil {
		panic(fmt.Sprintf("dpdsim: Inject(%+v): %v", e, err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.injectLocked(e)
}

func (s *Server) injectLocked(e dpd.NatEntry) {
	s.nat[e.External] = slices.DeleteFunc(s.nat[e.External], func(x dpd.NatEntry) bool { return overlap(x, e.Low, e.High) })
	s.insertLocked(e)
}

// insertLocked adds e, which overlaps no entry.
func (s *Server) insertLocked(e dpd.NatEntry) {
	list := s.nat[e.External]
	i, _ := slices.BinarySearchFunc(list, e.Low, func(x dpd.NatEntry, low uint16) int { return int(x.Low) - int(low) })
	s.nat[e.External] = slices.Insert(list, i, e)
}

// checkEntry refuses what dpd would: an empty port range, an address
// with a zone, an internal address that is not IPv6, a VNI over 24 bits.
func checkEntry(e dpd.NatEntry) error {
	switch {
	case !e.External.IsValid() || e.External.Zone() != "":
		return fmt.Errorf("external address %q: want an IP address without a zone", e.External)
	case e.Low > e.High:
		return fmt.Errorf("low port %d is greater than high port %d", e.Low, e.High)
	}
	return checkTarget(e.Target)
}

func checkTarget(t dpd.NatTarget) error {
	switch {
	case !t.InternalIP.Is6() || t.InternalIP.Zone() != "":
		return fmt.Errorf("internal_ip %q: want an IPv6 address", t.InternalIP)
	case t.VNI > dpd.MaxVNI:
		return fmt.Errorf("vni %d: want at most %d", t.VNI, dpd.MaxVNI)
	}
	return nil
}

func overlap(x dpd.NatEntry, low, high uint16) bool { return x.Low <= high && low <= x.High }

// RestartEmpty simulates dpd restarting: every NAT entry is lost and every
// open connection is dropped, so in-flight requests fail and kept-alive
// connections are reset. The listener stays open, the fault stays in force
// and the switch identifiers stay the same.
func (s *Server) RestartEmpty() { s.httpServer.RestartEmpty() }

// forget drops every NAT entry.
func (s *Server) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.nat)
}

// pathAddr parses the {ip} path parameter, which must be of the route's
// family.
func pathAddr(r *http.Request, v6 bool) (netip.Addr, error) {
	raw := r.PathValue("ip")
	a, err := netip.ParseAddr(raw)
	if err != nil || a.Zone() != "" || a.Is6() != v6 {
		return netip.Addr{}, fmt.Errorf("bad parameter in URL path: unable to parse %q as an %s address", raw, family(v6))
	}
	return a, nil
}

// pathPort parses a port path parameter.
func pathPort(r *http.Request, name string) (uint16, error) {
	raw := r.PathValue(name)
	n, err := strconv.ParseUint(raw, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("bad parameter in URL path: unable to parse %q as %s: want an integer 0-65535", raw, name)
	}
	return uint16(n), nil
}

// pathEntry parses {ip} and {low}.
func pathEntry(r *http.Request, v6 bool) (netip.Addr, uint16, error) {
	a, err := pathAddr(r, v6)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	low, err := pathPort(r, "low")
	return a, low, err
}

func (s *Server) serveCreate(rp *simhttp.Reply, r *http.Request, v6 bool) {
	ip, low, err := pathEntry(r, v6)
	var high uint16
	if err == nil {
		high, err = pathPort(r, "high")
	}
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	data, err := simhttp.ReadBody(r)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	target, err := decodeTarget(data)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", "unable to parse JSON body: "+err.Error())
		return
	}
	e := dpd.NatEntry{External: ip, Low: low, High: high, Target: target}
	if err := checkEntry(e); err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	conflict, ok := s.createLocked(e)
	s.mu.Unlock()
	if !ok {
		rp.Error(http.StatusConflict, "conflicting mapping", fmt.Sprintf(
			"conflicting mapping: %s ports %d-%d overlap ports %d-%d mapped to %s (mac %s, vni %d)",
			ip, low, high, conflict.Low, conflict.High, conflict.Target.InternalIP, conflict.Target.InnerMAC, conflict.Target.VNI))
		return
	}
	rp.NoContent()
}

// createLocked adds e unless it overlaps an entry: the same entry again is
// a no-op; any other overlap refuses e and returns the entry in the way.
func (s *Server) createLocked(e dpd.NatEntry) (conflict dpd.NatEntry, ok bool) {
	for _, x := range s.nat[e.External] {
		if !overlap(x, e.Low, e.High) {
			continue
		}
		if x == e {
			return dpd.NatEntry{}, true
		}
		return x, false
	}
	s.insertLocked(e)
	return dpd.NatEntry{}, true
}

// decodeTarget decodes a NatTarget body strictly, as serde would: an
// object with every field, nothing after it.
func decodeTarget(data []byte) (dpd.NatTarget, error) {
	var raw struct {
		InternalIP *string      `json:"internal_ip"`
		InnerMAC   *dpd.MacAddr `json:"inner_mac"`
		VNI        *uint32      `json:"vni"`
	}
	if t := strings.TrimSpace(string(data)); !strings.HasPrefix(t, "{") {
		return dpd.NatTarget{}, errors.New("expected an object")
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return dpd.NatTarget{}, err
	}
	switch {
	case raw.InternalIP == nil:
		return dpd.NatTarget{}, errors.New("missing field `internal_ip`")
	case raw.InnerMAC == nil:
		return dpd.NatTarget{}, errors.New("missing field `inner_mac`")
	case raw.VNI == nil:
		return dpd.NatTarget{}, errors.New("missing field `vni`")
	}
	ip, err := netip.ParseAddr(*raw.InternalIP)
	if err != nil || !ip.Is6() || ip.Zone() != "" {
		return dpd.NatTarget{}, fmt.Errorf("internal_ip %q: want an IPv6 address", *raw.InternalIP)
	}
	t := dpd.NatTarget{InternalIP: ip, InnerMAC: *raw.InnerMAC, VNI: *raw.VNI}
	return t, checkTarget(t)
}

func (s *Server) serveGet(rp *simhttp.Reply, r *http.Request, v6 bool) {
	ip, low, err := pathEntry(r, v6)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	i := s.holdingLocked(ip, low)
	var t dpd.NatTarget
	if i >= 0 {
		t = s.nat[ip][i].Target
	}
	s.mu.Unlock()
	if i < 0 {
		rp.Error(http.StatusNotFound, "no mapping", fmt.Sprintf("no mapping for %s port %d", ip, low))
		return
	}
	rp.JSON(http.StatusOK, t)
}

// holdingLocked is the index in nat[ip] of the entry whose range holds
// port, or -1.
func (s *Server) holdingLocked(ip netip.Addr, port uint16) int {
	return slices.IndexFunc(s.nat[ip], func(x dpd.NatEntry) bool { return overlap(x, port, port) })
}

func (s *Server) serveDelete(rp *simhttp.Reply, r *http.Request, v6 bool) {
	ip, low, err := pathEntry(r, v6)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	if i := s.holdingLocked(ip, low); i >= 0 {
		s.nat[ip] = slices.Delete(s.nat[ip], i, i+1)
		if len(s.nat[ip]) == 0 {
			delete(s.nat, ip)
		}
	}
	s.mu.Unlock()
	rp.NoContent()
}

// page is a listing's answer.
type page[T any] struct {
	Items    []T     `json:"items"`
	NextPage *string `json:"next_page"`
}

// pageQuery parses limit and page_token. A token is base64url of the
// listing's name and the key of the last item served; a token for another
// listing is refused.
func pageQuery(r *http.Request, listing string) (limit int, after string, hasAfter bool, err error) {
	q := r.URL.Query()
	limit = maxPageItems
	if q.Has("limit") {
		n, err := strconv.ParseUint(q.Get("limit"), 10, 32)
		if err != nil || n == 0 {
			return 0, "", false, fmt.Errorf("unable to parse query string: limit %q: want an integer of at least 1", q.Get("limit"))
		}
		limit = int(min(n, maxPageItems))
	}
	tok := q.Get("page_token")
	if tok == "" {
		return limit, "", false, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	name, key, ok := strings.Cut(string(raw), "|")
	if err != nil || !ok || name != listing {
		return 0, "", false, fmt.Errorf("unable to parse query string: page_token %q: not a token of this listing", tok)
	}
	return limit, key, true, nil
}

func pageToken(listing, key string) *string {
	t := base64.RawURLEncoding.EncodeToString([]byte(listing + "|" + key))
	return &t
}

// firstAfter is the index of the first item of sorted that comes after a
// page token's key (len(sorted) when none does).
func firstAfter[T any](sorted []T, after func(T) bool) int {
	if i := slices.IndexFunc(sorted, after); i >= 0 {
		return i
	}
	return len(sorted)
}

// paginate serves one page of all, which is sorted; start is the index of
// the first item to serve.
func paginate[T any](rp *simhttp.Reply, all []T, start, limit int, listing string, key func(T) string) {
	end := min(start+limit, len(all))
	p := page[T]{Items: append(make([]T, 0, end-start), all[start:end]...)}
	if end < len(all) {
		p.NextPage = pageToken(listing, key(all[end-1]))
	}
	rp.JSON(http.StatusOK, p)
}

// serveAddresses serves GET /nat/{v}.
func (s *Server) serveAddresses(rp *simhttp.Reply, r *http.Request, v6 bool) {
	listing := family(v6)
	limit, after, hasAfter, err := pageQuery(r, listing)
	var from netip.Addr
	if err == nil && hasAfter {
		if from, err = netip.ParseAddr(after); err != nil || from.Is6() != v6 {
			err = errors.New("unable to parse query string: page_token: not a token of this listing")
		}
	}
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	addrs := s.addressesLocked(func(a netip.Addr) bool { return a.Is6() == v6 })
	s.mu.Unlock()
	start := 0
	if hasAfter {
		start = firstAfter(addrs, func(a netip.Addr) bool { return a.Compare(from) > 0 })
	}
	paginate(rp, addrs, start, limit, listing, netip.Addr.String)
}

// serveEntries serves GET /nat/{v}/{ip}.
func (s *Server) serveEntries(rp *simhttp.Reply, r *http.Request, v6 bool) {
	ip, err := pathAddr(r, v6)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	listing := ip.String()
	limit, after, hasAfter, err := pageQuery(r, listing)
	var from uint64
	if err == nil && hasAfter {
		if from, err = strconv.ParseUint(after, 10, 16); err != nil {
			err = errors.New("unable to parse query string: page_token: not a token of this listing")
		}
	}
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	entries := slices.Clone(s.nat[ip])
	s.mu.Unlock()
	start := 0
	if hasAfter {
		start = firstAfter(entries, func(e dpd.NatEntry) bool { return uint64(e.Low) > from })
	}
	paginate(rp, entries, start, limit, listing, func(e dpd.NatEntry) string { return strconv.Itoa(int(e.Low)) })
}

// serveInject serves POST /__sim/inject.
func (s *Server) serveInject(rp *simhttp.Reply, r *http.Request) {
	e, err := decodeEntry(r)
	if err == nil {
		err = checkEntry(e)
	}
	if err != nil {
		rp.Error(http.StatusBadRequest, "", "inject body: "+err.Error())
		return
	}
	s.mu.Lock()
	s.injectLocked(e)
	s.mu.Unlock()
	rp.NoContent()
}

// decodeEntry decodes a NatEntry body strictly: every field, no others.
func decodeEntry(r *http.Request) (dpd.NatEntry, error) {
	data, err := simhttp.ReadBody(r)
	if err != nil {
		return dpd.NatEntry{}, err
	}
	var raw struct {
		External *netip.Addr     `json:"external"`
		Low      *uint16         `json:"low"`
		High     *uint16         `json:"high"`
		Target   json.RawMessage `json:"target"`
	}
	if err := simhttp.DecodeStrict(bytes.NewReader(data), &raw); err != nil {
		return dpd.NatEntry{}, err
	}
	if raw.External == nil || raw.Low == nil || raw.High == nil || raw.Target == nil {
		return dpd.NatEntry{}, errors.New(`want "external", "low", "high" and "target"`)
	}
	t, err := decodeTarget(raw.Target)
	if err != nil {
		return dpd.NatEntry{}, fmt.Errorf("target: %w", err)
	}
	return dpd.NatEntry{External: *raw.External, Low: *raw.Low, High: *raw.High, Target: t}, nil
}

// serveState serves GET /__sim/state.
func (s *Server) serveState(rp *simhttp.Reply, _ *http.Request) {
	st := struct {
		Fault    Fault          `json:"fault"`
		Entries  []dpd.NatEntry `json:"entries"`
		Requests map[string]int `json:"requests"`
	}{s.Fault(), append([]dpd.NatEntry{}, s.Entries()...), s.Requests()}
	rp.JSON(http.StatusOK, st)
}
