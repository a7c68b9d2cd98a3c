package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// recordVMMs are the VMMs of the tests of lost records.
var recordVMMs = []string{
	"6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a11",
	"6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a12",
	"6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a13",
}

// startVMMs runs an agent on dir with the VMMs of recordVMMs registered and
// running, stops it (the VMMs run on), and returns their zones'
// incarnations.
func startVMMs(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	first := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, first)
	inc := map[string]uint64{}
	for i, id := range recordVMMs {
		body := ensureBody(fmt.Sprintf("[fd00:1122:3344:101::1:%x]:12400", i+5))
		if code, b := call(t, first, http.MethodPut, "/vmms/"+id, body); code != http.StatusOK {
			t.Fatalf("register %s: %d %s", id, code, b)
		}
		if code, b := call(t, first, http.MethodPut, "/vmms/"+id+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK {
			t.Fatalf("run %s: %d %s", id, code, b)
		}
	}
	for _, id := range recordVMMs {
		waitFor(t, "VMM "+id+" running", func() (bool, string) {
			_, b := call(t, first, http.MethodGet, "/vmms/"+id+"/state", "")
			return bytes.Contains(b, []byte(`"state":"running"`)), string(b)
		})
		n, ok := first.Sim().Incarnation(zone.VMMNamePrefix + id)
		if !ok {
			t.Fatalf("no zone for VMM %s", id)
		}
		inc[id] = n
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return inc
}

// vmmRecordFiles are the files under dir named after a VMM of recordVMMs:
// its records, wherever the agent keeps them.
func vmmRecordFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		for _, id := range recordVMMs {
			if err == nil && !d.IsDir() && d.Name() == id+".json" {
				out = append(out, path)
			}
		}
		return nil
	})
	if len(out) == 0 {
		t.Fatal("no VMM record found")
	}
	return out
}

