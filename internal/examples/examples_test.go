// Package examples_test checks the documents in the repository's examples/
// folder: each is what upstream's sled-agent document says its operation
// takes (checked by an independent validator, not our own types), and an
// agent with the sim runtime accepts it as it is.
package examples_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/agent/agenttest"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/storage/btrfs"
)

// waitDeadline is the hang detector's: nothing here asserts how fast
// anything is.
const waitDeadline = 20 * time.Second

// sledIP is the --underlay-ip the examples are written for (the agent's
// default): their zones and VMMs are in its /64.
const sledIP = "fd00:1122:3344:101::1"

// imageDir is the --vmm-image-dir the examples' file backends name; the
// README tells an operator to use it or change the path.
const imageDir = "/var/lib/sled-agent/images/"

type kind int

const (
	sledConfig kind = iota // PUT /omicron-config, 204
	vmmEnsure              // PUT /vmms/{propolis_id}, 200
)

// examples is every file of examples/ but its README, with what it is and
// the VMM id it is registered under. A file missing here fails the test.
var examples = map[string]struct {
	kind kind
	id   string
	// vdevs are the synthetic disk files of --vdev-dir whose disks a
	// sled config names, all of its disks.
	vdevs []string
	// seeds are the components of a VMM registration whose blob is a
	// cloud-init NoCloud seed image.
	seeds []string
}{
	"sled-config-vdev.json": {kind: sledConfig, vdevs: []string{"u2_a.vdev", "u2_b.vdev"}},
	"vmm-test-guest.json":   {kind: vmmEnsure, id: "4d3c2b1a-0e9f-4a8b-9c7d-6e5f4a3b2c01", seeds: []string{"cloud-init-backend"}},
	"vmm-minimal.json":      {kind: vmmEnsure, id: "4d3c2b1a-0e9f-4a8b-9c7d-6e5f4a3b2c02"},
}

// dir is the repository's examples/ folder.
func dir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "examples")
		}
		if filepath.Dir(d) == d {
			t.Fatal("no go.mod above the working directory")
		}
	}
}

// Every file in examples/ is a case here, and every case a file: a new
// example without a test, or a case whose file went, fails.
func TestEveryExampleIsTested(t *testing.T) {
	entries, err := os.ReadDir(dir(t))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Name() == "README.md" || filepath.Ext(e.Name()) == ".go" {
			continue // what the examples are; the package that embeds them
		}
		seen[e.Name()] = true
		if _, ok := examples[e.Name()]; !ok {
			t.Errorf("examples/%s has no case in this test: add it to examples", e.Name())
		}
	}
	for name := range examples {
		if !seen[name] {
			t.Errorf("examples/%s is a case of this test but not in examples/", name)
		}
	}
	readme, err := os.ReadFile(filepath.Join(dir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range seen {
		if !bytes.Contains(readme, []byte("`"+name+"`")) {
			t.Errorf("examples/README.md does not say what %s is", name)
		}
	}
}

// Each example, as it is, is what upstream's document says its operation
// takes, and an agent (sim runtime, --underlay-ip sledIP) accepts it: a
// sled config is 204 and its zones then run; a VMM registration is 200.
func TestExamplesAreAccepted(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	names := make([]string, 0, len(examples))
	for name := range examples {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			ex := examples[name]
			body, err := os.ReadFile(filepath.Join(dir(t), name))
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(body) {
				t.Fatalf("examples/%s is not JSON", name)
			}
			images := t.TempDir()
			a := startAgent(t, agent.Config{DataDir: t.TempDir(), UnderlayIP: sledIP, VMMImageDir: images})
			switch ex.kind {
			case sledConfig:
				checkVdevs(t, body, ex.vdevs)
				x := put(t, spec, a, "/omicron-config", body)
				if x.Status != http.StatusNoContent {
					t.Fatalf("PUT /omicron-config: %d %s, want 204", x.Status, x.Body)
				}
				waitZonesRunning(t, a, body)
			case vmmEnsure:
				checkSeeds(t, body, ex.seeds)
				// The file backends' image directory is the test's own: the
				// image each names is made there (any bytes: the sim runs
				// no guest), its path moved there.
				body = withImageDir(t, body, images)
				x := put(t, spec, a, "/vmms/"+ex.id, body)
				if x.Status != http.StatusOK {
					t.Fatalf("PUT /vmms/%s: %d %s, want 200", ex.id, x.Status, x.Body)
				}
			}
		})
	}
}

