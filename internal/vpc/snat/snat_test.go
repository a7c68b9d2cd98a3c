package snat

import (
	"errors"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/vpc/flow"
)

var extIP = netip.MustParseAddr("10.0.0.99")

func mustPool(t testing.TB, ip netip.Addr, first, last uint16) *Pool {
	t.Helper()
	p, err := New(ip, first, last)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Ports come off the end of a list built in order and go back on it, as
// OPTE's Vec does (snat.rs:117, :167, :181): the last port first, and a port
// given back is the next handed out. The counts follow OPTE's nat_mappings
// test (snat.rs:672-704): 1025-4096 is 3072 ports.
func TestOrder(t *testing.T) {
	p := mustPool(t, extIP, 1025, 4096)
	if n := p.Available(TCP); n != 3072 {
		t.Fatalf("available %d, want 3072", n)
	}
	var got []uint16
	step := func(alloc bool, release uint16) {
		if !alloc {
			if err := p.Release(TCP, release); err != nil {
				t.Fatal(err)
			}
			return
		}
		l, err := p.Alloc(TCP)
		if err != nil {
			t.Fatal(err)
		}
		if l.Pool != p || l.Proto != TCP {
			t.Fatalf("lease %+v", l)
		}
		got = append(got, l.Port)
	}
	step(true, 0)
	step(true, 0)
	step(true, 0)
	step(false, 4095)
	step(true, 0)
	step(true, 0)
	want := []uint16{4096, 4095, 4094, 4095, 4093}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("handed out %v, want %v", got, want)
		}
	}
	if p.Available(TCP) != 3072-4 || p.InUse(TCP) != 4 {
		t.Fatalf("available %d, in use %d", p.Available(TCP), p.InUse(TCP))
	}
}

