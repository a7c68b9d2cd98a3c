package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// resolveWith parses args as the run command's flags, resolves them against
// the config file they name, and returns the config and the log level.
func resolveWith(args ...string) (agent.Config, string, error) {
	d := newDaemonFlags()
	cmd := &cobra.Command{Use: "run"}
	d.addAll(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return agent.Config{}, "", err
	}
	cfg, err := d.resolve(cmd)
	return cfg, d.logLevel, err
}

// configValue is a value for a flag of the given type that differs from
// every default, as the config file spells it.
func configValue(t *testing.T, fl *pflag.Flag) any {
	switch fl.Value.Type() {
	case "string":
		return "from-the-file-" + fl.Name
	case "stringArray":
		return []string{"a-" + fl.Name, "b-" + fl.Name}
	case "int", "uint64", "uint32":
		return 7
	case "duration":
		return "7s"
	case "bool":
		return true
	}
	t.Fatalf("flag --%s: a type (%s) this test does not know", fl.Name, fl.Value.Type())
	return nil
}

// Every flag of run is a key of its config file: walked from run's own flag
// set, each is set through a file alone and must change what the agent is
// given (or, for --log-level, the log level); a flag on the command line
// still wins.
func TestEveryRunFlagIsAConfigKey(t *testing.T) {
	base, baseLevel, err := resolveWith()
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	newRunCmd().Flags().VisitAll(func(fl *pflag.Flag) {
		if fl.Name == "config" {
			return
		}
		keys++
		t.Run(fl.Name, func(t *testing.T) {
			v := configValue(t, fl)
			doc, _ := json.Marshal(map[string]any{fl.Name: v})
			file := filepath.Join(t.TempDir(), "agent.json")
			if err := os.WriteFile(file, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, level, err := resolveWith("--config", file)
			if err != nil {
				t.Fatalf("config %s: %v", doc, err)
			}
			if fl.Name == "log-level" {
				// Any level string is taken here; newLogger checks it.
				if level != v || level == baseLevel {
					t.Errorf("config %s: log level %q", doc, level)
				}
				return
			}
			if reflect.DeepEqual(cfg, base) {
				t.Errorf("config %s: the agent's config is the default one", doc)
			}
			// The command line wins over the file.
			override := "--" + fl.Name + "=" + fl.DefValue
			switch {
			case fl.Value.Type() == "stringArray":
				override = "--" + fl.Name + "=x"
			case fl.DefValue == "":
				return
			}
			over, _, err := resolveWith("--config", file, override)
			if err != nil {
				t.Fatalf("%s and config %s: %v", override, doc, err)
			}
			if reflect.DeepEqual(over, cfg) {
				t.Errorf("%s and config %s: the file's value is kept", override, doc)
			}
		})
	})
	if keys < 30 {
		t.Errorf("run has %d flags besides --config; the walk missed some", keys)
	}
}

// A key that is no flag (nor images), or a value of the wrong kind, is
// refused, naming it.
func TestConfigFileRefusesUnknownKeysAndBadValues(t *testing.T) {
	for doc, want := range map[string][]string{
		`{"health-perod": "5s"}`:     {"health-perod"},
		`{"health-period": 5}`:       {"health-period"},
		`{"dns-server": "[::1]:53"}`: {"dns-server", "list of strings"},
		`{"listen": {"a": 1}}`:       {"listen"},
		`{"skip-timesync": "yes"}`:   {"skip-timesync"},
	} {
		file := filepath.Join(t.TempDir(), "agent.json")
		if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := resolveWith("--config", file)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("config %s: %v, want an error naming %q", doc, err, w)
			}
		}
	}
}

// The images, which no flag sets, are a key of the file too.
func TestConfigFileImages(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.json")
	doc := `{"runtime": "linux", "health-period": "1m", "images": {"crucible": ["/usr/bin/crucible-downstairs", "{listen}"]}}`
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := resolveWith("--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runtime != "linux" || cfg.HealthPeriod.String() != "1m0s" || len(cfg.Images["crucible"].Command) != 2 {
		t.Errorf("config %s: %+v", doc, cfg)
	}
}