// checkVdevs fails the test unless the disks of the sled config doc are
// those the Linux storage backend finds for the files vdevs in its vdev
// dir, and the README names each file.
func checkVdevs(t *testing.T, doc []byte, vdevs []string) {
	t.Helper()
	var cfg struct {
		Disks map[string]struct {
			Identity storage.DiskIdentity `json:"identity"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(doc, &cfg); err != nil {
		t.Fatal(err)
	}
	var got, want []storage.DiskIdentity
	for _, d := range cfg.Disks {
		got = append(got, d.Identity)
	}
	readme, err := os.ReadFile(filepath.Join(dir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range vdevs {
		id, ok := btrfs.VdevIdentity(f)
		if !ok {
			t.Fatalf("%s is not a synthetic disk's file name", f)
		}
		want = append(want, id)
		if !bytes.Contains(readme, []byte(f)) {
			t.Errorf("examples/README.md does not name %s, a disk of the config", f)
		}
	}
	byKey := func(a, b storage.DiskIdentity) int { return strings.Compare(a.Serial, b.Serial) }
	slices.SortFunc(got, byKey)
	slices.SortFunc(want, byKey)
	if !slices.Equal(got, want) {
		t.Errorf("the config's disks are %+v; the files %v are the disks %+v", got, vdevs, want)
	}
}

// checkSeeds fails the test unless each of the components seeds of the VMM
// registration doc is a blob holding a cloud-init NoCloud seed: a FAT
// filesystem labelled CIDATA whose root has the files meta-data and
// user-data (their 8.3 names, which mtools and mkfs write beside the long
// ones).
func checkSeeds(t *testing.T, doc []byte, seeds []string) {
	t.Helper()
	var body struct {
		Spec struct {
			Components map[string]struct {
				Type      string `json:"type"`
				Component struct {
					Base64 string `json:"base64"`
				} `json:"component"`
			} `json:"components"`
		} `json:"vmm_spec"`
	}
	if err := json.Unmarshal(doc, &body); err != nil {
		t.Fatal(err)
	}
	for _, id := range seeds {
		c, ok := body.Spec.Components[id]
		if !ok || c.Type != "blob_storage_backend" {
			t.Errorf("component %s: not a blob_storage_backend", id)
			continue
		}
		img, err := base64.StdEncoding.DecodeString(c.Component.Base64)
		if err != nil {
			t.Errorf("component %s: %v", id, err)
			continue
		}
		// The FAT12/16 boot sector: the volume label at 43, the signature at 510.
		if len(img) < 4096 || string(img[43:54]) != "CIDATA     " || img[510] != 0x55 || img[511] != 0xaa {
			t.Errorf("component %s: not a FAT image labelled CIDATA (%d bytes)", id, len(img))
			continue
		}
		for _, name := range []string{"META-D", "USER-D"} {
			if !bytes.Contains(img, []byte(name)) {
				t.Errorf("component %s: the seed has no %s… file", id, name)
			}
		}
	}
}

// withImageDir returns body with every path under imageDir moved to dir,
// where a file of that name is made.
func withImageDir(t *testing.T, body []byte, dir string) []byte {
	t.Helper()
	var doc struct {
		Spec struct {
			Components map[string]struct {
				Type      string `json:"type"`
				Component struct {
					Path string `json:"path"`
				} `json:"component"`
			} `json:"components"`
		} `json:"vmm_spec"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	for id, c := range doc.Spec.Components {
		if c.Type != "file_storage_backend" {
			continue
		}
		rel, ok := strings.CutPrefix(c.Component.Path, imageDir)
		if !ok || rel == "" || strings.Contains(rel, "/") {
			t.Fatalf("component %s: path %q is not a file of %s, the image directory the README names", id, c.Component.Path, imageDir)
		}
		if err := os.WriteFile(filepath.Join(dir, rel), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.ReplaceAll(body, []byte(`"`+imageDir), []byte(`"`+dir+"/"))
}

// put sends body as a client generated from upstream's document would;
// the request and the answer must be what the document says.
func put(t *testing.T, spec *openapitest.Spec, a *agent.Agent, path string, body []byte) openapitest.Exchange {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+a.Addr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("api-version", api.Version)
	req.Header.Set("Content-Type", "application/json")
	x, err := spec.Do(t, http.DefaultClient, req, body)
	if err != nil {
		t.Errorf("%v\nanswer: %d %s", err, x.Status, x.Body)
	}
	return x
}

// waitZonesRunning waits until every zone of the sled config doc is running.
func waitZonesRunning(t *testing.T, a *agent.Agent, doc []byte) {
	t.Helper()
	var cfg struct {
		Zones map[string]json.RawMessage `json:"zones"`
	}
	if err := json.Unmarshal(doc, &cfg); err != nil {
		t.Fatal(err)
	}
	c, err := client.New("http://" + a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = 5 * time.Second
	deadline := time.Now().Add(waitDeadline)
	for {
		zones, err := c.ZoneStates(t.Context())
		state := ""
		running := 0
		if err != nil {
			state = err.Error()
		} else {
			for _, z := range zones {
				state += fmt.Sprintf("%s %s %s %s; ", z.Name, z.State, z.WaitingFor, z.LastError)
				if z.State == "running" {
					running++
				}
			}
		}
		if running == len(cfg.Zones) && len(zones) == len(cfg.Zones) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d of %d zones running: %s", waitDeadline, running, len(cfg.Zones), state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startAgent runs an agent on an ephemeral loopback port until the test
// ends. Its NTP zones never set the host's clock.
func startAgent(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.NTPNoClock = true
	return agenttest.Run(t, cfg)
}
