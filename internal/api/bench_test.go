package api_test

import (
	"encoding/json"
	"net/http"
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
			for b.Loop() {
				if r := s.do(http.MethodGet, "/inventory", nil); r.status != http.StatusOK {
					b.Fatal(r.status)
				}
			}
		})
	}
}
