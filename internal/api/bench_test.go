package api_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// BenchmarkInventory1000 serves GET /inventory for a sled running 1,000 zones.
func BenchmarkInventory1000(b *testing.B) {
	zones := sledconfigtest.Crucibles(1000)
	for _, tc := range []struct {
		name string
		cfg  *sledconfig.Config
	}{
		// The config's zones alone, and with their storage (1000 disks,
		// 3000 datasets), which the inventory carries in its configs.
		{"zones", sledconfigtest.ConfigWithoutStorage(1, zones...)},
		{"with-storage", sledconfigtest.Config(1, zones...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := newSled(b, sim.Options{})
			doc, _ := json.Marshal(tc.cfg)
			if r := s.put(doc); r.status != http.StatusNoContent {
				b.Fatalf("PUT: %d %s", r.status, r.body)
			}
			for len(s.rec.RunningZones()) < 1000 {
				time.Sleep(time.Millisecond)
			}
			var took []time.Duration
			for b.Loop() {
				t0 := time.Now()
				r := s.do(http.MethodGet, "/inventory", nil)
				took = append(took, time.Since(t0))
				if r.status != http.StatusOK {
					b.Fatal(r.status)
				}
				b.SetBytes(int64(len(r.body)))
			}
			reportQuantiles(b, took)
		})
	}
}

// BenchmarkPutConfig1000 serves PUT /omicron-config of a 1,000-crucible
// config with its storage (1000 disks, 3000 datasets), a new generation
// each time, to a sled already running it: decoding, validation, the
// generation rules and the ledger's two durable copies.
func BenchmarkPutConfig1000(b *testing.B) {
	zones := sledconfigtest.Crucibles(1000)
	s := newSled(b, sim.Options{})
	doc := func(gen uint64) []byte {
		d, err := json.Marshal(sledconfigtest.Config(gen, zones...))
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	if r := s.put(doc(1)); r.status != http.StatusNoContent {
		b.Fatalf("PUT: %d %s", r.status, r.body)
	}
	// Encode the documents before timing; at most 64 distinct ones.
	docs := make([][]byte, 64)
	for i := range docs {
		docs[i] = doc(uint64(i + 2))
	}
	b.SetBytes(int64(len(docs[0])))
	gen := 0
	var took []time.Duration
	for b.Loop() {
		d := docs[gen%len(docs)]
		if gen%len(docs) == 0 && gen > 0 {
			b.StopTimer()
			for i := range docs {
				docs[i] = doc(uint64(gen + i + 2))
			}
			d = docs[0]
			b.StartTimer()
		}
		gen++
		t0 := time.Now()
		r := s.put(d)
		took = append(took, time.Since(t0))
		if r.status != http.StatusNoContent {
			b.Fatalf("PUT: %d %s", r.status, r.body)
		}
	}
	reportQuantiles(b, took)
}

// reportQuantiles reports the median and 99th percentile of the timed
// operations, in milliseconds.
func reportQuantiles(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	q := func(f float64) float64 {
		return float64(took[min(len(took)-1, int(f*float64(len(took))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}
