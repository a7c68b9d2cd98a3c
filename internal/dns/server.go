package dns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	miekg "github.com/miekg/dns"
)

// Records are the records a Server serves. Names are fully qualified, in
// the zone, without the trailing dot (one is tolerated), e.g.
// "_dendrite._tcp.control-plane.oxide.internal"; case does not matter.
// A name listed with no records exists but has none of that type.
type Records struct {
	// SRV maps a service name, _<service>._<proto>.<zone>, to its records.
	SRV map[string][]SRV `json:"srv"`
	// AAAA maps a host name to its IPv6 addresses.
	AAAA map[string][]netip.Addr `json:"aaaa"`
}

// SRV is one SRV record.
type SRV struct {
	// Target is the host name offering the service, e.g.
	// "dendrite-<sled uuid>.host.control-plane.oxide.internal", or "."
	// for none.
	Target   string `json:"target"`
	Port     uint16 `json:"port"`
	Priority uint16 `json:"priority"`
	Weight   uint16 `json:"weight"`
}

// SwitchRecords are the records that name the given switch daemons (dpd),
// as the rack's internal DNS does: SRV _dendrite._tcp with one target per
// daemon (its port), and the AAAA of each target. Development and tests
// serve them.
func SwitchRecords(daemons ...netip.AddrPort) Records {
	return ServiceRecords(switchService, daemons...)
}

// ServiceRecords are the records that name a service's servers: SRV
// _<service>._tcp with one target per server (its port),
// "<service>-<n>.host.control-plane.oxide.internal", and the AAAA of each
// target.
func ServiceRecords(service string, servers ...netip.AddrPort) Records {
	r := Records{SRV: map[string][]SRV{}, AAAA: map[string][]netip.Addr{}}
	name := "_" + service + "._tcp." + Zone
	for i, d := range servers {
		host := fmt.Sprintf("%s-%d.host.%s", service, i, Zone)
		r.SRV[name] = append(r.SRV[name], SRV{Target: host, Port: d.Port()})
		r.AAAA[host] = []netip.Addr{d.Addr()}
	}
	return r
}

// Merge adds other's records to r's (r's maps must not be nil).
func (r Records) Merge(other Records) {
	for k, v := range other.SRV {
		r.SRV[k] = append(r.SRV[k], v...)
	}
	for k, v := range other.AAAA {
		r.AAAA[k] = append(r.AAAA[k], v...)
	}
}

// Validate checks every name, target, port and address. The error names
// every bad entry.
func (r Records) Validate() error {
	var errs []error
	seen := map[string]string{} // canonical name → the first key with it, per map
	for _, key := range slices.Sorted(maps.Keys(r.SRV)) {
		name, err := checkName(key)
		if err == nil {
			err = checkServiceName(name)
		}
		if err == nil {
			err = notSeen(seen, name, key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("srv %q: %w", key, err))
			continue
		}
		for i, s := range r.SRV[key] {
			if err := checkSRV(s); err != nil {
				errs = append(errs, fmt.Errorf("srv %q [%d]: %w", key, i, err))
			}
		}
	}
	clear(seen)
	for _, key := range slices.Sorted(maps.Keys(r.AAAA)) {
		name, err := checkName(key)
		if err == nil {
			err = notSeen(seen, name, key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("aaaa %q: %w", key, err))
			continue
		}
		for i, a := range r.AAAA[key] {
			if !a.Is6() || a.Is4In6() || a.Zone() != "" {
				errs = append(errs, fmt.Errorf("aaaa %q [%d]: %q is not an IPv6 address without a zone", key, i, a))
			}
		}
	}
	return errors.Join(errs...)
}

// zoneFQDN is Zone with its trailing dot.
const zoneFQDN = Zone + "."

// checkName returns the canonical form (lower case, trailing dot) of a name
// in the zone.
func checkName(key string) (string, error) {
	name := miekg.CanonicalName(key)
	if _, ok := miekg.IsDomainName(name); !ok || key == "" || strings.HasSuffix(key, "..") {
		return "", errors.New("not a domain name")
	}
	if !miekg.IsSubDomain(zoneFQDN, name) {
		return "", fmt.Errorf("not in the zone %s", Zone)
	}
	return name, nil
}

// checkServiceName accepts _<service>._<proto>.<name in the zone>.
func checkServiceName(name string) error {
	labels := miekg.SplitDomainName(name)
	if len(labels) < 2+miekg.CountLabel(zoneFQDN) ||
		!strings.HasPrefix(labels[0], "_") || !strings.HasPrefix(labels[1], "_") {
		return fmt.Errorf("not a service name _<service>._<proto>.%s", Zone)
	}
	return nil
}

