package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// resolve parses args as the run command's flags and resolves them against
// the config file they name.
func resolve(t *testing.T, args ...string) agent.Config {
	t.Helper()
	d := newDaemonFlags()
	cmd := &cobra.Command{Use: "run"}
	d.addAll(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	cfg, err := d.resolve(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestIdentityFlagsAndConfigKeys(t *testing.T) {
	const rack = "de608e01-b8e4-4d93-b972-a7dbed36dd22"
	file := filepath.Join(t.TempDir(), "agent.json")
	doc := `{"rack-id": "` + rack + `", "baseboard-part": "913-0000019", "baseboard-serial": "BRM42220004", "baseboard-revision": 6}`
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}

	// Not given anywhere: nothing set, so the agent reads the host.
	if cfg := resolve(t); cfg.RackID != "" || cfg.BaseboardPart != "" || cfg.BaseboardSerial != "" || cfg.BaseboardRevision != nil {
		t.Errorf("defaults: %+v, want no rack id and no baseboard overrides", cfg)
	}

	// The file's keys.
	cfg := resolve(t, "--config", file)
	if cfg.RackID != rack || cfg.BaseboardPart != "913-0000019" || cfg.BaseboardSerial != "BRM42220004" || cfg.BaseboardRevision == nil || *cfg.BaseboardRevision != 6 {
		t.Errorf("from the file: %+v", cfg)
	}

	// Flags win, and revision 0 is a value, not "not given".
	cfg = resolve(t, "--config", file, "--baseboard-serial", "BRM42220005", "--baseboard-revision", "0")
	if cfg.BaseboardSerial != "BRM42220005" || cfg.BaseboardRevision == nil || *cfg.BaseboardRevision != 0 || cfg.BaseboardPart != "913-0000019" {
		t.Errorf("flags over the file: %+v", cfg)
	}
	cfg = resolve(t, "--rack-id", rack, "--baseboard-part", "913-0000023", "--baseboard-revision", "4294967295")
	if cfg.RackID != rack || cfg.BaseboardPart != "913-0000023" || cfg.BaseboardRevision == nil || *cfg.BaseboardRevision != 4294967295 {
		t.Errorf("flags alone: %+v", cfg)
	}
}

func TestBaseboardRevisionMustBeANumber(t *testing.T) {
	for _, v := range []string{"x", "-1", "4294967296", "1.5"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"run", "--data-dir", t.TempDir(), "--baseboard-revision", v}, &stdout, &stderr); code == 0 {
			t.Fatalf("run --baseboard-revision %s succeeded", v)
		}
		if msg := stderr.String(); !strings.Contains(msg, "baseboard-revision") || !strings.Contains(msg, "4294967295") {
			t.Errorf("--baseboard-revision %s: %q does not name the flag and the range", v, msg)
		}
	}
}
