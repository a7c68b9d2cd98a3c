package openapitest_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/openapitest"
)

// The validator is independent of our types: it takes what the upstream
// document says and nothing else. A required member missing, a member of
// the wrong type, a status the operation does not declare and a path that
// is no operation are each caught.
func TestCheckCatchesWhatTheDocumentForbids(t *testing.T) {
	spec := openapitest.Load(t, openapitest.DDM)
	get := httptest.NewRequest(http.MethodGet, "http://[::1]:8000/originated", nil)
	json := http.Header{"Content-Type": {"application/json"}}
	good := openapitest.Exchange{Request: get, Status: 200, Header: json, Body: []byte(`["fd00:1122:3344:101::/64"]`)}
	if err := spec.Check(good); err != nil {
		t.Fatalf("a good answer: %v", err)
	}
	for _, c := range []struct {
		name string
		x    openapitest.Exchange
		want string
	}{
		{"wrong type", openapitest.Exchange{Request: get, Status: 200, Header: json, Body: []byte(`[64]`)}, "answer 200"},
		{"undeclared status", openapitest.Exchange{Request: get, Status: 302, Header: json, Body: nil}, "302"},
		{"no such operation", openapitest.Exchange{Request: httptest.NewRequest(http.MethodGet, "http://[::1]:8000/nope", nil), Status: 200}, "not an operation"},
	} {
		if err := spec.Check(c.x); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check = %v, want an error mentioning %q", c.name, err, c.want)
		}
	}

	// A required member of an error body missing.
	sled := openapitest.Load(t, openapitest.SledAgent)
	zones := httptest.NewRequest(http.MethodGet, "http://[::1]:12345/zones", nil)
	bad := openapitest.Exchange{Request: zones, Status: 500, Header: json, Body: []byte(`{"message":"boom"}`)}
	if err := sled.Check(bad); err == nil || !strings.Contains(err.Error(), "request_id") {
		t.Errorf("an error body without request_id: Check = %v", err)
	}
	bad.Body = []byte(`{"message":"boom","request_id":"r1"}`)
	if err := sled.Check(bad); err != nil {
		t.Errorf("a good error body: %v", err)
	}

	// Formats are checked: a rack id that is no UUID, a revision out of
	// range.
	ids := httptest.NewRequest(http.MethodGet, "http://[::1]:12345/sled-identifiers", nil)
	x := openapitest.Exchange{Request: ids, Status: 200, Header: json,
		Body: []byte(`{"model":"m","rack_id":"0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c","revision":2,"serial":"s","sled_id":"6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f"}`)}
	if err := sled.Check(x); err != nil {
		t.Errorf("good sled identifiers: %v", err)
	}
	x.Body = []byte(`{"model":"m","rack_id":"rack-1","revision":2,"serial":"s","sled_id":"6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f"}`)
	if err := sled.Check(x); err == nil || !strings.Contains(err.Error(), "rack_id") {
		t.Errorf("a rack id that is no UUID: Check = %v", err)
	}
	x.Body = []byte(`{"model":"m","rack_id":"0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c","revision":4294967296,"serial":"s","sled_id":"6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f"}`)
	if err := sled.Check(x); err == nil || !strings.Contains(err.Error(), "revision") {
		t.Errorf("a revision beyond uint32: Check = %v", err)
	}
}

// The real sled config from a rack is a valid request, though its NICs'
// names are checked with a pattern Go's regexp cannot compile as written.
func TestExampleSledConfigIsAValidRequest(t *testing.T) {
	sled := openapitest.Load(t, openapitest.SledAgent)
	doc, err := os.ReadFile(openapitest.UpstreamPath(t, "example-sled-config-v14.json"))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPut, "http://[::1]:12345/omicron-config", nil)
	req.Header.Set("Content-Type", "application/json")
	x := openapitest.Exchange{Request: req, RequestBody: doc, Status: 204}
	if err := sled.Check(x); err != nil {
		t.Fatalf("the example config: %v", err)
	}
	bad := strings.Replace(string(doc), `"name": "nexus-470fbf4d-0178-45ee-a422-136fa5f4a158"`, `"name": "Nexus-"`, 1)
	if bad == string(doc) {
		t.Fatal("the example has no NIC named nexus")
	}
	x.RequestBody = []byte(bad)
	if err := sled.Check(x); err == nil || !strings.Contains(err.Error(), "name") {
		t.Fatalf("a NIC name the pattern forbids: Check = %v", err)
	}
}

