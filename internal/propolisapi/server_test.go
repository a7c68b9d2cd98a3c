package propolisapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/propolisapi/propolisapitest"
)

// Before PUT /instance, every operation on the instance answers 424
// NoInstance, as upstream's does, and the client's errors say so.
func TestNoInstanceBeforeEnsure(t *testing.T) {
	e := newEnv(t, 0)
	ctx := t.Context()
	_, err := e.client.Get(ctx)
	checks := map[string]error{"Get": err}
	_, err = e.client.Spec(ctx)
	checks["Spec"] = err
	_, err = e.client.StateMonitor(ctx, 1)
	checks["StateMonitor"] = err
	checks["PutState"] = e.client.PutState(ctx, propolisapi.RequestRun)
	checks["NMI"] = e.client.NMI(ctx)
	_, _, err = e.client.SerialHistory(ctx, propolisapi.SerialFromStart(0), 0)
	checks["SerialHistory"] = err
	_, err = e.client.SerialConnect(ctx, propolisapi.SerialMostRecent(10))
	checks["SerialConnect"] = err
	for call, err := range checks {
		var ae *propolisapi.APIError
		if !errors.Is(err, propolisapi.ErrNoInstance) || !errors.As(err, &ae) || ae.ErrorCode != "NoInstance" ||
			ae.Message != "Server not initialized (no instance)" {
			t.Errorf("%s before Ensure: %v", call, err)
		}
	}
	for _, op := range []struct{ method, path, body string }{
		{"GET", "/instance/migration-status", ""},
		{"POST", "/instance/disk/disk0/snapshot/1d3c5a7e-2b4f-4d6a-8c0e-9f1a2b3c4d5e", ""},
		{"GET", "/instance/disk/disk0/status", ""},
		{"PUT", "/instance/disk/disk0/vcr", `{"vcr_json":"{}"}`},
		{"GET", "/instance/migrate/1d3c5a7e-2b4f-4d6a-8c0e-9f1a2b3c4d5e/start", ""},
	} {
		a := e.raw(t, op.method, op.path, op.body)
		wantError(t, op.method+" "+op.path, a, http.StatusFailedDependency, "NoInstance", "Server not initialized (no instance)")
	}
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Errorf("the backend was asked %q", calls)
	}
	e.proxy.WantSeen("GET /instance 424", "GET /instance/spec 424", "GET /instance/state-monitor 424",
		"PUT /instance/state 424", "POST /instance/nmi 424", "GET /instance/serial/history 424", "GET /instance/serial 424")
}