// Each protocol has its own list (snat.rs:196-203, :660-661): taking TCP
// ports leaves UDP's and ICMP echo identifiers' untouched, and the same
// number may serve one flow of each.
func TestProtocols(t *testing.T) {
	v6 := mustPool(t, netip.MustParseAddr("fd00::99"), 0, 3)
	for _, tc := range []struct {
		name  string
		pool  *Pool
		proto Proto
		ok    bool
	}{
		{"v4 tcp", mustPool(t, extIP, 0, 3), TCP, true},
		{"v4 udp", mustPool(t, extIP, 0, 3), UDP, true},
		{"v4 icmp echo", mustPool(t, extIP, 0, 3), ICMP, true},
		{"v4 refuses icmp6", mustPool(t, extIP, 0, 3), ICMPv6, false},
		{"v4 refuses gre", mustPool(t, extIP, 0, 3), 47, false},
		{"v6 icmp6 echo", v6, ICMPv6, true},
		{"v6 refuses icmp", v6, ICMP, false},
		{"4in6 is v4", mustPool(t, netip.MustParseAddr("::ffff:10.0.0.99"), 0, 3), ICMP, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.pool.Alloc(tc.proto)
			if !tc.ok {
				if !errors.Is(err, ErrProto) {
					t.Fatalf("alloc: %v, want ErrProto", err)
				}
				if err := tc.pool.Release(tc.proto, 3); !errors.Is(err, ErrProto) {
					t.Fatalf("release: %v, want ErrProto", err)
				}
				return
			}
			if err != nil || l.Port != 3 {
				t.Fatalf("alloc: %+v, %v", l, err)
			}
			for _, other := range []Proto{TCP, UDP, tc.pool.icmp} {
				want := 4
				if other == tc.proto {
					want = 3
				}
				if n := tc.pool.Available(other); n != want {
					t.Errorf("%v available %d, want %d", other, n, want)
				}
			}
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// When every port is taken a new flow gets a typed error naming the list,
// and a port given back serves the next flow.
func TestExhausted(t *testing.T) {
	p := mustPool(t, extIP, 10, 12)
	for range 3 {
		if _, err := p.Alloc(UDP); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Alloc(UDP)
	var ex *ExhaustedError
	if !errors.Is(err, ErrExhausted) || !errors.As(err, &ex) ||
		ex.IP != extIP || ex.Proto != UDP || ex.First != 10 || ex.Last != 12 {
		t.Fatalf("alloc from a dry list: %v", err)
	}
	if _, err := p.Alloc(TCP); err != nil {
		t.Fatalf("tcp after udp ran dry: %v", err)
	}
	if err := p.Release(UDP, 11); err != nil {
		t.Fatal(err)
	}
	if l, err := p.Alloc(UDP); err != nil || l.Port != 11 {
		t.Fatalf("after a release: %+v, %v", l, err)
	}
}

// A whole Nexus chunk goes out with no port twice and none outside it, and
// comes back; a port not handed out cannot be given back.
func TestNeverTwice(t *testing.T) {
	const first = 2 * ChunkSize
	p := mustPool(t, extIP, first, first+ChunkSize-1)
	seen := make(map[uint16]bool)
	var leases []Lease
	for range ChunkSize {
		l, err := p.Alloc(TCP)
		if err != nil {
			t.Fatal(err)
		}
		if seen[l.Port] || l.Port < first || l.Port > first+ChunkSize-1 {
			t.Fatalf("port %d twice or outside the chunk", l.Port)
		}
		seen[l.Port] = true
		leases = append(leases, l)
	}
	if _, err := p.Alloc(TCP); !errors.Is(err, ErrExhausted) {
		t.Fatalf("alloc past the chunk: %v", err)
	}
	for _, l := range leases {
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if p.Available(TCP) != ChunkSize || p.InUse(TCP) != 0 {
		t.Fatalf("after releasing all: %d free, %d in use", p.Available(TCP), p.InUse(TCP))
	}
	for _, tc := range []struct {
		name string
		port uint16
	}{
		{"twice", leases[0].Port},
		{"below the range", first - 1},
		{"above the range", first + ChunkSize},
	} {
		if err := p.Release(TCP, tc.port); !errors.Is(err, ErrNotAllocated) {
			t.Errorf("release %s: %v, want ErrNotAllocated", tc.name, err)
		}
	}
	if err := (Lease{}).Release(); !errors.Is(err, ErrNotAllocated) {
		t.Errorf("empty lease: %v", err)
	}
	if p.Available(TCP) != ChunkSize {
		t.Fatalf("bad releases changed the list: %d free", p.Available(TCP))
	}
}

func TestNew(t *testing.T) {
	if _, err := New(extIP, 5, 4); err == nil {
		t.Error("empty range accepted")
	}
	if _, err := New(netip.Addr{}, 0, 4); err == nil {
		t.Error("no address accepted")
	}
	p := mustPool(t, extIP, 0, 65535)
	if f, l := p.Range(); f != 0 || l != 65535 || p.IP() != extIP || p.Available(ICMP) != 65536 {
		t.Errorf("full range: %d-%d on %v, %d free", f, l, p.IP(), p.Available(ICMP))
	}
}

// Flows of both directions take and give back ports at once; run under -race.
func TestConcurrent(t *testing.T) {
	p := mustPool(t, extIP, 0, 255)
	var mu sync.Mutex
	held := make(map[uint16]bool)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 2000 {
				l, err := p.Alloc(UDP)
				if errors.Is(err, ErrExhausted) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if held[l.Port] {
					t.Errorf("port %d handed out twice", l.Port)
				}
				held[l.Port] = true
				mu.Unlock()
				if i%3 != 0 {
					mu.Lock()
					delete(held, l.Port)
					mu.Unlock()
					if err := l.Release(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if p.InUse(UDP) != len(held) || p.Available(UDP)+p.InUse(UDP) != 256 {
		t.Fatalf("in use %d, held %d, free %d", p.InUse(UDP), len(held), p.Available(UDP))
	}
}

// A NAT flow holds its lease in a flow table; when the flow idles out the
// sweep hands the lease back and the port serves again (OPTE releases on
// the flow entry's drop: rule.rs:164-171, flow_table.rs:301-340).
func TestReleaseOnExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustPool(t, extIP, 100, 101)
		tb := flow.New[uint16](flow.Config[Lease]{})
		for f := range uint16(2) {
			l, err := p.Alloc(UDP)
			if err != nil {
				t.Fatal(err)
			}
			tb.Insert(f, l)
		}
		if _, err := p.Alloc(UDP); !errors.Is(err, ErrExhausted) {
			t.Fatalf("third flow: %v", err)
		}
		time.Sleep(30 * time.Second)
		tb.Lookup(1)
		time.Sleep(30 * time.Second)
		for _, e := range tb.Expire() {
			if err := e.Value.Release(); err != nil {
				t.Fatal(err)
			}
		}
		l, err := p.Alloc(UDP)
		if err != nil || l.Port != 101 {
			t.Fatalf("after flow 0 expired: %+v, %v; want its port 101", l, err)
		}
	})
}
