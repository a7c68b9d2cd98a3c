package nexussim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

var cmpOpts = cmp.Options{cmpopts.EquateComparable(netip.AddrPort{})}

func start(t *testing.T) *nexussim.Server {
	t.Helper()
	s := nexussim.New(nexussim.Config{})
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// call sends an API request as the agent would (api-version 1.0.0, a JSON
// body); body "" sends none.
func call(t *testing.T, s *nexussim.Server, method, path, body string) simhttptest.Answer {
	t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	return simhttptest.Do(t, method, s.URL()+path, nexussim.APIVersion, ct, body)
}

// control sends a /__sim/ request.
func control(t *testing.T, s *nexussim.Server, method, path, body string) simhttptest.Answer {
	t.Helper()
	return simhttptest.Do(t, method, s.URL()+path, "", "application/json", body)
}

// message is the message of an error answer.
func message(t *testing.T, a simhttptest.Answer) string {
	t.Helper()
	var body struct{ Message string }
	if err := json.Unmarshal([]byte(a.Body), &body); err != nil {
		t.Fatalf("error body %q: %v", a.Body, err)
	}
	return body.Message
}

// try sends a request with simhttptest.Send and checks that it is
// answered status. It returns what went wrong rather than failing the
// test, so that any goroutine may call it.
func try(ctx context.Context, method, url, version, body string, status int) error {
	contentType := ""
	if body != "" {
		contentType = "application/json"
	}
	a, err := simhttptest.Send(ctx, method, url, version, contentType, body)
	if err == nil && a.Status != status {
		err = fmt.Errorf("%s %s: %d %s, want %d", method, url, a.Status, a.Body, status)
	}
	return err
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mutated is v as JSON, changed by f.
func mutated(t *testing.T, v any, f func(m map[string]any)) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(mustJSON(t, v)), &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	return mustJSON(t, m)
}

func sledInfo(gen nexussim.Generation) nexussim.SledAgentInfo {
	return nexussim.SledAgentInfo{
		SAAddress:             netip.MustParseAddrPort("[fd00:1122:3344:101::1]:12345"),
		RepoDepotPort:         12348,
		Role:                  nexussim.SledRoleScrimlet,
		Baseboard:             nexussim.Baseboard{Part: "913-0000019", Revision: 6, Serial: "BRM42220004"},
		UsableHardwareThreads: 128,
		UsablePhysicalRAM:     1 << 40,
		ReservoirSize:         1 << 39,
		CPUFamily:             nexussim.SledCpuFamilyAmdMilan,
		Generation:            gen,
	}
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func vmmState(gen nexussim.Generation, state nexussim.VmmState) nexussim.SledVmmState {
	return nexussim.SledVmmState{VmmState: nexussim.VmmRuntimeState{
		Gen: gen, State: state, TimeUpdated: t0.Add(time.Duration(gen) * time.Second),
	}}
}

func TestSledGetOfUnknownSledIs404(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	a := call(t, s, "GET", "/sled-agents/"+id, "")
	if a.Status != 404 {
		t.Fatalf("GET: %d %s, want 404", a.Status, a.Body)
	}
	if code := simhttptest.CheckErrorBody(t, a); code != "ObjectNotFound" {
		t.Errorf("error_code %q, want ObjectNotFound", code)
	}
	if !strings.Contains(a.Body, `not found: sled with id \"`+id+`\"`) {
		t.Errorf("body %s does not name the sled", a.Body)
	}
}

func TestSledPostThenGet(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	info := sledInfo(1)
	info.Decommissioned = true // only Nexus sets it
	withScope := mutated(t, info, func(m map[string]any) { m["sa_address"] = "[fd00:1122:3344:101::1%3]:12345" })
	if a := call(t, s, "POST", "/sled-agents/"+id, withScope); a.Status != 204 || a.Body != "" {
		t.Fatalf("POST: %d %q, want 204", a.Status, a.Body)
	}
	want := sledInfo(1) // the scope id is not kept, as upstream
	a := call(t, s, "GET", "/sled-agents/"+strings.ToUpper(id), "")
	if a.Status != 200 {
		t.Fatalf("GET: %d %s", a.Status, a.Body)
	}
	var got nexussim.SledAgentInfo
	if err := json.Unmarshal([]byte(a.Body), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Errorf("GET (-want +got):\n%s", diff)
	}
	if !strings.Contains(a.Body, `"decommissioned":false`) || !strings.Contains(a.Body, `"sa_address":"[fd00:1122:3344:101::1]:12345"`) {
		t.Errorf("GET body %s", a.Body)
	}
	if got, ok := s.Sled(id); !ok || !cmp.Equal(want, got, cmpOpts) {
		t.Errorf("Sled = %+v, %v", got, ok)
	}
	if got := s.Requests(); got["POST /sled-agents/{sled_id}"] != 1 || got["GET /sled-agents/{sled_id}"] != 1 {
		t.Errorf("Requests = %v", got)
	}
}

// Upstream refuses an upsert that is not newer with a bare 500, and keeps
// the first baseboard when it does apply one.
func TestSledOlderOrEqualGenerationDoesNotReplace(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	path := "/sled-agents/" + id
	if a := call(t, s, "POST", path, mustJSON(t, sledInfo(3))); a.Status != 204 {
		t.Fatalf("POST gen 3: %d %s", a.Status, a.Body)
	}
	for _, gen := range []nexussim.Generation{3, 2, 0} {
		changed := sledInfo(gen)
		changed.UsableHardwareThreads = 64
		a := call(t, s, "POST", path, mustJSON(t, changed))
		if a.Status != 500 {
			t.Errorf("POST gen %d: %d %s, want 500", gen, a.Status, a.Body)
			continue
		}
		if code := simhttptest.CheckErrorBody(t, a); code != "Internal" || !strings.Contains(a.Body, "Internal Server Error") {
			t.Errorf("POST gen %d: body %s, want upstream's internal error", gen, a.Body)
		}
	}
	if got, _ := s.Sled(id); !cmp.Equal(sledInfo(3), got, cmpOpts) {
		t.Errorf("after stale posts: %+v", got)
	}

	newer := sledInfo(4)
	newer.UsableHardwareThreads = 64
	newer.Role = nexussim.SledRoleGimlet
	newer.Baseboard.Serial = "OTHER"
	if a := call(t, s, "POST", path, mustJSON(t, newer)); a.Status != 204 {
		t.Fatalf("POST gen 4: %d %s", a.Status, a.Body)
	}
	want := newer
	want.Baseboard = sledInfo(1).Baseboard
	if got, _ := s.Sled(id); !cmp.Equal(want, got, cmpOpts) {
		t.Errorf("after gen 4 (-want +got):\n%s", cmp.Diff(want, got, cmpOpts))
	}
}

func TestSledReservoirMustBeBelowRAM(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	info := sledInfo(1)
	info.ReservoirSize = info.UsablePhysicalRAM
	if a := call(t, s, "POST", "/sled-agents/"+id, mustJSON(t, info)); a.Status != 500 {
		t.Errorf("POST: %d %s, want 500 as upstream's database refuses it", a.Status, a.Body)
	}
	if _, ok := s.Sled(id); ok {
		t.Error("the sled was stored")
	}
}

func TestDecommission(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	path := "/sled-agents/" + id
	if err := s.Decommission(id); !errors.Is(err, nexussim.ErrNoSled) {
		t.Errorf("Decommission of an unknown sled = %v, want ErrNoSled", err)
	}
	if a := call(t, s, "POST", path, mustJSON(t, sledInfo(1))); a.Status != 204 {
		t.Fatalf("POST: %d %s", a.Status, a.Body)
	}
	for range 2 {
		if err := s.Decommission(id); err != nil {
			t.Fatal(err)
		}
	}
	a := call(t, s, "GET", path, "")
	if a.Status != 200 || !strings.Contains(a.Body, `"decommissioned":true`) {
		t.Errorf("GET: %d %s, want decommissioned", a.Status, a.Body)
	}
	if a := call(t, s, "POST", path, mustJSON(t, sledInfo(2))); a.Status != 500 {
		t.Errorf("POST to a decommissioned sled: %d %s, want 500", a.Status, a.Body)
	}
	want := sledInfo(1)
	want.Decommissioned = true
	if got, _ := s.Sled(id); !cmp.Equal(want, got, cmpOpts) {
		t.Errorf("after a post to a decommissioned sled (-want +got):\n%s", cmp.Diff(want, got, cmpOpts))
	}
}

func TestVMMKeepsNewestByGenerationAndEveryArrival(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	sent := []nexussim.SledVmmState{
		vmmState(1, nexussim.VmmStateStarting),
		vmmState(3, nexussim.VmmStateRunning),
		vmmState(2, nexussim.VmmStateStarting), // older: taken, not applied
		vmmState(3, nexussim.VmmStateStopping), // equal: taken, not applied
	}
	mig := &nexussim.MigrationRuntimeState{Gen: 1, MigrationID: uuid.NewString(), State: nexussim.MigrationStatePending, TimeUpdated: t0}
	sent[1].MigrationIn = mig
	for i, st := range sent {
		path := "/vmms/" + id
		if i == 2 {
			path = "/vmms/" + strings.ToUpper(id) // the same VMM
		}
		if a := call(t, s, "PUT", path, mustJSON(t, st)); a.Status != 204 || a.Body != "" {
			t.Fatalf("PUT %d: %d %q, want 204", i, a.Status, a.Body)
		}
	}
	if diff := cmp.Diff(sent, s.VMMStates(id)); diff != "" {
		t.Errorf("VMMStates (-want +got):\n%s", diff)
	}
	latest, ok := s.LatestVMM(id)
	if diff := cmp.Diff(sent[1], latest); !ok || diff != "" {
		t.Errorf("LatestVMM (%v) (-want +got):\n%s", ok, diff)
	}
	// What is returned is a copy.
	latest.MigrationIn.Gen = 99
	if again, _ := s.LatestVMM(id); again.MigrationIn.Gen != 1 {
		t.Error("LatestVMM shares its migration with the caller")
	}
	if got := s.VMMStates(uuid.NewString()); got == nil || len(got) != 0 {
		t.Errorf("VMMStates of an unknown VMM = %#v, want empty", got)
	}
	if _, ok := s.LatestVMM(uuid.NewString()); ok {
		t.Error("LatestVMM of an unknown VMM")
	}
}

// Upstream refuses a VMM migrating to itself.
func TestVMMMigratingToItselfIs409(t *testing.T) {
	s := start(t)
	id := uuid.NewString()
	st := vmmState(2, nexussim.VmmStateMigrating)
	m := nexussim.MigrationRuntimeState{Gen: 1, MigrationID: uuid.NewString(), State: nexussim.MigrationStateInProgress, TimeUpdated: t0}
	st.MigrationIn, st.MigrationOut = &m, &m
	a := call(t, s, "PUT", "/vmms/"+id, mustJSON(t, st))
	if a.Status != 409 {
		t.Fatalf("PUT: %d %s, want 409", a.Status, a.Body)
	}
	if code := simhttptest.CheckErrorBody(t, a); code != "Conflict" {
		t.Errorf("error_code %q", code)
	}
	if got := s.VMMStates(id); len(got) != 0 {
		t.Errorf("VMMStates = %v, want none", got)
	}
}

func TestVMMFaults(t *testing.T) {
	s := start(t)
	a, b := uuid.NewString(), uuid.NewString()
	put := func(id string, gen nexussim.Generation) int {
		t.Helper()
		ans := call(t, s, "PUT", "/vmms/"+id, mustJSON(t, vmmState(gen, nexussim.VmmStateRunning)))
		if ans.Status != 204 {
			simhttptest.CheckErrorBody(t, ans)
		}
		return ans.Status
	}
	for _, bad := range []nexussim.VMMFault{{Status: 500}, {Status: 399}, {Status: 404, Count: -1}, {Status: 404, VMM: "nope"}} {
		if err := s.AddVMMFault(bad); err == nil {
			t.Errorf("AddVMMFault(%+v) took it", bad)
		}
	}

	// The next two updates, of any VMM; a bad body does not use one up.
	if err := s.AddVMMFault(nexussim.VMMFault{Status: 404, Count: 2}); err != nil {
		t.Fatal(err)
	}
	if ans := call(t, s, "PUT", "/vmms/"+a, `{}`); ans.Status != 400 {
		t.Errorf("bad body under a VMM fault: %d %s, want 400", ans.Status, ans.Body)
	}
	if got := []int{put(a, 1), put(b, 1), put(a, 2)}; !cmp.Equal(got, []int{404, 404, 204}) {
		t.Errorf("statuses %v, want 404 404 204", got)
	}
	if diff := cmp.Diff([]nexussim.SledVmmState{vmmState(1, nexussim.VmmStateRunning)}, s.RefusedVMMStates(a)); diff != "" {
		t.Errorf("RefusedVMMStates (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]nexussim.SledVmmState{vmmState(2, nexussim.VmmStateRunning)}, s.VMMStates(a)); diff != "" {
		t.Errorf("VMMStates (-want +got):\n%s", diff)
	}

	// Every update of one VMM, until cleared.
	if err := s.AddVMMFault(nexussim.VMMFault{Status: 410, VMM: strings.ToUpper(b)}); err != nil {
		t.Fatal(err)
	}
	if got := []int{put(b, 2), put(a, 3), put(b, 3)}; !cmp.Equal(got, []int{410, 204, 410}) {
		t.Errorf("statuses %v, want 410 204 410", got)
	}
	if got := s.VMMFaults(); len(got) != 1 || got[0].VMM != b {
		t.Errorf("VMMFaults = %+v", got)
	}
	s.ClearVMMFaults()
	if got := put(b, 4); got != 204 {
		t.Errorf("after ClearVMMFaults: %d", got)
	}
	if got := len(s.RefusedVMMStates(b)); got != 3 {
		t.Errorf("%d refused updates of b, want 3", got)
	}
}

func TestBadBodiesAreRefusedNamingTheProblem(t *testing.T) {
	s := start(t)
	sled, vmm := uuid.NewString(), uuid.NewString()
	info := sledInfo(1)
	st := vmmState(1, nexussim.VmmStateRunning)
	st.MigrationOut = &nexussim.MigrationRuntimeState{Gen: 1, MigrationID: uuid.NewString(), State: nexussim.MigrationStatePending, TimeUpdated: t0}
	for _, tt := range []struct {
		name, path, body, want string
	}{
		{"sled empty", "/sled-agents/", "", "unable to parse JSON body"},
		{"sled null", "/sled-agents/", "null", "expected an object"},
		{"sled array", "/sled-agents/", "[]", "expected an object"},
		{"sled trailing", "/sled-agents/", mustJSON(t, info) + " x", "invalid character"},
		{"sled missing field", "/sled-agents/", mutated(t, info, func(m map[string]any) { delete(m, "decommissioned") }), "missing field `decommissioned`"},
		{"sled null field", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["generation"] = nil }), "field `generation`"},
		{"sled unknown field", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["rack_id"] = uuid.NewString() }), `unknown field "rack_id"`},
		{"sled bad role", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["role"] = "sidecar" }), "unknown variant `sidecar`"},
		{"sled bad cpu", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["cpu_family"] = "" }), "cpu_family"},
		{"sled ipv4 address", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["sa_address"] = "10.0.0.1:12345" }), "sa_address"},
		{"sled no port", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["sa_address"] = "fd00::1" }), "fd00::1"},
		{"sled named scope", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["sa_address"] = "[fe80::1%eth0]:1" }), "scope id"},
		{"sled port too big", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["repo_depot_port"] = 65536 }), "repo_depot_port"},
		{"sled negative", "/sled-agents/", mutated(t, info, func(m map[string]any) { m["usable_hardware_threads"] = -1 }), "usable_hardware_threads"},
		{"sled generation too big", "/sled-agents/", strings.Replace(mustJSON(t, info), `"generation":1`, `"generation":9223372036854775808`, 1), "generation"},
		{"sled byte count too big", "/sled-agents/", strings.Replace(mustJSON(t, info), `"reservoir_size":549755813888`, `"reservoir_size":18446744073709551615`, 1), "too large for a byte count"},
		{"sled baseboard field", "/sled-agents/", mutated(t, info, func(m map[string]any) { delete(m["baseboard"].(map[string]any), "serial") }), "missing field `serial` in `baseboard`"},
		{"vmm empty object", "/vmms/", "{}", "missing field `vmm_state`"},
		{"vmm nested missing", "/vmms/", `{"vmm_state": {"gen": 1, "state": "running"}}`, "missing field `time_updated` in `vmm_state`"},
		{"vmm bad state", "/vmms/", mutated(t, st, func(m map[string]any) { m["vmm_state"].(map[string]any)["state"] = "paused" }), "unknown variant `paused`"},
		{"vmm bad time", "/vmms/", mutated(t, st, func(m map[string]any) { m["vmm_state"].(map[string]any)["time_updated"] = "yesterday" }), "yesterday"},
		{"vmm unknown field", "/vmms/", mutated(t, st, func(m map[string]any) { m["vmm_state"].(map[string]any)["generation"] = 1 }), `unknown field "generation"`},
		{"vmm migration id", "/vmms/", mutated(t, st, func(m map[string]any) { m["migration_out"].(map[string]any)["migration_id"] = "nope" }), "migration_out.migration_id"},
		{"vmm migration missing", "/vmms/", mutated(t, st, func(m map[string]any) { delete(m["migration_out"].(map[string]any), "gen") }), "missing field `gen` in `migration_out`"},
		{"vmm migration state", "/vmms/", mutated(t, st, func(m map[string]any) { m["migration_out"].(map[string]any)["state"] = "done" }), "unknown variant `done`"},
	} {
		id, method := sled, "POST"
		if tt.path == "/vmms/" {
			id, method = vmm, "PUT"
		}
		a := call(t, s, method, tt.path+id, tt.body)
		if a.Status != 400 {
			t.Errorf("%s: %d %s, want 400", tt.name, a.Status, a.Body)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
		if msg := message(t, a); !strings.Contains(msg, tt.want) {
			t.Errorf("%s: message %q does not say %q", tt.name, msg, tt.want)
		}
	}
	a := simhttptest.Do(t, "POST", s.URL()+"/sled-agents/"+sled, nexussim.APIVersion, "text/plain", mustJSON(t, info))
	if a.Status != 400 || !strings.Contains(a.Body, "content type") {
		t.Errorf("text/plain: %d %s, want 400 naming the content type", a.Status, a.Body)
	}
	if len(s.Sleds()) != 0 || len(s.VMMs()) != 0 {
		t.Errorf("state changed: %v %v", s.Sleds(), s.VMMs())
	}
	// Absent migrations are null, as in upstream's Option fields.
	if a := call(t, s, "PUT", "/vmms/"+vmm, `{"vmm_state": {"gen": 1, "state": "running", "time_updated": "2025-03-01T12:00:00Z"}}`); a.Status != 204 {
		t.Errorf("without migrations: %d %s, want 204", a.Status, a.Body)
	}
}

