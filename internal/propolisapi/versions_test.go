package propolisapi_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
)

// nvmeSpec is a spec with an NVMe disk on a file; writeCache is its
// component's has_write_cache member, or "" for none (5.0.0's shape).
func nvmeSpec(writeCache string) string {
	member := ""
	if writeCache != "" {
		member = `,"has_write_cache":` + writeCache
	}
	serial := strings.Repeat("0,", 19) + "0"
	return `{"board":{"chipset":{"type":"i440_fx","value":{"enable_pcie":false}},"cpus":2,"memory_mb":1024},"components":{` +
		`"com1":{"type":"serial_port","component":{"num":"com1"}},` +
		`"disk0":{"type":"nvme_disk","component":{"backend_id":"disk0-backend","pci_path":{"bus":0,"device":16,"function":0},"serial_number":[` + serial + `]` + member + `}},` +
		`"disk0-backend":{"type":"file_storage_backend","component":{"block_size":512,"path":"/data/disk0.raw","readonly":false}}}}`
}

func ensureBody(spec string) string {
	props, _ := json.Marshal(testProps)
	return fmt.Sprintf(`{"properties":%s,"init":{"method":"Spec","value":{"spec":%s}}}`, props, spec)
}

// writeCacheOf is the has_write_cache member of spec's disk0, or "" when
// it has none.
func writeCacheOf(t *testing.T, spec []byte) string {
	t.Helper()
	var doc struct {
		Components map[string]struct {
			Component map[string]json.RawMessage `json:"component"`
		} `json:"components"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		t.Fatalf("spec %s: %v", spec, err)
	}
	return string(doc.Components["disk0"].Component["has_write_cache"])
}

// A 6.0.0 client's NVMe disk carries has_write_cache, which reaches the
// backend and is shown as sent; one without it is refused, as 6.0.0's
// NvmeDisk requires it. The proxy checks every exchange against 6.0.0's
// document.
func TestVersion6NVMeDisk(t *testing.T) {
	e := newEnv(t, 0)
	wantError(t, "an NVMe disk without has_write_cache", e.raw(t, "PUT", "/instance", ensureBody(nvmeSpec("")), invalid),
		400, "-", "unable to parse JSON body: init.value.spec: components.disk0.component: missing field `has_write_cache`")
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Fatalf("the backend was asked: %v", calls)
	}
	if err := e.client.Ensure(t.Context(), testProps, json.RawMessage(nvmeSpec("false"))); err != nil {
		t.Fatal(err)
	}
	_, got, _, _ := e.fake.Instance()
	if !jsonSame(t, got, []byte(nvmeSpec("false"))) {
		t.Errorf("the backend got %s", got)
	}
	full, err := e.client.Spec(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if wc := writeCacheOf(t, full.Spec); wc != "false" {
		t.Errorf("GET /instance/spec: has_write_cache %q, want false: %s", wc, full.Spec)
	}
	e.proxy.WantSeen("PUT /instance 400", "PUT /instance 201", "GET /instance/spec 200")
}

// A 5.0.0 client is served in 5.0.0's shapes: its NVMe disk, which has no
// has_write_cache, has a write cache (the backend gets 6.0.0's shape with
// has_write_cache true), and the spec it is shown has no has_write_cache,
// even for a disk ensured without a write cache by a 6.0.0 client. The
// proxy checks every exchange against 5.0.0's document.
func TestVersion5Client(t *testing.T) {
	v5 := header("api-version", propolisapi.Version5)
	e := newEnvDoc(t, 0, openapitest.Propolis5)
	wantError(t, "a 5.0.0 NVMe disk with has_write_cache", e.raw(t, "PUT", "/instance", ensureBody(nvmeSpec("true")), v5, invalid),
		400, "-", "unknown field `has_write_cache`")
	if a := e.raw(t, "PUT", "/instance", ensureBody(nvmeSpec("")), v5); a.status != 201 {
		t.Fatalf("PUT /instance as 5.0.0: %d %s", a.status, a.body)
	}
	_, got, _, _ := e.fake.Instance()
	if wc := writeCacheOf(t, got); wc != "true" {
		t.Errorf("the backend got has_write_cache %q, want true: %s", wc, got)
	}
	// The same again is the same spec.
	if a := e.raw(t, "PUT", "/instance", ensureBody(nvmeSpec("")), v5); a.status != 201 {
		t.Errorf("PUT /instance again as 5.0.0: %d %s", a.status, a.body)
	}
	for _, path := range []string{"/instance", "/instance/spec", "/instance/migration-status", "/instance/serial/history?from_start=0"} {
		if a := e.raw(t, "GET", path, "", v5); a.status != 200 {
			t.Errorf("GET %s as 5.0.0: %d %s", path, a.status, a.body)
		}
	}
	a := e.raw(t, "GET", "/instance/spec", "", v5)
	var resp struct {
		Spec struct {
			Value json.RawMessage `json:"value"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(a.body, &resp); err != nil {
		t.Fatal(err)
	}
	if !jsonSame(t, resp.Spec.Value, []byte(nvmeSpec(""))) {
		t.Errorf("GET /instance/spec as 5.0.0: %s", resp.Spec.Value)
	}
	e.proxy.WantSeen("PUT /instance 400", "PUT /instance 201", "GET /instance 200", "GET /instance/spec 200",
		"GET /instance/migration-status 200", "GET /instance/serial/history 200")

	// A disk without a write cache, ensured in 6.0.0, shown in 5.0.0.
	e = newEnvDoc(t, 0, openapitest.Propolis5)
	if err := e.fake.Ensure(t.Context(), testProps, json.RawMessage(nvmeSpec("false"))); err != nil {
		t.Fatal(err)
	}
	a = e.raw(t, "GET", "/instance/spec", "", v5)
	if err := json.Unmarshal(a.body, &resp); err != nil {
		t.Fatal(err)
	}
	if a.status != 200 || writeCacheOf(t, resp.Spec.Value) != "" {
		t.Errorf("GET /instance/spec as 5.0.0: %d %s", a.status, a.body)
	}
	e.proxy.WantSeen("GET /instance/spec 200")
}

// Versions from 5.0.0 up to 6.0.0 are served in 5.0.0's shapes, as
// dropshot picks the newest version at or below the one asked for.
func TestVersionBetween(t *testing.T) {
	e := newEnvDoc(t, 0, openapitest.Propolis5)
	if err := e.fake.Ensure(t.Context(), testProps, json.RawMessage(nvmeSpec("true"))); err != nil {
		t.Fatal(err)
	}
	a := e.raw(t, "GET", "/instance/spec", "", header("api-version", "5.9.3"))
	if a.status != 200 || strings.Contains(string(a.body), "has_write_cache") {
		t.Errorf("GET /instance/spec as 5.9.3: %d %s", a.status, a.body)
	}
}

// jsonSame reports whether a and b are the same JSON value, members in
// any order.
func jsonSame(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