func notSeen(seen map[string]string, name, key string) error {
	if first, ok := seen[name]; ok {
		return fmt.Errorf("the same name as %q", first)
	}
	seen[name] = key
	return nil
}

func checkSRV(s SRV) error {
	if s.Port == 0 {
		return errors.New("port 0")
	}
	// "." is allowed: the service is decidedly not available (RFC 2782).
	if _, ok := miekg.IsDomainName(s.Target); !ok || s.Target == "" {
		return fmt.Errorf("target %q: not a domain name", s.Target)
	}
	return nil
}

// Fault is a failure a Server is told to show.
type Fault int

const (
	// FaultNone: answer normally.
	FaultNone Fault = iota
	// FaultDrop: silently drop every query, so clients time out.
	FaultDrop
	// FaultServfail: answer every query SERVFAIL.
	FaultServfail
)

func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultDrop:
		return "drop"
	case FaultServfail:
		return "servfail"
	}
	return fmt.Sprintf("fault %d", int(f))
}

// defaultWatchInterval is how often WatchFile looks at the file.
const defaultWatchInterval = 500 * time.Millisecond

// Server is an authoritative DNS server for the zone, serving Records over
// UDP and TCP on one address, for development and tests. Every answer has
// TTL 0, so changes are seen at once. It is safe for concurrent use.
type Server struct {
	log *slog.Logger
	// watchInterval is how often WatchFile polls; tests shorten it.
	watchInterval time.Duration
	// running counts the serve loops, so that Close can wait for them.
	running sync.WaitGroup

	mu sync.Mutex
	// The fields below are guarded by mu.
	started, closed bool
	addr            netip.AddrPort
	udp, tcp        *miekg.Server
	zone            *zone
	fault           Fault
	// serial counts record changes; it is the SOA serial.
	serial uint32
	// loaded is what each file last loaded by LoadFile looked like, the
	// starting point of WatchFile.
	loaded map[string]os.FileInfo
	// queries counts queries by transport ("udp", "tcp").
	queries map[string]int
}

// NewServer returns a server with no records that is not listening yet.
// log may be nil.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		log:           log,
		watchInterval: defaultWatchInterval,
		zone:          newZone(Records{}),
		loaded:        map[string]os.FileInfo{},
		queries:       map[string]int{},
	}
}

// listenTries bounds the attempts to find a port free for both UDP and TCP.
const listenTries = 20

// Start listens on addr (e.g. "127.0.0.1:0" or "[::1]:53") over UDP and
// TCP, and serves in the background until Close. With port 0 one port free
// for both is chosen.
func (s *Server) Start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("dns server: closed")
	case s.started:
		return fmt.Errorf("dns server: already started on %s", s.addr)
	}
	pc, ln, err := listen(addr)
	if err != nil {
		return fmt.Errorf("dns server: %w", err)
	}
	ap := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	s.addr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	handler := miekg.HandlerFunc(s.serveDNS)
	s.udp = &miekg.Server{PacketConn: pc, Handler: handler}
	s.tcp = &miekg.Server{Listener: ln, Handler: handler}
	if err := s.serveLocked(s.udp); err != nil {
		pc.Close()
		ln.Close()
		s.udp, s.tcp = nil, nil
		return fmt.Errorf("dns server: udp %s: %w", s.addr, err)
	}
	if err := s.serveLocked(s.tcp); err != nil {
		ln.Close()
		s.udp.Shutdown()
		s.udp, s.tcp = nil, nil
		return fmt.Errorf("dns server: tcp %s: %w", s.addr, err)
	}
	s.started = true
	s.log.Info("dns server listening", "addr", s.addr.String())
	return nil
}

// listen opens addr over UDP, then the same address and port over TCP.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	for range listenTries {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, err
		}
		udpPort := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(udpPort)))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, err
		}
		// The port chosen for UDP is taken for TCP: choose again.
	}
	return nil, nil, fmt.Errorf("listen %s: no port free for both UDP and TCP after %d tries", addr, listenTries)
}

// serveLocked runs srv in the background and returns once it serves, so
// that Close can always shut it down.
func (s *Server) serveLocked(srv *miekg.Server) error {
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	failed := make(chan error, 1)
	s.running.Go(func() {
		err := srv.ActivateAndServe()
		if err != nil {
			s.log.Error("dns server stopped serving", "err", err)
		}
		failed <- err
	})
	select {
	case <-started:
		return nil
	case err := <-failed:
		return err
	}
}

