package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/vmm/vmmtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

const testVMM = "6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01"

const testInstance = "0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e"

// ensureBody is an InstanceEnsureBody as the control plane sends it, with a
// spec any sled can realise (vmmtest).
func ensureBody(addr string) string {
	return string(vmmtest.Body(testInstance, addr, nil, nil))
}

// ensureBodyWith is ensureBody with top-level members replaced.
func ensureBodyWith(addr string, extra map[string]any) string {
	return string(vmmtest.Body(testInstance, addr, nil, extra))
}

// ensureBodySpec is ensureBody with its spec changed by change.
func ensureBodySpec(addr string, change func(spec map[string]any)) string {
	s := vmmtest.Spec()
	change(s)
	return string(vmmtest.Body(testInstance, addr, s, nil))
}

// call sends a JSON request to the agent and returns the status and body.
func call(t *testing.T, a *agent.Agent, method, path, body string) (int, []byte) {
	t.Helper()
	return callCtx(t, t.Context(), a, method, path, body)
}

// callCtx is call within ctx.
func callCtx(t *testing.T, ctx context.Context, a *agent.Agent, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.Addr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func vmmState(t *testing.T, a *agent.Agent) api.SledVmmState {
	t.Helper()
	code, b := call(t, a, http.MethodGet, "/vmms/"+testVMM+"/state", "")
	if code != http.StatusOK {
		t.Fatalf("GET state: %d %s", code, b)
	}
	var st api.SledVmmState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func waitVMM(t *testing.T, a *agent.Agent, state string) api.SledVmmState {
	t.Helper()
	var st api.SledVmmState
	waitFor(t, "VMM "+state, func() (bool, string) {
		st = vmmState(t, a)
		return st.VmmState.State == state, fmt.Sprintf("%+v", st)
	})
	return st
}

func TestVMMRoundTripOverTheAPI(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	body := ensureBody("[fd00:1122:3344:101::1:5]:12400")
	code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, body)
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"vmm_state"`)) || !bytes.Contains(b, []byte(`"migration_in":null`)) {
		t.Fatalf("register: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, body); code != http.StatusOK {
		t.Fatalf("registering again: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:6]:12400")); code != http.StatusConflict {
		t.Fatalf("registering with another address: %d %s", code, b)
	}
	first := vmmState(t, a)
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`); code != http.StatusOK || !bytes.Contains(b, []byte(`"updated_runtime":{`)) {
		t.Fatalf("requesting running: %d %s", code, b)
	}
	running := waitVMM(t, a, "running")
	if running.VmmState.Gen <= first.VmmState.Gen {
		t.Fatalf("gen %d, then %d", first.VmmState.Gen, running.VmmState.Gen)
	}
	code, b = call(t, a, http.MethodGet, "/agent/vmms", "")
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"hostname":"vm0"`)) || !bytes.Contains(b, []byte(zone.VMMNamePrefix+testVMM)) {
		t.Fatalf("GET /agent/vmms: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"stopped"}}`); code != http.StatusOK {
		t.Fatalf("requesting stopped: %d %s", code, b)
	}
	waitVMM(t, a, "destroyed")
	if code, b := call(t, a, http.MethodDelete, "/vmms/"+testVMM, ""); code != http.StatusOK || !bytes.Contains(b, []byte(`"updated_runtime"`)) {
		t.Fatalf("unregister: %d %s", code, b)
	}
	if code, _ := call(t, a, http.MethodGet, "/vmms/"+testVMM+"/state", ""); code != http.StatusNotFound {
		t.Fatalf("GET state after unregister: %d", code)
	}
}

// okAddr is a propolis_addr a VMM may have.
const okAddr = "[fd00:1122:3344:101::1:5]:12400"

func comps(s map[string]any) map[string]any { return s["components"].(map[string]any) }

