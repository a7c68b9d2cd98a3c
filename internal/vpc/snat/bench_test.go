package snat

import "testing"

// BenchmarkAllocRelease is one flow's port taken and given back, on a Nexus
// chunk half in use.
func BenchmarkAllocRelease(b *testing.B) {
	p := mustPool(b, extIP, ChunkSize, 2*ChunkSize-1)
	for range ChunkSize / 2 {
		p.Alloc(TCP)
	}
	b.ReportAllocs()
	for b.Loop() {
		l, err := p.Alloc(TCP)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocReleaseParallel is the same from every core at once.
func BenchmarkAllocReleaseParallel(b *testing.B) {
	p := mustPool(b, extIP, ChunkSize, 2*ChunkSize-1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := p.Alloc(UDP)
			if err != nil {
				b.Error(err)
				return
			}
			l.Release()
		}
	})
}
