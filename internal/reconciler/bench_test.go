package reconciler_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// BenchmarkNoopPass measures a pass over a config in which every zone already
// runs as wanted: the cost of taking up a new generation that changes no
// zone. It reports the pass's own duration (ran-for) per op.
func BenchmarkNoopPass(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := reconciler.New(sim.New(sim.Options{}), nil, reconciler.Options{RelistPeriod: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { r.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			zones := sledconfigtest.Crucibles(n)
			cfgs := []*sledconfig.Config{sledconfigtest.Config(1, zones...), sledconfigtest.Config(2, zones...)}
			passes := uint64(0)
			wait := func() reconciler.Status {
				passes++
				for {
					if st := r.Status(); st.Passes >= passes && st.Phase == reconciler.PhaseIdle {
						return st
					}
					runtime.Gosched()
				}
			}
			r.Update(cfgs[0])
			wait()
			var ranFor time.Duration
			i := 0
			for b.Loop() {
				i++
				r.Update(cfgs[i%2])
				ranFor += wait().RanFor
			}
			b.ReportMetric(float64(ranFor.Microseconds())/float64(i), "µs-pass/op")
		})
	}
}
