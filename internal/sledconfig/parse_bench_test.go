package sledconfig_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// BenchmarkParseValidate1000 is the decoding and validation part of a PUT of a
// 1,000-zone config.
func BenchmarkParseValidate1000(b *testing.B) {
	zones := sledconfigtest.Crucibles(1000)
	for _, tc := range []struct {
		name string
		cfg  *sledconfig.Config
	}{
		// 1000 crucibles alone, and with their storage: a disk for each
		// (one durable dataset of a kind per pool), its zone dataset, and
		// each zone's root and durable dataset (1000 disks, 3000 datasets).
		{"zones", sledconfigtest.ConfigWithoutStorage(1, zones...)},
		{"with-storage", sledconfigtest.Config(1, zones...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			doc, err := json.Marshal(tc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(doc)))
			cpu0 := processCPU(b)
			for b.Loop() {
				cfg, err := sledconfig.Parse(doc)
				if err != nil {
					b.Fatal(err)
				}
				if err := sledconfig.Validate(cfg); err != nil {
					b.Fatal(err)
				}
			}
			// On a machine shared with other work, the CPU time the
			// process spent (the collector's included) says more than
			// the time that passed.
			cpu := processCPU(b) - cpu0
			b.ReportMetric(float64(len(doc))*float64(b.N)/cpu.Seconds()/1e6, "cpu-MB/s")
		})
	}
}

// processCPU is the CPU time the process has spent, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