// Ensure creates the instance; the same again succeeds and changes
// nothing; other properties or another spec are 409 AlreadyInitialized.
// GET /instance and /instance/spec answer what was ensured.
func TestEnsure(t *testing.T) {
	e := newEnv(t, 0)
	ctx := t.Context()
	e.ensure(t)
	e.ensure(t)
	got, err := e.client.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(propolisapi.Instance{Properties: testProps, State: propolisapi.StateCreating}, got); diff != "" {
		t.Errorf("Get (-want +got):\n%s", diff)
	}
	full, err := e.client.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if full.Properties != testProps || full.State != propolisapi.StateCreating || !jsonEqual(t, full.Spec, testSpec) {
		t.Errorf("Spec = %+v %s", full, full.Spec)
	}

	other := testProps
	other.Name = "vm1"
	err = e.client.Ensure(ctx, other, testSpec)
	var ae *propolisapi.APIError
	if !errors.Is(err, propolisapi.ErrConflict) || !errors.As(err, &ae) || ae.ErrorCode != "AlreadyInitialized" {
		t.Errorf("Ensure with other properties: %v", err)
	}
	otherSpec := []byte(strings.Replace(string(testSpec), `"cpus":2`, `"cpus":4`, 1))
	if err := e.client.Ensure(ctx, testProps, otherSpec); !errors.Is(err, propolisapi.ErrConflict) {
		t.Errorf("Ensure with another spec: %v", err)
	}
	if got, _ := e.client.Get(ctx); got.Properties != testProps {
		t.Errorf("after refusals: %+v", got)
	}
	want := slices.Repeat([]string{"Ensure " + testProps.ID}, 4)
	if diff := cmp.Diff(want, e.fake.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	e.proxy.WantSeen("PUT /instance 201", "PUT /instance 409", "GET /instance 200", "GET /instance/spec 200")
}

// The spec is passed on as sent, compacted; UUIDs in the properties are
// kept in their canonical form.
func TestEnsureCanonicalForms(t *testing.T) {
	e := newEnv(t, 0)
	props := testProps
	props.ID = strings.ToUpper(props.ID)
	spaced := []byte(strings.ReplaceAll(string(testSpec), ",", " ,\n "))
	if err := e.client.Ensure(t.Context(), props, spaced); err != nil {
		t.Fatal(err)
	}
	gotProps, gotSpec, _, _ := e.fake.Instance()
	if gotProps != testProps || string(gotSpec) != string(testSpec) {
		t.Errorf("the backend got %+v %s", gotProps, gotSpec)
	}
}

// Bad input is a 400 naming the problem, and the backend is not asked;
// a spec the backend refuses is a 400 with its message, as upstream words
// it; a backend's failure is dropshot's 500.
func TestEnsureRefusals(t *testing.T) {
	e := newEnv(t, 0)
	const props = `{"id":"5f6b7f1e-8c1a-4a35-9a0e-0f1a2b3c4d5e","name":"vm0","description":"d","metadata":{"project_id":"0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c","silo_id":"6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f","sled_id":"9e0a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b","sled_serial":"s","sled_revision":1,"sled_model":"m"}}`
	spec := string(testSpec)
	for _, c := range []struct {
		name, body string
		docOK      bool // the document allows the request
		msg        string
	}{
		{"not JSON", `{"properties":`, false, "unable to parse JSON body"},
		{"trailing data", `{"properties":` + props + `,"init":{"method":"Spec","value":{"spec":` + spec + `}}} {}`, false, "trailing"},
		{"no properties", `{"init":{"method":"Spec","value":{"spec":` + spec + `}}}`, false, "missing field `properties`"},
		{"no init", `{"properties":` + props + `}`, false, "missing field `init`"},
		{"no sled_id", `{"properties":` + strings.Replace(props, `"sled_id"`, `"sled"`, 1) + `,"init":{"method":"Spec","value":{"spec":` + spec + `}}}`, false, "metadata.sled_id"},
		{"id no UUID", `{"properties":` + strings.Replace(props, `"5f6b7f1e-8c1a-4a35-9a0e-0f1a2b3c4d5e"`, `"vm0"`, 1) + `,"init":{"method":"Spec","value":{"spec":` + spec + `}}}`, false, `properties.id: "vm0" is not a UUID`},
		{"revision no number", `{"properties":` + strings.Replace(props, `"sled_revision":1`, `"sled_revision":"1"`, 1) + `,"init":{"method":"Spec","value":{"spec":` + spec + `}}}`, false, "sled_revision"},
		{"unknown method", `{"properties":` + props + `,"init":{"method":"Clone","value":{}}}`, false, "unknown variant `Clone`"},
		{"spec no object", `{"properties":` + props + `,"init":{"method":"Spec","value":{"spec":[]}}}`, false, "init.value.spec"},
		{"migration target", `{"properties":` + props + `,"init":{"method":"MigrationTarget","value":{"migration_id":"1d3c5a7e-2b4f-4d6a-8c0e-9f1a2b3c4d5e","src_addr":"[fd00::1]:12400","replace_components":{}}}}`, true, `"MigrationTarget" is not supported`},
	} {
		opts := []reqOpt{}
		if !c.docOK {
			opts = append(opts, invalid)
		}
		wantError(t, c.name, e.raw(t, "PUT", "/instance", c.body, opts...), http.StatusBadRequest, "-", c.msg)
	}
	wantError(t, "a text body", e.raw(t, "PUT", "/instance", "x", invalid, header("Content-Type", "text/plain")),
		http.StatusBadRequest, "-", `expected content type "application/json"`)
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Errorf("the backend was asked %q", calls)
	}

	e.fake.FailEnsure(&propolisapi.SpecError{Msg: "no such chipset"})
	err := e.client.Ensure(t.Context(), testProps, testSpec)
	var ae *propolisapi.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Message != "failed to generate internal instance spec: no such chipset" {
		t.Errorf("a refused spec: %v", err)
	}
	e.fake.FailEnsure(errors.New("qemu exploded"))
	err = e.client.Ensure(t.Context(), testProps, testSpec)
	if !errors.As(err, &ae) || ae.StatusCode != 500 || ae.ErrorCode != "Internal" || ae.Message != "Internal Server Error" {
		t.Errorf("a failed backend: %v", err)
	}
	if _, err := e.client.Get(t.Context()); !errors.Is(err, propolisapi.ErrNoInstance) {
		t.Errorf("after failed ensures: %v", err)
	}
	e.proxy.WantSeen("PUT /instance 400", "PUT /instance 500")
}