func TestBadUUIDsAreRefused(t *testing.T) {
	s := start(t)
	for _, tt := range []struct{ method, path, body string }{
		{"GET", "/sled-agents/nope", ""},
		{"POST", "/sled-agents/nope", mustJSON(t, sledInfo(1))},
		{"PUT", "/vmms/nope", mustJSON(t, vmmState(1, nexussim.VmmStateRunning))},
		{"PUT", "/vmms/" + uuid.NewString() + "0", mustJSON(t, vmmState(1, nexussim.VmmStateRunning))},
	} {
		a := call(t, s, tt.method, tt.path, tt.body)
		if a.Status != 400 {
			t.Errorf("%s %s: %d %s, want 400", tt.method, tt.path, a.Status, a.Body)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
		if !strings.Contains(a.Body, "bad parameter in URL path") {
			t.Errorf("%s %s: body %s does not name the path parameter", tt.method, tt.path, a.Body)
		}
	}
}

// The check itself is tested in simhttp: here, that Nexus's version is it.
func TestAPIVersionIsRequired(t *testing.T) {
	s := start(t)
	url := s.URL() + "/sled-agents/" + uuid.NewString()
	for _, tt := range []struct {
		version string
		status  int
		says    string
	}{
		{"", 400, "api-version"},
		{"1.0.1", 400, "1.0.1"},
		{"2.0.0", 400, "2.0.0"},
		{"one", 400, "one"},
		{"1.0.0", 404, "not found"},
	} {
		a := simhttptest.Do(t, "GET", url, tt.version, "", "")
		if a.Status != tt.status || !strings.Contains(a.Body, tt.says) {
			t.Errorf("api-version %q: %d %s, want %d saying %q", tt.version, a.Status, a.Body, tt.status, tt.says)
		}
	}
	a := simhttptest.Do(t, "PUT", s.URL()+"/vmms/"+uuid.NewString(), "", "application/json", mustJSON(t, vmmState(1, nexussim.VmmStateRunning)))
	if a.Status != 400 || len(s.VMMs()) != 0 {
		t.Errorf("PUT without api-version: %d %s, want 400 and nothing kept", a.Status, a.Body)
	}
}

// The other faults are simhttp's, and tested there.
func TestErrorFaultAnswersUpstreamsErrorAndKeepsNothing(t *testing.T) {
	s := start(t)
	if err := s.SetFault(nexussim.FaultError); err != nil {
		t.Fatal(err)
	}
	a := call(t, s, "POST", "/sled-agents/"+uuid.NewString(), mustJSON(t, sledInfo(1)))
	if a.Status != 500 || simhttptest.CheckErrorBody(t, a) != "Internal" {
		t.Errorf("POST under error: %d %s", a.Status, a.Body)
	}
	if len(s.Sleds()) != 0 {
		t.Error("a sled was kept under the error fault")
	}
}

func TestControlEndpoints(t *testing.T) {
	s := start(t)
	sled, vmm := uuid.NewString(), uuid.NewString()
	if a := call(t, s, "POST", "/sled-agents/"+sled, mustJSON(t, sledInfo(1))); a.Status != 204 {
		t.Fatal(a.Status, a.Body)
	}
	for gen := range nexussim.Generation(2) {
		if a := call(t, s, "PUT", "/vmms/"+vmm, mustJSON(t, vmmState(gen+1, nexussim.VmmStateRunning))); a.Status != 204 {
			t.Fatal(a.Status, a.Body)
		}
	}
	for _, tt := range []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/__sim/decommission/" + uuid.NewString(), "", 404},
		{"POST", "/__sim/decommission/nope", "", 400},
		{"POST", "/__sim/decommission/" + sled, "", 204},
		{"POST", "/__sim/vmm-faults", `{"status": 404, "count": 1, "vmm": "` + vmm + `"}`, 204},
		{"POST", "/__sim/vmm-faults", `{"status": 500}`, 400},
		{"POST", "/__sim/vmm-faults", `{"status": 404, "forever": true}`, 400},
		{"PUT", "/__sim/sleds/" + uuid.NewString(), `{}`, 400},
	} {
		a := control(t, s, tt.method, tt.path, tt.body)
		if a.Status != tt.status {
			t.Errorf("%s %s %s: %d %s, want %d", tt.method, tt.path, tt.body, a.Status, a.Body, tt.status)
		}
	}

	a := control(t, s, "GET", "/__sim/state", "")
	var st struct {
		Fault     string                            `json:"fault"`
		Sleds     map[string]nexussim.SledAgentInfo `json:"sleds"`
		VMMs      map[string]nexussim.VMM           `json:"vmms"`
		VMMFaults []nexussim.VMMFault               `json:"vmm_faults"`
		Requests  map[string]int                    `json:"requests"`
	}
	if err := json.Unmarshal([]byte(a.Body), &st); err != nil || a.Status != 200 {
		t.Fatalf("state: %d %s: %v", a.Status, a.Body, err)
	}
	if st.Fault != "none" || !st.Sleds[sled].Decommissioned || len(st.VMMs[vmm].Received) != 2 ||
		st.VMMs[vmm].Latest == nil || st.VMMs[vmm].Latest.VmmState.Gen != 2 || st.VMMs[vmm].Refused == nil ||
		len(st.VMMFaults) != 1 || st.Requests["PUT /vmms/{propolis_id}"] != 2 {
		t.Errorf("state = %s", a.Body)
	}

	// A record as if Nexus held it: the next upsert must be newer.
	held := sledInfo(7)
	other := uuid.NewString()
	if a := control(t, s, "PUT", "/__sim/sleds/"+other, mustJSON(t, held)); a.Status != 204 {
		t.Fatalf("set sled: %d %s", a.Status, a.Body)
	}
	if a := call(t, s, "POST", "/sled-agents/"+other, mustJSON(t, sledInfo(7))); a.Status != 500 {
		t.Errorf("POST gen 7 over a held gen 7: %d", a.Status)
	}

	if a := control(t, s, "DELETE", "/__sim/vmm-faults", ""); a.Status != 204 || len(s.VMMFaults()) != 0 {
		t.Errorf("clearing VMM faults: %d %v", a.Status, s.VMMFaults())
	}
	if a := control(t, s, "POST", "/__sim/restart-empty", ""); a.Status != 204 {
		t.Fatalf("restart-empty: %d %s", a.Status, a.Body)
	}
	a = control(t, s, "GET", "/__sim/state", "")
	if !strings.Contains(a.Body, `"sleds":{}`) || !strings.Contains(a.Body, `"vmms":{}`) || !strings.Contains(a.Body, `"vmm_faults":[]`) {
		t.Errorf("state after restart-empty = %s", a.Body)
	}
}

