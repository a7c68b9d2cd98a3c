package told_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// BenchmarkSetV2P is one PUT /v2p on a sled that holds n mappings: each
// change rewrites the whole record (two copies, fsynced), so its cost
// grows with what the sled was told.
func BenchmarkSetV2P(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("mappings=%d", n), func(b *testing.B) {
			ctx := context.Background()
			st := must(told.Open(told.Options{Dirs: []string{b.TempDir(), b.TempDir()}, Sled: &sled{}}))
			m := func(i int) told.V2P {
				return must(told.V2P{VirtualIP: fmt.Sprintf("172.30.%d.%d", i/250, i%250+1), VirtualMAC: "A8:40:25:F0:00:02",
					PhysicalHostIP: "fd00:1122:3344:102::1", VNI: 7777}.Check())
			}
			for i := range n {
				if err := st.SetV2P(ctx, m(i)); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; b.Loop(); i++ {
				if err := st.SetV2P(ctx, m(n+i%1000)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
