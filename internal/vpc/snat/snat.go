// Package snat hands out source NAT ports as OPTE does: for one external IP
// and the port range Nexus gave a guest on it, one free list per protocol
// (TCP ports, UDP ports, ICMP echo identifiers), a port taken for each new
// outbound flow and given back when the flow expires, and a typed error when
// a list runs dry, on which the flow's packet is dropped.
package snat

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"sync"
)

// ChunkSize is how many ports Nexus gives one guest on a shared SNAT address:
// a range of 16384 aligned to 16384, NUM_SOURCE_NAT_PORTS
// (omicron common/src/address.rs:313, enforced by SourceNatConfig::new,
// sled-agent/types/versions/src/add_dual_stack_external_ip_config/inventory.rs).
// A Pool takes any range, as OPTE's does; checking Nexus's is the API's job.
const ChunkSize = 1 << 14

// Proto is an IP protocol number. Each of TCP, UDP and the ICMP of the
// pool's family has its own free list: a flow's key carries its protocol, so
// the same port may serve a TCP and a UDP flow at once
// (lib/opte/src/engine/snat.rs:196-203).
type Proto uint8

const (
	ICMP   Proto = 1
	TCP    Proto = 6
	UDP    Proto = 17
	ICMPv6 Proto = 58
)

func (p Proto) String() string {
	switch p {
	case ICMP:
		return "icmp"
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMPv6:
		return "icmp6"
	}
	return fmt.Sprintf("protocol %d", uint8(p))
}

var (
	// ErrExhausted is the decision when a protocol's ports are all taken:
	// OPTE's ResourceExhausted "SNAT Pool (exhausted)" (snat.rs:344-348),
	// on which its layer fails and the packet is dropped (layer.rs:1084-1087).
	ErrExhausted = errors.New("SNAT pool exhausted")
	// ErrProto is a protocol SNAT cannot carry: neither TCP nor UDP nor the
	// ICMP of the pool's address family (snat.rs:322-331).
	ErrProto = errors.New("protocol not source-NATed")
	// ErrNotAllocated is a release of a port the pool did not hand out, or
	// already took back. OPTE cannot make this mistake (a port goes back
	// when its handle drops, lib/opte/src/engine/rule.rs:155-171); here it
	// is a bug in the caller, reported, and the free list is left as it was.
	ErrNotAllocated = errors.New("SNAT port not allocated")
)

// ExhaustedError says which list ran dry; it matches ErrExhausted.
type ExhaustedError struct {
	IP          netip.Addr
	Proto       Proto
	First, Last uint16
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("SNAT pool exhausted: every %v port of %v %d-%d is in use", e.Proto, e.IP, e.First, e.Last)
}

func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// Pool is the SNAT ports of one external IP and range, OPTE's NatPool entry
// (snat.rs:62-72) times the three protocols of its SNat (snat.rs:193-204).
// A port's SNAT configuration changing makes a new Pool; flows keep giving
// their ports back to the pool they came from, as OPTE's handles do. Safe
// for concurrent use.
type Pool struct {
	ip          netip.Addr
	first, last uint16
	icmp        Proto // ICMP or ICMPv6, by the address's family

	mu    sync.Mutex
	lists [3]freeList // TCP, UDP, ICMP; guarded by mu
}

// freeList is a stack of free ports, and a bit per port of the range set
// while the port is handed out.
type freeList struct {
	free []uint16
	used []uint64
}

// New makes a pool of ports first..last (inclusive) on ip, all free.
func New(ip netip.Addr, first, last uint16) (*Pool, error) {
	if !ip.IsValid() {
		return nil, errors.New("snat: no external IP")
	}
	if first > last {
		return nil, fmt.Errorf("snat: port range %d-%d is empty", first, last)
	}
	p := &Pool{ip: ip.Unmap(), first: first, last: last, icmp: ICMP}
	if p.ip.Is6() {
		p.icmp = ICMPv6
	}
	n := int(last) - int(first) + 1
	for i := range p.lists {
		// OPTE collects the range in order and pops from the end
		// (snat.rs:117, :167): the last port goes first, and a port
		// given back is the next handed out.
		l := &p.lists[i]
		l.free = make([]uint16, n)
		for j := range l.free {
			l.free[j] = first + uint16(j)
		}
		l.used = make([]uint64, (n+63)/64)
	}
	return p, nil
}

// IP is the external address.
func (p *Pool) IP() netip.Addr { return p.ip }

// Range is the first and last port, inclusive.
func (p *Pool) Range() (first, last uint16) { return p.first, p.last }

func (p *Pool) list(proto Proto) (*freeList, error) {
	switch proto {
	case TCP:
		return &p.lists[0], nil
	case UDP:
		return &p.lists[1], nil
	case p.icmp:
		return &p.lists[2], nil
	}
	return nil, fmt.Errorf("%w: %v on %v", ErrProto, proto, p.ip)
}

// Lease is one port handed out for one flow. The flow's state keeps it and
// gives it back with Release when the flow goes.
type Lease struct {
	Pool  *Pool
	Proto Proto
	Port  uint16 // a TCP or UDP source port, or an ICMP echo identifier
}

// Alloc takes a free port of proto for a new flow. It fails with an
// *ExhaustedError when every port of proto is in use.
func (p *Pool) Alloc(proto Proto) (Lease, error) {
	l, err := p.list(proto)
	if err != nil {
		return Lease{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(l.free)
	if n == 0 {
		return Lease{}, &ExhaustedError{IP: p.ip, Proto: proto, First: p.first, Last: p.last}
	}
	port := l.free[n-1]
	l.free = l.free[:n-1]
	i := port - p.first
	l.used[i/64] |= 1 << (i % 64)
	return Lease{Pool: p, Proto: proto, Port: port}, nil
}

// Release gives the lease's port back to its pool.
func (l Lease) Release() error {
	if l.Pool == nil {
		return fmt.Errorf("%w: empty lease", ErrNotAllocated)
	}
	return l.Pool.Release(l.Proto, l.Port)
}

// Release gives port of proto back. A port not handed out (outside the
// range, never taken, or already given back) is refused with
// ErrNotAllocated and changes nothing, so no port is ever free twice.
func (p *Pool) Release(proto Proto, port uint16) error {
	l, err := p.list(proto)
	if err != nil {
		return err
	}
	if port < p.first || port > p.last {
		return fmt.Errorf("%w: %v port %d is outside %v %d-%d", ErrNotAllocated, proto, port, p.ip, p.first, p.last)
	}
	i := port - p.first
	bit := uint64(1) << (i % 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.used[i/64]&bit == 0 {
		return fmt.Errorf("%w: %v port %d of %v is free", ErrNotAllocated, proto, port, p.ip)
	}
	l.used[i/64] &^= bit
	l.free = append(l.free, port)
	return nil
}

// Available is how many ports of proto are free (OPTE's num_avail,
// snat.rs:123); 0 for a protocol the pool does not carry.
func (p *Pool) Available(proto Proto) int {
	l, err := p.list(proto)
	if err != nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(l.free)
}

// InUse is how many ports of proto are handed out.
func (p *Pool) InUse(proto Proto) int {
	l, err := p.list(proto)
	if err != nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range l.used {
		n += bits.OnesCount64(w)
	}
	return n
}
