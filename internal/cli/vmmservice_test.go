package cli

import (
	"strings"
	"testing"
)

// The vmm-service command refuses what would not serve the VMM it is for;
// none of these starts serving.
func TestVMMServiceRefuses(t *testing.T) {
	const id = "5e9c1a2b-8f3d-4b6e-a7c1-0d2e4f6a8b9c"
	sled(t, "vmm-service", "--listen", "127.0.0.1:0").failed(t, "id")
	sled(t, "vmm-service", "--id", id).failed(t, "listen")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", "vmm-1").failed(t, "not a UUID")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--boot-time", "0s").failed(t, "--boot-time 0s", "positive")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--stop-time", "-1s").failed(t, "--stop-time -1s")
	sled(t, "vmm-service", "--listen", "256.0.0.1:1", "--id", id).failed(t, "256.0.0.1")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--backend", "qemu", "--dir", t.TempDir(),
		"--guest-cgroup", "sled-agent/../../memory").failed(t, "--guest-cgroup", "want sled-agent/<tag>/<zone>.guest")
	// QEMU never runs as root, nor as anyone else's id.
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--backend", "qemu", "--dir", t.TempDir(),
		"--qemu-ids", "0:65536").failed(t, "--qemu-ids", "root's")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--backend", "qemu", "--dir", t.TempDir(),
		"--qemu-ids", "60000:10000").failed(t, "--qemu-ids", "nobody's")
	sled(t, "vmm-service", "--listen", "127.0.0.1:0", "--id", id, "--backend", "qemu", "--dir", t.TempDir(),
		"--qemu-ids", "100000-200000").failed(t, "--qemu-ids", "FIRST:COUNT")
}

func TestVMMServiceIsHidden(t *testing.T) {
	r := sled(t, "--help").ok(t)
	if strings.Contains(r.stdout, "vmm-service") {
		t.Errorf("help lists the hidden vmm-service command:\n%s", r.stdout)
	}
	r = sled(t, "vmm-service", "--help").ok(t)
	for _, f := range []string{"--listen", "--id", "--boot-time", "--stop-time", "--reboot-time", "--guest-cgroup", "--qemu-ids"} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("vmm-service --help lacks %s:\n%s", f, r.stdout)
		}
	}
}