// Losing the VMMs' records, or every copy of them going bad, destroys no
// VMM zone: a restarted agent leaves each running, reports it unknown with
// why, answers Nexus 404 NO_SUCH_INSTANCE for it, and removes it only when
// the operator asks.
func TestLostVMMRecordsDestroyNothing(t *testing.T) {
	for name, lose := range map[string]func(t *testing.T, dir string){
		"moved aside": func(t *testing.T, dir string) {
			for _, p := range vmmRecordFiles(t, dir) {
				d := filepath.Dir(p)
				if _, err := os.Stat(d); err == nil {
					if err := os.Rename(d, d+".aside"); err != nil {
						t.Fatal(err)
					}
				}
			}
		},
		"every copy corrupt": func(t *testing.T, dir string) {
			for _, p := range vmmRecordFiles(t, dir) {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b = bytes.Replace(b, []byte(`"instance_id"`), []byte(`"instance_iX"`), 1)
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			inc := startVMMs(t, dir)
			lose(t, dir)
			second := newAgent(t, agent.Config{DataDir: dir})
			run(t, second)
			waitFor(t, "every VMM reported unknown", func() (bool, string) {
				for _, id := range recordVMMs {
					if _, ok := second.Sim().Incarnation(zone.VMMNamePrefix + id); !ok {
						t.Fatalf("the zone of VMM %s, of which no record is readable, was destroyed", id)
					}
				}
				_, b := call(t, second, http.MethodGet, "/agent/vmms", "")
				var page struct {
					Items []struct {
						PropolisID     string `json:"propolis_id"`
						Status, Detail string
					}
				}
				json.Unmarshal(b, &page)
				n := 0
				for _, v := range page.Items {
					if v.Status == "unknown" && strings.Contains(v.Detail, "zone "+zone.VMMNamePrefix+v.PropolisID+" runs but no readable record of it: ") {
						n++
					}
				}
				return n == len(recordVMMs), string(b)
			})
			for _, id := range recordVMMs {
				if n, ok := second.Sim().Incarnation(zone.VMMNamePrefix + id); !ok || n != inc[id] {
					t.Fatalf("zone of VMM %s with no readable record: incarnation %d → %d (%v)", id, inc[id], n, ok)
				}
				for _, c := range []struct{ method, path, body string }{
					{http.MethodGet, "/vmms/" + id + "/state", ""},
					{http.MethodPut, "/vmms/" + id + "/state", `{"state":{"type":"stopped"}}`},
				} {
					code, b := call(t, second, c.method, c.path, c.body)
					if code != http.StatusNotFound || !bytes.Contains(b, []byte(`"error_code":"NO_SUCH_INSTANCE"`)) {
						t.Errorf("%s %s of an unknown VMM: %d %s, want 404 NO_SUCH_INSTANCE", c.method, c.path, code, b)
					}
				}
			}
			if code, b := call(t, second, http.MethodGet, "/agent/inventory", ""); code != http.StatusOK || !bytes.Contains(b, []byte(`"status":"unknown"`)) {
				t.Errorf("inventory does not show the unknown VMMs: %d %s", code, b)
			}
			// Registering over one is refused: what runs there is not known.
			if code, b := call(t, second, http.MethodPut, "/vmms/"+recordVMMs[1], ensureBody("[fd00:1122:3344:101::1:6]:12400")); code != http.StatusConflict || !bytes.Contains(b, []byte("remove-unknown")) {
				t.Errorf("registering over an unknown VMM: %d %s, want 409", code, b)
			}
			// The operator removes one on purpose.
			id := recordVMMs[0]
			if code, b := call(t, second, http.MethodPost, "/agent/vmms/"+id+"/remove-unknown", ""); code != http.StatusOK || !bytes.Contains(b, []byte("removed on purpose")) {
				t.Fatalf("remove-unknown: %d %s", code, b)
			}
			if _, ok := second.Sim().Incarnation(zone.VMMNamePrefix + id); ok {
				t.Fatal("remove-unknown left the zone")
			}
			if code, b := call(t, second, http.MethodPost, "/agent/vmms/"+id+"/remove-unknown", ""); code != http.StatusNotFound {
				t.Errorf("remove-unknown again: %d %s, want 404", code, b)
			}
			for _, other := range recordVMMs[1:] {
				if _, ok := second.Sim().Incarnation(zone.VMMNamePrefix + other); !ok {
					t.Errorf("removing %s took the zone of %s too", id, other)
				}
			}
			// A VMM the agent has a record of is not removed as unknown.
			call(t, second, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::2:5]:12400"))
			if code, b := call(t, second, http.MethodPost, "/agent/vmms/"+testVMM+"/remove-unknown", ""); code != http.StatusConflict {
				t.Errorf("remove-unknown of a registered VMM: %d %s, want 409", code, b)
			}
			if code, b := call(t, second, http.MethodPost, "/agent/vmms/not-a-uuid/remove-unknown", ""); code != http.StatusBadRequest {
				t.Errorf("remove-unknown of a bad id: %d %s, want 400", code, b)
			}
		})
	}
}

// An unregister cut short after its durable record (its zone's teardown
// failed, and the agent stopped) is finished by the next agent.
func TestInterruptedVMMUnregisterIsFinished(t *testing.T) {
	dir := t.TempDir()
	startVMMs(t, dir)
	first := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, first)
	id := recordVMMs[0]
	if code, b := call(t, first, http.MethodPut, "/debug/sim/faults", `{"zones":{"`+id+`":{"stop":"fail"}}}`); code/100 != 2 {
		t.Fatalf("setting faults: %d %s", code, b)
	}
	if code, b := call(t, first, http.MethodDelete, "/vmms/"+id, ""); code != http.StatusInternalServerError {
		t.Fatalf("unregister with a failing teardown: %d %s", code, b)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := first.Sim().Incarnation(zone.VMMNamePrefix + id); !ok {
		t.Fatal("the zone is gone already: nothing to finish")
	}
	second := newAgent(t, agent.Config{DataDir: dir})
	run(t, second)
	waitFor(t, "the unregister finished", func() (bool, string) {
		_, there := second.Sim().Incarnation(zone.VMMNamePrefix + id)
		var files []string
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == id+".json" {
				files = append(files, path)
			}
			return nil
		})
		return !there && len(files) == 0, fmt.Sprintf("zone there %v, records %v", there, files)
	})
	if code, _ := call(t, second, http.MethodGet, "/vmms/"+id+"/state", ""); code != http.StatusNotFound {
		t.Errorf("GET state of the unregistered VMM: %d", code)
	}
	for _, other := range recordVMMs[1:] {
		if code, b := call(t, second, http.MethodGet, "/vmms/"+other+"/state", ""); code != http.StatusOK {
			t.Errorf("VMM %s: %d %s", other, code, b)
		}
	}
}