// Addr is the address the server listens on, once started.
func (s *Server) Addr() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Close stops the server and returns once it no longer serves. Closing
// twice, or a server never started, is fine.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	udp, tcp := s.udp, s.tcp
	s.mu.Unlock()
	var errs []error
	for _, srv := range []*miekg.Server{udp, tcp} {
		if srv != nil {
			errs = append(errs, srv.Shutdown())
		}
	}
	s.running.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dns server: %w", err)
	}
	return nil
}

// SetRecords replaces the records served; the next answer uses them. Bad
// records (see Records.Validate) change nothing.
func (s *Server) SetRecords(r Records) error {
	if err := r.Validate(); err != nil {
		return err
	}
	z := newZone(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.zone = z
	s.serial++
	return nil
}

// Records returns a copy of the records served.
func (s *Server) Records() Records {
	s.mu.Lock()
	r := s.zone.records
	s.mu.Unlock()
	return r.clone()
}

func (r Records) clone() Records {
	c := Records{SRV: map[string][]SRV{}, AAAA: map[string][]netip.Addr{}}
	for k, v := range r.SRV {
		c.SRV[k] = slices.Clone(v)
	}
	for k, v := range r.AAAA {
		c.AAAA[k] = slices.Clone(v)
	}
	return c
}

// SetFault makes the server show f from the next query on.
func (s *Server) SetFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
	s.log.Info("dns server fault", "fault", f.String())
}

// LoadFile serves the records of a JSON file (see Records). A file that
// cannot be read, decoded or validated changes nothing.
func (s *Server) LoadFile(path string) error {
	_, err := s.loadFile(path)
	return err
}

// loadFile is LoadFile that also returns what the file looked like before
// it was read (nil if it could not be stat'ed).
func (s *Server) loadFile(path string) (os.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("dns records: %w", err)
	}
	r, err := readRecords(path)
	if err != nil {
		return fi, err
	}
	if err := s.SetRecords(r); err != nil {
		return fi, fmt.Errorf("dns records %s: %w", path, err)
	}
	s.mu.Lock()
	s.loaded[path] = fi
	s.mu.Unlock()
	return fi, nil
}

func readRecords(path string) (Records, error) {
	var r Records
	f, err := os.Open(path)
	if err != nil {
		return r, fmt.Errorf("dns records: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("dns records %s: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return r, fmt.Errorf("dns records %s: data after the records", path)
	}
	return r, nil
}

// WatchFile reloads the records from path (as LoadFile) whenever the file
// changes, until ctx is done. It compares the file's identity, size and
// modification time every 500ms with what it was when last loaded (by
// LoadFile or WatchFile), or, if never loaded, when watching began. A file
// that cannot be loaded is logged and the records kept.
func (s *Server) WatchFile(ctx context.Context, path string) {
	s.mu.Lock()
	last := s.loaded[path]
	interval := s.watchInterval
	s.mu.Unlock()
	if last == nil {
		last, _ = os.Stat(path)
	}
	log := s.log.With("path", path)
	t := time.NewTicker(interval)
	defer t.Stop()
	statFailing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(path)
		if err != nil {
			if !statFailing {
				log.Warn("dns records file unreadable; keeping the records", "err", err)
			}
			statFailing = true
			continue
		}
		statFailing = false
		if last != nil && os.SameFile(last, fi) && last.Size() == fi.Size() && last.ModTime().Equal(fi.ModTime()) {
			continue
		}
		seen, err := s.loadFile(path)
		last = seen
		if err != nil {
			log.Error("dns records not reloaded; keeping the old ones", "err", err)
			continue
		}
		r := s.Records()
		log.Info("dns records reloaded", "srv_names", len(r.SRV), "aaaa_names", len(r.AAAA))
	}
}

// zone is an immutable index of records, by canonical name.
type zone struct {
	records Records
	// names holds every name that exists: the apex, every name with
	// records (even none) and every name between them and the apex.
	names map[string]*node
}

// node is the records of one name, in the order given.
type node struct {
	srv  []SRV
	aaaa []netip.Addr
}

// newZone indexes validated records.
func newZone(r Records) *zone {
	z := &zone{records: r.clone(), names: map[string]*node{zoneFQDN: {}}}
	get := func(key string) *node {
		name := miekg.CanonicalName(key)
		n := z.names[name]
		if n == nil {
			n = &node{}
			z.names[name] = n
		}
		// Empty non-terminals exist too (RFC 8020).
		for off, end := miekg.NextLabel(name, 0); !end && name[off:] != zoneFQDN; off, end = miekg.NextLabel(name, off) {
			if z.names[name[off:]] == nil {
				z.names[name[off:]] = &node{}
			}
		}
		return n
	}
	for key, srvs := range z.records.SRV {
		n := get(key)
		n.srv = append(n.srv, srvs...)
	}
	for key, addrs := range z.records.AAAA {
		n := get(key)
		n.aaaa = append(n.aaaa, addrs...)
	}
	return z
}

