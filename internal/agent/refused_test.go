package agent_test

import (
	"cmp"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// A start refused for a bad flag, or a port in use, writes nothing: the
// data dir stays absent, or empty, as it was (no lock, no sled id).
func TestRefusedStartWritesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for name, tc := range map[string]struct {
		cfg  agent.Config
		want string
	}{
		"runtime":       {agent.Config{Runtime: "lnux"}, `runtime "lnux"`},
		"port in use":   {agent.Config{Listen: busy.Addr().String()}, "listen on " + busy.Addr().String()},
		"sled id":       {agent.Config{SledID: "sled-1"}, `sled-id "sled-1"`},
		"qemu ids":      {agent.Config{VMMQEMUIDs: "x"}, "vmm-qemu-ids"},
		"reservoir":     {agent.Config{VMMReservoirPercentage: 100}, "vmm reservoir"},
		"faults, linux": {agent.Config{Runtime: "linux", SimFaults: "/nonexistent"}, "sim-faults"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, exists := range []bool{false, true} {
				dir := filepath.Join(t.TempDir(), "data")
				if exists {
					if err := os.Mkdir(dir, 0o700); err != nil {
						t.Fatal(err)
					}
				}
				cfg := tc.cfg
				cfg.DataDir = dir
				cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:0")
				cfg.ZoneTag, cfg.NetnsPrefix = "refusedtest", "refusedtest-"
				cfg.RunDir = t.TempDir() // never the default, where a tmpfs is mounted
				a, err := agent.New(cfg, testLogger(t))
				if err == nil {
					a.Close()
					t.Fatalf("started with %+v", tc.cfg)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %q, want one naming %q", err, tc.want)
				}
				entries, err := os.ReadDir(dir)
				switch {
				case !exists && !os.IsNotExist(err):
					t.Errorf("data dir absent before: now %v, %v", entries, err)
				case exists && (err != nil || len(entries) != 0):
					t.Errorf("data dir empty before: now %v, %v", entries, err)
				}
			}
		})
	}
}
