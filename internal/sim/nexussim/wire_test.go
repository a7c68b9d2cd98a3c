package nexussim_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/sim/nexussim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// Every answer of the three operations, success and error, goes through a
// proxy that validates it against nexus-internal 1.0.0, as it does the
// requests sent, but for those marked deliberately wrong.
func TestWireIsUpstreams(t *testing.T) {
	s := start(t)
	spec := openapitest.Load(t, openapitest.Nexus)
	proxy := spec.Proxy(t, s.URL())
	client := &http.Client{Timeout: simhttptest.Deadline}
	t.Cleanup(client.CloseIdleConnections)
	send := func(method, path, version, body string, invalid bool) int {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, proxy.URL+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		if version != "" {
			req.Header.Set("api-version", version)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if invalid {
			req.Header.Set(openapitest.InvalidRequest, "yes")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	v := nexussim.APIVersion
	sled, vmm := "/sled-agents/"+uuid.NewString(), "/vmms/"+uuid.NewString()
	expect := func(got, want int, what string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %d, want %d", what, got, want)
		}
	}

	expect(send("GET", sled, v, "", false), 404, "GET of an unknown sled")
	expect(send("POST", sled, v, mustJSON(t, sledInfo(2)), false), 204, "POST")
	expect(send("GET", sled, v, "", false), 200, "GET")
	expect(send("POST", sled, v, mustJSON(t, sledInfo(1)), false), 500, "POST of an older generation")
	if err := s.Decommission(strings.TrimPrefix(sled, "/sled-agents/")); err != nil {
		t.Fatal(err)
	}
	expect(send("GET", sled, v, "", false), 200, "GET of a decommissioned sled")

	withMigration := vmmState(2, nexussim.VmmStateMigrating)
	withMigration.MigrationOut = &nexussim.MigrationRuntimeState{
		Gen: 3, MigrationID: uuid.NewString(), State: nexussim.MigrationStateInProgress, TimeUpdated: t0,
	}
	expect(send("PUT", vmm, v, mustJSON(t, vmmState(1, nexussim.VmmStateStarting)), false), 204, "PUT")
	expect(send("PUT", vmm, v, mustJSON(t, withMigration), false), 204, "PUT with a migration")
	toItself := withMigration
	toItself.MigrationIn = toItself.MigrationOut
	expect(send("PUT", vmm, v, mustJSON(t, toItself), false), 409, "PUT migrating to itself")
	if err := s.AddVMMFault(nexussim.VMMFault{Status: 404, Count: 1}); err != nil {
		t.Fatal(err)
	}
	expect(send("PUT", vmm, v, mustJSON(t, vmmState(3, nexussim.VmmStateRunning)), false), 404, "PUT under a VMM fault")

	if err := s.SetFault(nexussim.FaultError); err != nil {
		t.Fatal(err)
	}
	expect(send("GET", sled, v, "", false), 500, "GET under an error fault")
	expect(send("POST", sled, v, mustJSON(t, sledInfo(3)), false), 500, "POST under an error fault")
	expect(send("PUT", vmm, v, mustJSON(t, vmmState(3, nexussim.VmmStateRunning)), false), 500, "PUT under an error fault")
	if err := s.SetFault(nexussim.FaultNone); err != nil {
		t.Fatal(err)
	}

	// Requests the agent never sends: only the answers are checked.
	for _, r := range []struct{ method, path, version, body string }{
		{"GET", sled, "", ""},
		{"GET", sled, "2.0.0", ""},
		{"GET", "/sled-agents/nope", v, ""},
		{"POST", sled, "", mustJSON(t, sledInfo(4))},
		{"POST", "/sled-agents/nope", v, mustJSON(t, sledInfo(4))},
		{"POST", sled, v, `{"generation": 4}`},
		{"PUT", vmm, "9.0.0", mustJSON(t, vmmState(4, nexussim.VmmStateRunning))},
		{"PUT", "/vmms/nope", v, mustJSON(t, vmmState(4, nexussim.VmmStateRunning))},
		{"PUT", vmm, v, `{"vmm_state": null}`},
	} {
		expect(send(r.method, r.path, r.version, r.body, true), 400, r.method+" "+r.path+" "+r.version+" "+r.body)
	}

	proxy.WantSeen(
		"GET /sled-agents/{sled_id} 200", "GET /sled-agents/{sled_id} 400", "GET /sled-agents/{sled_id} 404", "GET /sled-agents/{sled_id} 500",
		"POST /sled-agents/{sled_id} 204", "POST /sled-agents/{sled_id} 400", "POST /sled-agents/{sled_id} 500",
		"PUT /vmms/{propolis_id} 204", "PUT /vmms/{propolis_id} 400", "PUT /vmms/{propolis_id} 404",
		"PUT /vmms/{propolis_id} 409", "PUT /vmms/{propolis_id} 500",
	)
}
