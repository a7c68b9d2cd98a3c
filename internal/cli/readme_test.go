package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
)

// jsonBlock is a ```json block of a Markdown file: its body and the line
// its fence is on.
var jsonBlock = regexp.MustCompile("(?ms)^```json\n(.*?)^```")

// readmeBlocks returns the ```json blocks of the repository's README.md by
// the line they start on.
func readmeBlocks(t *testing.T) map[int][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]byte{}
	for _, m := range jsonBlock.FindAllSubmatchIndex(data, -1) {
		line := 1
		for _, c := range data[:m[0]] {
			if c == '\n' {
				line++
			}
		}
		out[line] = data[m[2]:m[3]]
	}
	return out
}

// isAgentConfig reports whether doc's keys are those of an agent config
// file (--config): a key that is a run flag, or images.
func isAgentConfig(doc map[string]json.RawMessage) bool {
	flags := newRunCmd().Flags()
	for key := range doc {
		if fl := flags.Lookup(key); (fl != nil && fl.Annotations[configKey] != nil) || key == "images" {
			return true
		}
	}
	return false
}

// isFaultMap reports whether doc's keys are a sim fault map's.
func isFaultMap(doc map[string]json.RawMessage) bool {
	for key := range doc {
		switch key {
		case "zones", "disks", "timesync":
		default:
			return false
		}
	}
	return len(doc) > 0
}

// Every ```json block of the README parses as JSON, and one of a kind the
// agent reads is accepted by the code that reads it: an agent config file
// (--config) as run resolves it, with its images as the agent checks them;
// a sim fault map (--sim-faults, PUT /debug/sim/faults) as the sim parses it.
func TestReadmeJSONBlocks(t *testing.T) {
	blocks := readmeBlocks(t)
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```json block: is this the repository's README?")
	}
	configs := 0
	for line, block := range blocks {
		var v any
		if err := json.Unmarshal(block, &v); err != nil {
			t.Errorf("README.md:%d: not JSON: %v", line, err)
			continue
		}
		doc, ok := v.(map[string]any)
		if !ok {
			continue
		}
		raw := map[string]json.RawMessage{}
		for k := range doc {
			raw[k] = nil
		}
		switch {
		case isAgentConfig(raw):
			configs++
			path := filepath.Join(t.TempDir(), "agent.json")
			if err := os.WriteFile(path, block, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, _, err := resolveWith("--config", path)
			if err != nil {
				t.Errorf("README.md:%d: an agent config file run refuses: %v", line, err)
				continue
			}
			if err := cfg.Images.Validate(); err != nil {
				t.Errorf("README.md:%d: an agent config file whose images the agent refuses: %v", line, err)
			}
		case isFaultMap(raw):
			if _, err := sim.ParseFaults(block); err != nil {
				t.Errorf("README.md:%d: a fault map the sim refuses: %v", line, err)
			}
		}
	}
	if configs == 0 {
		t.Error("README.md has no agent config file block: the images paragraph shows one")
	}
}
