// Package dns finds control-plane services, first of all the switch daemons,
// in the rack's internal DNS, and serves that zone for development and tests.
package dns

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Zone is the internal DNS zone of the control plane.
const Zone = "control-plane.oxide.internal"

// DefaultTimeout bounds every query when NewResolver is given no timeout.
const DefaultTimeout = 2 * time.Second

// switchService is the SRV service name of the switch daemon (dpd).
const switchService = "dendrite"

// ErrUnreachable is wrapped by every error where no DNS server answered:
// connection refused, network unreachable, timeouts and the caller's
// deadline (then errors.Is(err, context.DeadlineExceeded) is true too). A
// lookup cancelled by its caller (context.Canceled) is not ErrUnreachable.
var ErrUnreachable = errors.New("internal DNS unreachable")

// ErrServerFailure is wrapped by every error where a DNS server answered but
// not with records or "no such name": SERVFAIL, REFUSED, a malformed answer.
var ErrServerFailure = errors.New("internal DNS server failure")

// Resolver looks services up in internal DNS. It sends queries only to its
// own servers, never to the system's, and keeps no cache. It is safe for
// concurrent use.
type Resolver struct {
	servers []netip.AddrPort
	timeout time.Duration
}

// NewResolver returns a resolver asking servers, in order, until one
// answers. timeout bounds each query sent to one server; zero means
// DefaultTimeout.
func NewResolver(servers []netip.AddrPort, timeout time.Duration) (*Resolver, error) {
	if len(servers) == 0 {
		return nil, errors.New("dns resolver: no servers")
	}
	for _, s := range servers {
		if !s.IsValid() || s.Port() == 0 {
			return nil, fmt.Errorf("dns resolver: server %q: want an address and a port", s)
		}
	}
	switch {
	case timeout < 0:
		return nil, fmt.Errorf("dns resolver: negative timeout %s", timeout)
	case timeout == 0:
		timeout = DefaultTimeout
	}
	return &Resolver{servers: slices.Clone(servers), timeout: timeout}, nil
}

// LookupSwitches returns the addresses of the switch daemons (dpd):
// LookupService(ctx, "dendrite").
func (r *Resolver) LookupSwitches(ctx context.Context) ([]netip.AddrPort, error) {
	return r.LookupService(ctx, switchService)
}

// LookupService returns the addresses of a service: the SRV records of
// _<service>._tcp.control-plane.oxide.internal, then the AAAA records of
// their targets, paired with the SRV records' ports. The result is sorted
// and has no duplicates.
//
// When the service or all its targets have no records (or no name), the
// result is empty (nil) and the error nil: callers fall back to static
// addresses. A target whose lookup fails is skipped when another one
// resolves; when none does, the error of the first failing target is
// returned. Errors wrap ErrUnreachable or ErrServerFailure, or the
// context's error when the caller cancelled.
func (r *Resolver) LookupService(ctx context.Context, service string) ([]netip.AddrPort, error) {
	if err := checkService(service); err != nil {
		return nil, err
	}
	name := "_" + service + "._tcp." + Zone + "."
	var srvs []*net.SRV
	err := r.query(ctx, "SRV", name, func(ctx context.Context, res *net.Resolver) error {
		var err error
		_, srvs, err = res.LookupSRV(ctx, "", "", name)
		return err
	})
	if errors.Is(err, errNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}

	// Every target once, with all its ports. A target of "." means the
	// service is decidedly not available there (RFC 2782).
	ports := map[string][]uint16{}
	for _, s := range srvs {
		if t := strings.ToLower(s.Target); t != "." && t != "" {
			ports[t] = append(ports[t], s.Port)
		}
	}
	targets := slices.Sorted(maps.Keys(ports))

	type result struct {
		addrs []netip.Addr
		err   error
	}
	results := make([]result, len(targets))
	var wg sync.WaitGroup
	for i, target := range targets {
		wg.Go(func() {
			results[i].addrs, results[i].err = r.lookupAAAA(ctx, target)
		})
	}
	wg.Wait()

	var out []netip.AddrPort
	var firstErr error
	for i, target := range targets {
		switch err := results[i].err; {
		case err == nil:
			for _, a := range results[i].addrs {
				for _, p := range ports[target] {
					out = append(out, netip.AddrPortFrom(a, p))
				}
			}
		case errors.Is(err, errNotFound):
		case firstErr == nil:
			firstErr = err
		}
	}
	if len(out) == 0 {
		return nil, firstErr
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out), nil
}

