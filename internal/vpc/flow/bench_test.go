package flow

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

var benchSizes = []int{1, 10_000, 100_000}

// benchKey spreads n flows over sources and ports as a busy guest's would.
func benchKey(i int) key {
	return key{
		proto:   6,
		src:     netip.AddrFrom4([4]byte{172, 30, 0, 5}),
		dst:     netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
		srcPort: uint16(i),
		dstPort: 443,
	}
}

// spread is 1024 keys of a table of n flows, scattered over it.
func spread(n int) []key {
	keys := make([]key, 1024)
	for i := range keys {
		keys[i] = benchKey(i * 7919 % n)
	}
	return keys
}

type benchVal struct{ a, b uint64 }

func filled(b *testing.B, n int) *Table[key, benchVal] {
	tb := New[key](Config[benchVal]{Limit: PortLimit})
	for i := range n {
		if _, _, err := tb.Insert(benchKey(i), benchVal{uint64(i), 0}); err != nil {
			b.Fatal(err)
		}
	}
	return tb
}

// BenchmarkLookup is a hit on a table of n flows, the time read once per
// packet as the data path does.
func BenchmarkLookup(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			tb := filled(b, n)
			keys := spread(n)
			now := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, ok := tb.LookupAt(keys[i&1023], now); !ok {
					b.Fatal("miss")
				}
			}
		})
	}
}

// BenchmarkLookupParallel is hits from every core at once on 100k flows,
// as a port's two directions and other ports' goroutines do.
func BenchmarkLookupParallel(b *testing.B) {
	tb := filled(b, 100_000)
	keys := spread(100_000)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	var g atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine its own flows, as a flow's two directions are
		// two keys in two tables.
		i := int(g.Add(1)) * 512
		for pb.Next() {
			if _, ok := tb.LookupAt(keys[i&1023], now); !ok {
				b.Error("miss")
				return
			}
			i++
		}
	})
}

// BenchmarkInsert adds a new flow to a table of n flows and removes it, so
// the table stays at n: a flow's setup and teardown.
func BenchmarkInsert(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			tb := filled(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				kk := benchKey(n + i&0xffff)
				if _, _, err := tb.Insert(kk, benchVal{}); err != nil {
					b.Fatal(err)
				}
				tb.Remove(kk)
			}
		})
	}
}

// BenchmarkCacheLookup is a unified flow table hit on 100k flows: the
// epoch check on top of a table lookup.
func BenchmarkCacheLookup(b *testing.B) {
	var ep Epoch
	c := NewCache[key, *benchVal](&ep, Config[*benchVal]{Limit: PortLimit})
	x := &benchVal{}
	for i := range 100_000 {
		c.Insert(benchKey(i), x, ep.Load())
	}
	keys := spread(100_000)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, ok := c.LookupAt(keys[i&1023], now); !ok {
			b.Fatal("miss")
		}
	}
}

// BenchmarkExpire is a sweep of 100k flows that expires none, OPTE's
// once-a-second pass over a port.
func BenchmarkExpire(b *testing.B) {
	tb := filled(b, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if gone := tb.Expire(); len(gone) != 0 {
			b.Fatal("expired")
		}
	}
}