func TestConcurrentUse(t *testing.T) {
	s := start(t)
	ctx := t.Context()
	// The bodies are made here, as only the test's goroutine may fail it.
	vmmBodies, sledBodies := make([]string, 10), make([]string, 10)
	for i := range vmmBodies {
		gen := nexussim.Generation(i + 1)
		vmmBodies[i] = mustJSON(t, vmmState(gen, nexussim.VmmStateRunning))
		sledBodies[i] = mustJSON(t, sledInfo(gen))
	}
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	for _, id := range ids {
		wg.Go(func() {
			for i := range vmmBodies {
				if err := try(ctx, "PUT", s.URL()+"/vmms/"+id, nexussim.APIVersion, vmmBodies[i], 204); err != nil {
					t.Error(err)
				}
				if err := try(ctx, "POST", s.URL()+"/sled-agents/"+id, nexussim.APIVersion, sledBodies[i], 204); err != nil {
					t.Error(err)
				}
				s.VMMStates(id)
				s.LatestVMM(id)
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			s.VMMs()
			s.Sleds()
			if err := try(ctx, "GET", s.URL()+"/__sim/state", "", "", 200); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	for _, id := range ids {
		if got := len(s.VMMStates(id)); got != 10 {
			t.Errorf("%s: %d states, want 10", id, got)
		}
		if info, _ := s.Sled(id); info.Generation != 10 {
			t.Errorf("%s: generation %d, want 10", id, info.Generation)
		}
	}
}

func TestClosedServerSaysErrClosed(t *testing.T) {
	s := nexussim.New(nexussim.Config{})
	s.Close()
	if err := s.Start("127.0.0.1:0"); !errors.Is(err, nexussim.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := s.SetFault(nexussim.FaultNone); !errors.Is(err, nexussim.ErrClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}