func TestVMMBadRequestsChangeNothing(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	for _, c := range []struct {
		method, path, body string
		code               int
		says               string
	}{
		{http.MethodGet, "/vmms/" + testVMM + "/state", "", 404, "no such VMM"},
		{http.MethodPut, "/vmms/not-a-uuid", ensureBody("[fd00::1]:1"), 400, "propolis_id"},
		{http.MethodPut, "/vmms/" + testVMM, `{"instance_id":"0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e"}`, 400, "local_config, metadata, propolis_addr, vmm_runtime, vmm_spec"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBody("192.0.2.1:12400"), 400, "propolis_addr"},
		// Off the sled's subnet: the runtime would route this sled's
		// traffic for it into the VMM's zone.
		{http.MethodPut, "/vmms/" + testVMM, ensureBody("[2001:4860:4860::8888]:12400"), 400,
			`propolis_addr \"[2001:4860:4860::8888]:12400\": 2001:4860:4860::8888 is outside the sled's subnet fd00:1122:3344:101::/64`},
		{http.MethodPut, "/vmms/" + testVMM, ensureBody("[fd00:1122:3344:102::1:5]:12400"), 400, "fd00:1122:3344:102::1:5 is outside the sled's subnet"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBody("[fd00:1122:3344:101::2]:12400"), 400, "fd00:1122:3344:101::2 is one of the first addresses of the sled's subnet"},
		{http.MethodPut, "/vmms/" + testVMM, strings.Replace(ensureBody("[fd00::1]:1"), `"gen":1`, `"gen":9223372036854775808`, 1), 400, "vmm_runtime.gen 9223372036854775808: want an integer between 0 and 9223372036854775807"},
		// What the document says upstream's types are: objects, and one of
		// VmmState's values.
		{http.MethodPut, "/vmms/" + testVMM, ensureBodyWith("[fd00::1]:1", map[string]any{"metadata": nil}), 400, "metadata: want a JSON object (upstream's InstanceMetadata), not null"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodyWith("[fd00::1]:1", map[string]any{"vmm_spec": []any{}}), 400, "vmm_spec: want a JSON object (upstream's VmmSpec)"},
		// Specs this sled cannot realise.
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) { s["board"].(map[string]any)["cpus"] = 0 }), 400, "board.cpus 0"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) { s["board"].(map[string]any)["cpus"] = 10000 }), 400, "hardware threads for guests"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) { s["board"].(map[string]any)["memory_mb"] = 0 }), 400, "board.memory_mb 0"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) { s["board"].(map[string]any)["memory_mb"] = 1 << 40 }), 400, "not enough room in the VMM reservoir"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) {
			comps(s)["boot-disk-backend"] = map[string]any{"type": "file_storage_backend", "component": map[string]any{"path": "/etc/shadow", "readonly": false, "block_size": 512}}
		}), 400, `path \"/etc/shadow\" (/etc/shadow) is outside this sled's guest storage`},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) {
			comps(s)["boot-disk-backend"] = map[string]any{"type": "crucible_storage_backend", "component": map[string]any{"readonly": false, "request_json": "{}"}}
		}), 400, "crucible_storage_backend): cannot be realised on this sled"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) {
			comps(s)["boot-settings"] = map[string]any{"type": "boot_settings", "component": map[string]any{"order": []any{map[string]any{"id": "floppy"}}}}
		}), 400, `boot entry \"floppy\" names no component`},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) {
			comps(s)["net0"].(map[string]any)["component"].(map[string]any)["pci_path"] = map[string]any{"bus": 0, "device": 16, "function": 0}
		}), 400, "are both at pci_path 00:10.0"},
		{http.MethodPut, "/vmms/" + testVMM, ensureBodySpec(okAddr, func(s map[string]any) {
			comps(s)["net0"].(map[string]any)["component"].(map[string]any)["backend_id"] = "nothing"
		}), 400, `backend_id \"nothing\" names no component`},
		{http.MethodPut, "/vmms/" + testVMM, strings.Replace(ensureBody("[fd00::1]:1"), `"state":"starting"`, `"state":"sideways"`, 1), 400, `vmm_runtime.state \"sideways\": want one of starting, running`},
		{http.MethodPut, "/vmms/" + testVMM + "/state", `{"state":{"type":"running"}}`, 404, "no such VMM"},
		{http.MethodDelete, "/vmms/" + testVMM, "", 404, "no such VMM"},
	} {
		code, b := call(t, a, c.method, c.path, c.body)
		if code != c.code || !strings.Contains(string(b), c.says) || !strings.Contains(string(b), `"request_id"`) {
			t.Errorf("%s %s: %d %s, want %d saying %q", c.method, c.path, code, b, c.code, c.says)
		}
		// Nexus's instance watcher takes only this code as "the VMM is
		// gone".
		if code == http.StatusNotFound && !strings.Contains(string(b), `"error_code":"NO_SUCH_INSTANCE"`) {
			t.Errorf("%s %s: %d %s, want error_code NO_SUCH_INSTANCE", c.method, c.path, code, b)
		}
	}
	call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:5]:12400"))
	waitVMM(t, a, "starting")
	for body, says := range map[string]string{
		`{"state":{"type":"reboot"}}`: "starting",
		`{"state":{"type":"migration_target","value":{"src_propolis_addr":"[::1]:1"}}}`: "not supported",
		`{"state":{"type":"sideways"}}`: "want running, stopped or reboot",
		`{}`:                            `body must be`,
	} {
		code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", body)
		if code != http.StatusBadRequest || !strings.Contains(string(b), says) {
			t.Errorf("PUT state %s: %d %s, want 400 saying %q", body, code, b, says)
		}
	}
}