// serveDNS answers one query.
func (s *Server) serveDNS(w miekg.ResponseWriter, req *miekg.Msg) {
	proto := w.LocalAddr().Network()
	s.mu.Lock()
	z, fault, serial := s.zone, s.fault, s.serial
	s.queries[proto]++
	s.mu.Unlock()

	var q miekg.Question
	if len(req.Question) > 0 {
		q = req.Question[0]
	}
	log := s.log.With("proto", proto, "name", q.Name, "type", miekg.TypeToString[q.Qtype])
	var resp *miekg.Msg
	switch fault {
	case FaultDrop:
		log.Debug("dns query dropped (fault)")
		return
	case FaultServfail:
		resp = new(miekg.Msg)
		resp.SetRcode(req, miekg.RcodeServerFailure)
	default:
		resp = answer(z, serial, req)
	}
	size := miekg.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(size, int(opt.UDPSize()))
		resp.SetEdns0(uint16(size), false)
	}
	if proto == "udp" {
		resp.Truncate(size)
	}
	log.Debug("dns query", "rcode", miekg.RcodeToString[resp.Rcode], "answers", len(resp.Answer), "truncated", resp.Truncated)
	if err := w.WriteMsg(resp); err != nil {
		log.Debug("dns answer not sent", "err", err)
	}
}

// answer is the answer from z to req.
func answer(z *zone, serial uint32, req *miekg.Msg) *miekg.Msg {
	resp := new(miekg.Msg)
	resp.SetReply(req)
	resp.Compress = true
	if req.Opcode != miekg.OpcodeQuery || len(req.Question) != 1 {
		resp.SetRcode(req, miekg.RcodeNotImplemented)
		return resp
	}
	q := req.Question[0]
	name := miekg.CanonicalName(q.Name)
	if (q.Qclass != miekg.ClassINET && q.Qclass != miekg.ClassANY) || !miekg.IsSubDomain(zoneFQDN, name) {
		resp.SetRcode(req, miekg.RcodeRefused)
		return resp
	}
	resp.Authoritative = true
	n := z.names[name]
	if n == nil {
		resp.SetRcode(req, miekg.RcodeNameError)
		resp.Ns = []miekg.RR{soa(serial)}
		return resp
	}
	hdr := func(t uint16) miekg.RR_Header {
		return miekg.RR_Header{Name: q.Name, Rrtype: t, Class: miekg.ClassINET, Ttl: 0}
	}
	anyType := q.Qtype == miekg.TypeANY
	if q.Qtype == miekg.TypeSRV || anyType {
		targets := map[string]bool{}
		for _, s := range n.srv {
			target := miekg.Fqdn(s.Target)
			resp.Answer = append(resp.Answer, &miekg.SRV{
				Hdr: hdr(miekg.TypeSRV), Priority: s.Priority, Weight: s.Weight, Port: s.Port, Target: target,
			})
			targets[miekg.CanonicalName(target)] = true
		}
		// The targets' addresses, to spare the client a query.
		for _, t := range slices.Sorted(maps.Keys(targets)) {
			if tn := z.names[t]; tn != nil {
				for _, a := range tn.aaaa {
					resp.Extra = append(resp.Extra, &miekg.AAAA{
						Hdr:  miekg.RR_Header{Name: t, Rrtype: miekg.TypeAAAA, Class: miekg.ClassINET},
						AAAA: a.AsSlice(),
					})
				}
			}
		}
	}
	if q.Qtype == miekg.TypeAAAA || anyType {
		for _, a := range n.aaaa {
			resp.Answer = append(resp.Answer, &miekg.AAAA{Hdr: hdr(miekg.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	if (q.Qtype == miekg.TypeSOA || anyType) && name == zoneFQDN {
		resp.Answer = append(resp.Answer, soa(serial))
	}
	if len(resp.Answer) == 0 {
		resp.Ns = []miekg.RR{soa(serial)} // no records of that type (NODATA)
	}
	return resp
}

// soa is the zone's SOA record; its minimum TTL of 0 keeps negative
// answers from being cached.
func soa(serial uint32) *miekg.SOA {
	return &miekg.SOA{
		Hdr:     miekg.RR_Header{Name: zoneFQDN, Rrtype: miekg.TypeSOA, Class: miekg.ClassINET},
		Ns:      "ns." + zoneFQDN,
		Mbox:    "admin." + zoneFQDN,
		Serial:  serial,
		Refresh: 3600,
		Retry:   600,
		Expire:  86400,
		Minttl:  0,
	}
}