// Upstream's patterns with lookaround are checked as they mean: a Name is
// no UUID, a Hostname's labels do not end in '-'.
func TestPatternsWithLookaround(t *testing.T) {
	sled := openapitest.Load(t, openapitest.SledAgent)
	schemas := sled.Doc().Components.Schemas
	for _, c := range []struct {
		schema, value string
		ok            bool
	}{
		{"Name", "nexus-0", true},
		{"Name", "a", true},
		{"Name", "0d6e8a01-57c3-4e3c-8c3b-1b4f6a2a4a2e", false},
		{"Name", "Nexus", false},
		{"Name", "nexus-", false},
		{"Hostname", "vm0", true},
		{"Hostname", "vm-0.example", true},
		{"Hostname", "vm-", false},
		{"Hostname", "vm.ex-", false},
		{"Hostname", "-vm", false},
	} {
		err := sled.ValidateValue(schemas[c.schema].Value, c.value)
		if (err == nil) != c.ok {
			t.Errorf("%s %q: %v, want ok=%v", c.schema, c.value, err, c.ok)
		}
	}
}

// recorder is a testing.TB that keeps what would fail the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// A proxy fails the test on an answer the document forbids, and on a
// request it forbids unless the request is marked invalid.
func TestProxyChecksEveryExchange(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPut {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"message":"bad","request_id":"r1"}`))
			return
		}
		w.Write([]byte(`[64]`))
	}))
	defer target.Close()
	rec := &recorder{TB: t}
	proxy := openapitest.Load(t, openapitest.DDM).Proxy(rec, target.URL)
	send := func(method string, invalid bool) {
		req, _ := http.NewRequest(method, proxy.URL+map[string]string{http.MethodGet: "/originated", http.MethodPut: "/prefix"}[method], strings.NewReader(`{}`))
		if invalid {
			req.Header.Set(openapitest.InvalidRequest, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send(http.MethodGet, false)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "answer 200") {
		t.Fatalf("a bad answer: %q", rec.errs)
	}
	send(http.MethodPut, false)
	if len(rec.errs) != 2 || !strings.Contains(rec.errs[1], "request") {
		t.Fatalf("a bad request: %q", rec.errs)
	}
	send(http.MethodPut, true)
	if len(rec.errs) != 2 {
		t.Fatalf("a bad request marked invalid, with a good answer: %q", rec.errs[2:])
	}
	proxy.WantSeen("GET /originated 200", "PUT /prefix 400")
}

// Dropshot's unit answer, null, is what its "Null" schema means; any
// other value is still refused.
func TestUnitAnswerIsNull(t *testing.T) {
	spec := openapitest.Load(t, openapitest.Propolis)
	nmi := httptest.NewRequest(http.MethodPost, "http://[::1]:12400/instance/nmi", nil)
	json := http.Header{"Content-Type": {"application/json"}}
	if err := spec.Check(openapitest.Exchange{Request: nmi, Status: 200, Header: json, Body: []byte(`null`)}); err != nil {
		t.Errorf("null: %v", err)
	}
	if err := spec.Check(openapitest.Exchange{Request: nmi, Status: 200, Header: json, Body: []byte(`"null"`)}); err == nil {
		t.Error(`"null" passed`)
	}
}

// A websocket upgrade goes through the proxy: its request and its 101
// answer are checked, then the connection's bytes pass both ways. An
// upgrade the document forbids fails the test.
func TestProxyPassesUpgrades(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.Flush()
		line, _ := brw.ReadString('\n')
		conn.Write([]byte("echo " + line))
	}))
	defer target.Close()
	rec := &recorder{TB: t}
	proxy := openapitest.Load(t, openapitest.Propolis).Proxy(rec, target.URL)
	upgrade := func(path string) string {
		conn, err := net.Dial("tcp", strings.TrimPrefix(proxy.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nhello\n", path)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		echo, _ := br.ReadString('\n')
		return echo
	}
	if got := upgrade("/instance/serial?from_start=3"); got != "echo hello\n" {
		t.Errorf("through the upgraded connection: %q", got)
	}
	if len(rec.errs) != 0 {
		t.Fatalf("a good upgrade: %q", rec.errs)
	}
	upgrade("/instance/serial?from_start=-3")
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "from_start") {
		t.Errorf("an upgrade with a bad offset: %q", rec.errs)
	}
	proxy.WantSeen("GET /instance/serial 101")
}