func TestVanishedVMMZoneIsReportedFailed(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:5]:12400"))
	call(t, a, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	waitVMM(t, a, "running")
	if !a.Sim().Vanish(zone.VMMNamePrefix + testVMM) {
		t.Fatal("no VMM zone in the sim")
	}
	failed := waitVMM(t, a, "failed")
	for _, path := range []string{"/agent/vmms", "/agent/inventory"} {
		code, b := call(t, a, http.MethodGet, path, "")
		if code != http.StatusOK || !bytes.Contains(b, []byte("zone vanished while the guest was running")) {
			t.Fatalf("GET %s after the zone vanished: %d %s (state %+v)", path, code, b, failed)
		}
	}
}

func TestRestartAdoptsRunningVMMs(t *testing.T) {
	dir := t.TempDir()
	first := newAgent(t, agent.Config{DataDir: dir})
	stop := run(t, first)
	call(t, first, http.MethodPut, "/vmms/"+testVMM, ensureBody("[fd00:1122:3344:101::1:5]:12400"))
	call(t, first, http.MethodPut, "/vmms/"+testVMM+"/state", `{"state":{"type":"running"}}`)
	before := waitVMM(t, first, "running")
	name := zone.VMMNamePrefix + testVMM
	inc, ok := first.Sim().Incarnation(name)
	if !ok {
		t.Fatal("no VMM zone")
	}
	// A VMM zone of no record.
	stray := zone.Spec{Name: zone.VMMNamePrefix + "00000000-0000-4000-8000-0000000000aa", ID: "00000000-0000-4000-8000-0000000000aa", Hash: "x"}
	stray.Config.ZoneType.Type = zone.VMMZoneType
	if err := first.Sim().Ensure(t.Context(), stray); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	second := newAgent(t, agent.Config{DataDir: dir})
	run(t, second)
	after := waitVMM(t, second, "running")
	if after.VmmState.Gen <= before.VmmState.Gen {
		t.Errorf("gen %d after the restart, %d before: it must go on rising", after.VmmState.Gen, before.VmmState.Gen)
	}
	if got, ok := second.Sim().Incarnation(name); !ok || got != inc {
		t.Errorf("VMM zone recreated: incarnation %d → %d (%v)", inc, got, ok)
	}
	// No record says it is not wanted: it is left running, and reported.
	waitFor(t, "the stray VMM zone reported unknown", func() (bool, string) {
		_, b := call(t, second, http.MethodGet, "/agent/vmms", "")
		return bytes.Contains(b, []byte("zone "+stray.Name+" runs but no readable record of it")), string(b)
	})
	if _, ok := second.Sim().Incarnation(stray.Name); !ok {
		t.Error("a VMM zone of no readable record was torn down")
	}
	code, b := call(t, second, http.MethodGet, "/agent/vmms", "")
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"adopted"`)) || !bytes.Contains(b, []byte(`"hostname":"vm0"`)) {
		t.Fatalf("GET /agent/vmms: %d %s", code, b)
	}
}

// An NVMe disk registers with has_write_cache (sled-agent 48's vmm_spec
// requires it) and is refused without it, naming the member; the refusal
// changes nothing.
func TestVMMNVMeDiskWriteCache(t *testing.T) {
	a, _ := start(t, agent.Config{DataDir: t.TempDir()})
	nvme := func(member map[string]any) func(map[string]any) {
		return func(s map[string]any) {
			c := map[string]any{"backend_id": "boot-disk-backend", "pci_path": map[string]any{"bus": 0, "device": 0x10, "function": 0}, "serial_number": make([]int, 20)}
			for k, v := range member {
				c[k] = v
			}
			s["components"].(map[string]any)["boot-disk"] = map[string]any{"type": "nvme_disk", "component": c}
		}
	}
	const addr = "[fd00:1122:3344:101::1:5]:12400"
	code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBodySpec(addr, nvme(nil)))
	if code != http.StatusBadRequest || !bytes.Contains(b, []byte("has_write_cache")) {
		t.Fatalf("an NVMe disk without has_write_cache: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodGet, "/vmms/"+testVMM+"/state", ""); code != http.StatusNotFound {
		t.Fatalf("after the refusal: %d %s", code, b)
	}
	if code, b := call(t, a, http.MethodPut, "/vmms/"+testVMM, ensureBodySpec(addr, nvme(map[string]any{"has_write_cache": false}))); code != http.StatusOK {
		t.Fatalf("an NVMe disk with has_write_cache: %d %s", code, b)
	}
}
