package agent_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/runtime/linux"
)

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The config file gives an image as a command line (ready on a TCP
// connect) or as an object saying how it is ready.
func TestConfigImagesBothForms(t *testing.T) {
	var c agent.Config
	err := c.LoadFile(writeConfig(t, `{"runtime": "linux", "images": {
		"crucible": ["/usr/bin/crucible-downstairs", "run", "--address", "{listen}"],
		"nexus": {"command": ["/opt/nexus", "{listen}"], "ready": {"http": {"path": "/healthz", "status": 200}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := linux.Images{
		"crucible": {Command: []string{"/usr/bin/crucible-downstairs", "run", "--address", "{listen}"}},
		"nexus":    {Command: []string{"/opt/nexus", "{listen}"}, Ready: linux.Ready{HTTP: &linux.HTTPReady{Path: "/healthz", Status: 200}}},
	}
	if !reflect.DeepEqual(c.Images, want) {
		t.Fatalf("images = %+v, want %+v", c.Images, want)
	}
	if err := c.Images.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A bad image is a clear error when the agent starts (or when its config
// file is read), naming the zone type and the field; nothing is started.
func TestConfigBadImageRefused(t *testing.T) {
	var c agent.Config
	err := c.LoadFile(writeConfig(t, `{"images": {"crucible": {"command": ["/x"], "ready": {"http": {"stauts": 200}}}}}`))
	if err == nil || !strings.Contains(err.Error(), `"crucible"`) || !strings.Contains(err.Error(), `unknown field "stauts"`) {
		t.Errorf("LoadFile = %v, want an error naming crucible and the field", err)
	}
	for _, tc := range []struct {
		images linux.Images
		want   []string
	}{
		{linux.Images{"crucible": {}}, []string{`images: "crucible": command`}},
		{linux.Images{"crucible": {Command: []string{"/x"}, Ready: linux.Ready{HTTP: &linux.HTTPReady{Status: 42}}}}, []string{`"crucible"`, "ready.http.status 42"}},
		{linux.Images{"crucible": {Command: []string{"/x"}, Ready: linux.Ready{Command: []string{"probe"}}}}, []string{`"crucible"`, "ready.command[0]"}},
		{linux.Images{"warp_drive": {Command: []string{"/x"}}}, []string{`"warp_drive"`, "not a known zone type"}},
	} {
		cfg := agent.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Runtime: "linux", Images: tc.images}
		a, err := agent.New(cfg, testLogger(t))
		if err == nil {
			run(t, a) // release its listener
			t.Fatalf("New accepted images %+v", tc.images)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New: %q does not mention %q", err, w)
			}
		}
		if entries, _ := os.ReadDir(cfg.DataDir); len(entries) != 0 {
			t.Errorf("New with a bad image left %d entries in the data dir", len(entries))
		}
	}
}