// BoundaryNTPName is the name whose AAAA records are the addresses of the
// rack's boundary NTP zones: internal NTP zones follow them. It is
// upstream's: omicron's internal-dns names (BOUNDARY_NTP_DNS_NAME,
// "boundary-ntp", in the control-plane zone), there because chrony does
// not follow SRV records. Upstream puts the name itself in an internal NTP
// zone's chrony.conf ("pool <name> ...") and chronyd resolves it; we
// differ: the agent resolves it (see internal/timesync/servers) and writes
// addresses, so that chronyd in a zone needs no resolver of its own and
// the status says what was found.
const BoundaryNTPName = "boundary-ntp." + Zone

// LookupBoundaryNTP returns the addresses of the rack's boundary NTP
// zones: LookupAAAA(ctx, BoundaryNTPName).
func (r *Resolver) LookupBoundaryNTP(ctx context.Context) ([]netip.Addr, error) {
	return r.LookupAAAA(ctx, BoundaryNTPName)
}

// LookupAAAA returns the IPv6 addresses of name (fully qualified; a
// trailing dot is optional, no search domain is ever appended), sorted and
// without duplicates. It asks the servers as LookupService does, each
// under the resolver's timeout, and never beyond ctx.
//
// When the name does not exist or has no AAAA records, the result is
// empty (nil) and the error nil. Errors wrap ErrUnreachable or
// ErrServerFailure, or the context's error when the caller cancelled.
func (r *Resolver) LookupAAAA(ctx context.Context, name string) ([]netip.Addr, error) {
	fqdn, err := checkHost(name)
	if err != nil {
		return nil, err
	}
	addrs, err := r.lookupAAAA(ctx, fqdn)
	if errors.Is(err, errNotFound) {
		return nil, nil
	}
	return addrs, err
}

// lookupAAAA asks for the AAAA records of fqdn (with its trailing dot). The
// addresses come back sorted, without zones or duplicates; errNotFound
// means none.
func (r *Resolver) lookupAAAA(ctx context.Context, fqdn string) ([]netip.Addr, error) {
	var addrs []netip.Addr
	err := r.query(ctx, "AAAA", fqdn, func(ctx context.Context, res *net.Resolver) error {
		var err error
		addrs, err = res.LookupNetIP(ctx, "ip6", fqdn)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, a := range addrs {
		addrs[i] = a.WithZone("")
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), nil
}

// checkHost accepts a fully qualified host name (labels of letters,
// digits, hyphens and underscores, at most 63 bytes each and 253 in all)
// and returns it in lower case with its trailing dot.
func checkHost(name string) (string, error) {
	host := strings.ToLower(strings.TrimSuffix(name, "."))
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("dns: host name %q: %s", name, why)
	}
	if host == "" || len(host) > 253 {
		return bad("want 1 to 253 characters")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 {
			return bad("want labels of 1 to 63 characters")
		}
		for _, c := range label {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return bad("want letters, digits, hyphens and underscores")
			}
		}
	}
	return host + ".", nil
}

// checkService accepts a service name that makes one DNS label.
func checkService(service string) error {
	if service == "" || len(service) > 62 {
		return fmt.Errorf("dns: service name %q: want 1 to 62 characters", service)
	}
	for _, c := range service {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("dns: service name %q: want letters, digits and hyphens", service)
		}
	}
	return nil
}

// errNotFound is returned by query when a server answered that the name
// has no records of the type asked for, or does not exist.
var errNotFound = errors.New("no such name or records")

// query asks the servers in order until one answers, each under its own
// deadline (r.timeout, and never beyond ctx). ask runs one lookup of the
// standard library's resolver, whose queries all go to the server being
// tried. qtype and name are for messages.
func (r *Resolver) query(ctx context.Context, qtype, name string, ask func(context.Context, *net.Resolver) error) error {
	var failures serverErrors
	answered := false
	for _, server := range r.servers {
		if ctx.Err() != nil {
			break
		}
		qctx, cancel := context.WithTimeout(ctx, r.timeout)
		deadline, _ := qctx.Deadline()
		a := &attempt{server: server, deadline: deadline}
		err := ask(qctx, &net.Resolver{PreferGo: true, Dial: a.dial})
		timedOut := errors.Is(qctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if err == nil {
			return nil
		}
		var dnsErr *net.DNSError
		isDNSErr := errors.As(err, &dnsErr)
		if isDNSErr && dnsErr.IsNotFound && a.answered.Load() {
			return errNotFound
		}
		// A *net.DNSError names the server of /etc/resolv.conf that the
		// standard library thought it asked: leave that out.
		msg := err.Error()
		if isDNSErr {
			msg = dnsErr.Err
		}
		switch {
		case a.answered.Load():
			answered = true
		case timedOut:
			msg = fmt.Sprintf("no answer within %s", r.timeout)
		case !a.dialed.Load() && ctx.Err() == nil:
			// The standard library answered without asking DNS:
			// nsswitch.conf says "hosts: files" (or /etc/hosts
			// holds the name with no IPv6 address).
			msg = "not asked (is dns missing from hosts in /etc/nsswitch.conf?): " + msg
			answered = true
		}
		failures = append(failures, &serverError{server: server, msg: msg, err: err})
	}
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("dns %s %s: %w", qtype, name, err)
		}
		failures = append(failures, err)
	}
	if answered {
		return fmt.Errorf("%w: %s %s: %w", ErrServerFailure, qtype, name, failures)
	}
	return fmt.Errorf("%w: %s %s: %w", ErrUnreachable, qtype, name, failures)
}