// PUT /instance/state asks the backend; a change its state does not allow
// is upstream's 403, with the reason in the error code.
func TestPutState(t *testing.T) {
	e := newEnv(t, 0)
	ctx := t.Context()
	e.ensure(t)
	for _, r := range []propolisapi.StateRequest{propolisapi.RequestRun, propolisapi.RequestReboot, propolisapi.RequestStop, propolisapi.RequestStop} {
		if err := e.client.PutState(ctx, r); err != nil {
			t.Fatalf("PutState %s: %v", r, err)
		}
	}
	if got, _ := e.client.Get(ctx); got.State != propolisapi.StateStopped {
		t.Errorf("after a stop: %s", got.State)
	}
	err := e.client.PutState(ctx, propolisapi.RequestRun)
	var ae *propolisapi.APIError
	if !errors.Is(err, propolisapi.ErrInvalidTransition) || !errors.As(err, &ae) ||
		ae.ErrorCode != "instance state change not allowed: Instance has already halted" || ae.Message != "Forbidden" {
		t.Errorf("Run after Stop: %v", err)
	}
	wantError(t, "an unknown request", e.raw(t, "PUT", "/instance/state", `"Start"`, invalid), http.StatusBadRequest, "-", "unknown variant `Start`")
	wantError(t, "an object", e.raw(t, "PUT", "/instance/state", `{"state":"Run"}`, invalid), http.StatusBadRequest, "-", "unable to parse JSON body")
	want := []string{"Ensure " + testProps.ID, "Request Run", "Request Reboot", "Request Stop", "Request Stop", "Request Run"}
	if diff := cmp.Diff(want, e.fake.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	e.proxy.WantSeen("PUT /instance/state 204", "PUT /instance/state 403", "PUT /instance/state 400")
}

// The state monitor answers at once when the generation asked for is
// reached (at least it, as upstream), waits for it otherwise, and its
// client gives up with its context.
func TestStateMonitor(t *testing.T) {
	e := newEnv(t, 0)
	ctx := t.Context()
	e.ensure(t)
	for _, gen := range []uint64{0, 1} {
		st, err := e.client.StateMonitor(ctx, gen)
		if err != nil || st != (propolisapi.Status{Gen: 1, State: propolisapi.StateCreating}) {
			t.Errorf("StateMonitor(%d) = %+v, %v", gen, st, err)
		}
	}
	got := make(chan propolisapi.Status, 1)
	go func() {
		st, err := e.client.StateMonitor(ctx, 2)
		if err != nil {
			t.Errorf("StateMonitor(2): %v", err)
		}
		got <- st
	}()
	select {
	case st := <-got:
		t.Fatalf("StateMonitor(2) answered before a change: %+v", st)
	case <-time.After(100 * time.Millisecond):
	}
	e.fake.SetState(propolisapi.StateStarting)
	if st := <-got; st != (propolisapi.Status{Gen: 2, State: propolisapi.StateStarting}) {
		t.Errorf("StateMonitor(2) = %+v", st)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := e.client.StateMonitor(short, 3); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, propolisapi.ErrUnreachable) {
		t.Errorf("StateMonitor past its deadline: %v", err)
	}
	wantError(t, "no body", e.raw(t, "GET", "/instance/state-monitor", "", invalid), http.StatusBadRequest, "-", "unable to parse JSON body")
	wantError(t, "no gen", e.raw(t, "GET", "/instance/state-monitor", `{}`, invalid), http.StatusBadRequest, "-", "missing field `gen`")
	wantError(t, "a negative gen", e.raw(t, "GET", "/instance/state-monitor", `{"gen":-1}`, invalid), http.StatusBadRequest, "-", "unable to parse JSON body")
}

// NMI goes to the backend; one it cannot inject is a 501, a failure a 500.
func TestNMI(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	if err := e.client.NMI(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.fake.FailNMI(fmt.Errorf("no NMI here: %w", propolisapi.ErrUnsupported))
	if err := e.client.NMI(t.Context()); !errors.Is(err, propolisapi.ErrUnsupported) {
		t.Errorf("an NMI the backend cannot inject: %v", err)
	}
	e.fake.FailNMI(errors.New("monitor gone"))
	var ae *propolisapi.APIError
	if err := e.client.NMI(t.Context()); !errors.As(err, &ae) || ae.StatusCode != 500 || ae.ErrorCode != "Internal" {
		t.Errorf("a failed NMI: %v", err)
	}
	e.proxy.WantSeen("POST /instance/nmi 200", "POST /instance/nmi 501", "POST /instance/nmi 500")
}

// The operations this server cannot do answer as upstream's does when it
// has no such thing; routing and versions are answered as dropshot does.
func TestOtherOperations(t *testing.T) {
	e := newEnv(t, 0)
	e.ensure(t)
	a := e.raw(t, "GET", "/instance/migration-status", "")
	if a.status != 200 || !jsonEqual(t, a.body, []byte(`{"migration_in":null,"migration_out":null}`)) {
		t.Errorf("migration status: %d %s", a.status, a.body)
	}
	const snap = "1d3c5a7e-2b4f-4d6a-8c0e-9f1a2b3c4d5e"
	wantError(t, "snapshot", e.raw(t, "POST", "/instance/disk/disk0/snapshot/"+snap, ""), 404, "no disk with id disk0!", "Not Found")
	wantError(t, "snapshot id no UUID", e.raw(t, "POST", "/instance/disk/disk0/snapshot/snap", "", invalid), 400, "-", "snapshot_id")
	wantError(t, "disk status", e.raw(t, "GET", "/instance/disk/disk0/status", ""), 404, "No crucible backend for id disk0", "Not Found")
	wantError(t, "vcr", e.raw(t, "PUT", "/instance/disk/disk0/vcr", `{"vcr_json":"{}"}`), 404, "No crucible backend for id disk0", "Not Found")
	wantError(t, "vcr without a body", e.raw(t, "PUT", "/instance/disk/disk0/vcr", `{}`, invalid), 400, "-", "missing field `vcr_json`")
	wantError(t, "migrate start", e.raw(t, "GET", "/instance/migrate/"+snap+"/start", ""), 501, "-", "live migration is not supported")
	wantError(t, "migrate start, bad id", e.raw(t, "GET", "/instance/migrate/m/start", "", invalid), 400, "-", "migration_id")

	// Not operations of the document: sent to the server directly.
	for _, c := range []struct {
		method, path string
		status       int
		msg, allow   string
	}{
		{"GET", "/nope", 404, "Not Found", ""},
		{"DELETE", "/instance", 405, "Method Not Allowed", "GET, PUT"},
		{"POST", "/instance/disk/d/status", 405, "Method Not Allowed", "GET"},
		{"GET", "/instance/state", 405, "Method Not Allowed", "PUT"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, e.direct+c.path, nil)
		req.Header.Set("api-version", propolisapi.APIVersion)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || !strings.Contains(string(body), `"message":"`+c.msg+`"`) {
			t.Errorf("%s %s: %d, Allow %q, %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), body)
		}
	}

	wantError(t, "no api-version", e.raw(t, "GET", "/instance", "", noVersion), 400, "-", `missing expected header "api-version"`)
	wantError(t, "a newer version", e.raw(t, "GET", "/instance", "", header("api-version", "6.0.1")), 400, "-", "server does not support this API version: 6.0.1")
	wantError(t, "an older version", e.raw(t, "GET", "/instance", "", header("api-version", "4.0.0")), 400, "-", "5.0.0 to 6.0.0 only")
	wantError(t, "no version", e.raw(t, "GET", "/instance", "", header("api-version", "five")), 400, "-", "bad value for header")
}

// monitor sends GET /instance/state-monitor to h directly and returns the
// answer, checked against the document.
func monitor(t *testing.T, ctx context.Context, h http.Handler, gen uint64) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"gen":%d}`, gen)
	req := httptest.NewRequestWithContext(ctx, "GET", "http://[::1]:12400/instance/state-monitor", strings.NewReader(body))
	req.Header.Set("api-version", propolisapi.APIVersion)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	spec := openapitest.Load(t, openapitest.Propolis)
	x := openapitest.Exchange{Request: req, RequestBody: []byte(body), Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	if err := spec.Check(x); err != nil {
		t.Error(err)
	}
	return rec.Code, rec.Body.String()
}

// A monitor whose generation does not come answers with the current
// status after MonitorWait, one whose generation comes answers then, and
// one whose request ends answers at once (in a virtual clock).
func TestStateMonitorBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := propolisapitest.New(0)
		h := propolisapi.NewHandler(fake, slog.New(slog.DiscardHandler))
		if err := fake.Ensure(t.Context(), testProps, testSpec); err != nil {
			t.Fatal(err)
		}
		const creating = `{"gen":1,"state":"Creating","migration":{"migration_in":null,"migration_out":null}}`
		start := time.Now()
		if code, body := monitor(t, t.Context(), h, 2); code != 200 || body != creating {
			t.Errorf("an unchanged status: %d %s", code, body)
		}
		if waited := time.Since(start); waited != propolisapi.MonitorWait {
			t.Errorf("the monitor answered after %s, want %s", waited, propolisapi.MonitorWait)
		}

		start = time.Now()
		go func() {
			time.Sleep(10 * time.Second)
			fake.SetState(propolisapi.StateStarting)
		}()
		if code, body := monitor(t, t.Context(), h, 2); code != 200 || !strings.HasPrefix(body, `{"gen":2,"state":"Starting"`) {
			t.Errorf("a change: %d %s", code, body)
		}
		if waited := time.Since(start); waited != 10*time.Second {
			t.Errorf("the monitor answered %s after the change's 10s", waited)
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if code, _ := monitor(t, ctx, h, 5); code != 200 {
			t.Errorf("a monitor whose request ended: %d", code)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("the monitor answered %s after its request's end at 1s", waited)
		}
	})
}
