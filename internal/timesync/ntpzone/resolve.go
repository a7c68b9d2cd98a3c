package ntpzone

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ErrNoSuchName: a DNS server answered that the name has no address
// (NXDOMAIN, or no AAAA and no A records).
var ErrNoSuchName = errors.New("no such name")

// queryTimeout bounds one query to one DNS server.
const queryTimeout = 2 * time.Second

// lookupFunc returns the addresses of a name; it gives up when ctx ends.
type lookupFunc func(ctx context.Context, name string) ([]netip.Addr, error)

// validName reports whether s is a host name: dot-separated labels of
// letters, digits, '-' and '_', each 1 to 63 bytes, at most 253 bytes in
// all, with an optional final dot.
func validName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// dnsLookup asks servers in turn, AAAA then A, until one answers: an
// answer (addresses, or that there are none) ends the lookup; a server
// that does not answer within queryTimeout, or fails, is skipped. Only
// these servers are asked, never the system's: the zone's dns_servers are
// its only resolvers, as upstream writes them into the zone's resolv.conf.
func dnsLookup(servers []netip.AddrPort) lookupFunc {
	return func(ctx context.Context, name string) ([]netip.Addr, error) {
		fqdn := dns.Fqdn(name)
		var errs []error
		for _, s := range servers {
			if ctx.Err() != nil {
				break
			}
			addrs, err := askServer(ctx, s, fqdn)
			if err == nil || errors.Is(err, ErrNoSuchName) {
				return addrs, err
			}
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
		}
		return nil, fmt.Errorf("resolving %s: %w", name, errors.Join(errs...))
	}
}

// askServer asks one server for fqdn's AAAA and A records.
func askServer(ctx context.Context, server netip.AddrPort, fqdn string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, qtype := range []uint16{dns.TypeAAAA, dns.TypeA} {
		resp, err := exchange(ctx, server, fqdn, qtype)
		if err != nil {
			return nil, err
		}
		switch resp.Rcode {
		case dns.RcodeSuccess:
		case dns.RcodeNameError:
			return nil, fmt.Errorf("%s: %w (NXDOMAIN from %s)", strings.TrimSuffix(fqdn, "."), ErrNoSuchName, server)
		default:
			return nil, fmt.Errorf("%s %s: %s", dns.TypeToString[qtype], fqdn, dns.RcodeToString[resp.Rcode])
		}
		for _, rr := range resp.Answer {
			var ip []byte
			switch rr := rr.(type) {
			case *dns.AAAA:
				ip = rr.AAAA
			case *dns.A:
				ip = rr.A
			}
			if a, ok := netip.AddrFromSlice(ip); ok {
				out = appendNew(out, a.Unmap())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w (no AAAA or A records at %s)", strings.TrimSuffix(fqdn, "."), ErrNoSuchName, server)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out, nil
}

// exchange sends one query under queryTimeout, over UDP, and again over
// TCP if the answer was truncated.
func exchange(ctx context.Context, server netip.AddrPort, fqdn string, qtype uint16) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	q := new(dns.Msg)
	q.SetQuestion(fqdn, qtype)
	q.RecursionDesired = true
	var resp *dns.Msg
	var err error
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: queryTimeout}
		resp, _, err = c.ExchangeContext(ctx, q, server.String())
		if err != nil {
			// A read that timed out ran into the query's deadline (or
			// its caller's, which is the query's when sooner).
			var ne net.Error
			if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
				return nil, fmt.Errorf("no answer in time: %w", context.DeadlineExceeded)
			}
			return nil, err
		}
		if !resp.Truncated {
			break
		}
	}
	return resp, nil
}