// attempt is what one lookup sent to one server: its dial function sends
// every query of the standard library's resolver to server, whatever
// address /etc/resolv.conf gave it, and notes whether anything came back.
type attempt struct {
	server   netip.AddrPort
	deadline time.Time
	// dialed and answered are set by the resolver's goroutines, which
	// may outlive the lookup.
	dialed, answered atomic.Bool
}

// dial connects to a.server over network ("udp" or "tcp"). The connection's
// deadline never goes past a.deadline, even if the resolver asks for later.
func (a *attempt) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	switch network {
	case "udp", "udp4", "udp6":
		network = "udp"
	case "tcp", "tcp4", "tcp6":
		network = "tcp"
	default:
		return nil, fmt.Errorf("dns: dial %s %s: unexpected network", network, a.server)
	}
	a.dialed.Store(true)
	d := net.Dialer{Deadline: a.deadline}
	c, err := d.DialContext(ctx, network, a.server.String())
	if err != nil {
		return nil, err
	}
	g := &guard{a: a, ctx: ctx}
	c.SetDeadline(g.deadline(a.deadline))
	// The resolver does not watch ctx while it waits for an answer: end
	// the wait when ctx ends.
	g.stop = context.AfterFunc(ctx, func() { c.SetDeadline(longAgo) })
	// The resolver frames its queries as UDP datagrams when the connection
	// is a net.PacketConn, which *udpConn stays by embedding *net.UDPConn.
	switch c := c.(type) {
	case *net.UDPConn:
		return &udpConn{UDPConn: c, g: g}, nil
	case *net.TCPConn:
		return &tcpConn{TCPConn: c, g: g}, nil
	}
	g.stop()
	c.Close()
	return nil, fmt.Errorf("dns: dial %s %s: unexpected connection %T", network, a.server, c)
}

// longAgo is a deadline in the past, which ends any wait at once.
var longAgo = time.Unix(1, 0)

// guard is what udpConn and tcpConn add to the resolver's connections: they
// note answers, keep the deadline within the attempt's and end waits when
// the dial's context ends. The resolver uses SetDeadline, Read, Write and
// Close only.
type guard struct {
	a    *attempt
	ctx  context.Context
	stop func() bool
}

// deadline is t, or the attempt's deadline if t is later or zero, or long
// ago once the context ended.
func (g *guard) deadline(t time.Time) time.Time {
	switch {
	case g.ctx.Err() != nil:
		return longAgo
	case t.IsZero() || t.After(g.a.deadline):
		return g.a.deadline
	}
	return t
}

func (g *guard) read(n int) {
	if n > 0 {
		g.a.answered.Store(true)
	}
}

type udpConn struct {
	*net.UDPConn
	g *guard
}

func (c *udpConn) Read(b []byte) (int, error) {
	n, err := c.UDPConn.Read(b)
	c.g.read(n)
	return n, err
}

func (c *udpConn) SetDeadline(t time.Time) error { return c.UDPConn.SetDeadline(c.g.deadline(t)) }

func (c *udpConn) Close() error {
	c.g.stop()
	return c.UDPConn.Close()
}

type tcpConn struct {
	*net.TCPConn
	g *guard
}

func (c *tcpConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	c.g.read(n)
	return n, err
}

func (c *tcpConn) SetDeadline(t time.Time) error { return c.TCPConn.SetDeadline(c.g.deadline(t)) }

func (c *tcpConn) Close() error {
	c.g.stop()
	return c.TCPConn.Close()
}

// serverError is one server's failure to answer a query.
type serverError struct {
	server netip.AddrPort
	msg    string
	err    error
}

func (e *serverError) Error() string { return e.server.String() + ": " + e.msg }

func (e *serverError) Unwrap() error { return e.err }

// serverErrors are the failures of every server asked, in order.
type serverErrors []error

func (es serverErrors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func (es serverErrors) Unwrap() []error { return es }
