package propolisapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/propolisapi/propolisapitest"
)

// testProps and testSpec are a valid instance, as the document has it.
var testProps = propolisapi.Properties{
	ID:          "5f6b7f1e-8c1a-4a35-9a0e-0f1a2b3c4d5e",
	Name:        "vm0",
	Description: "a test VM",
	Metadata: propolisapi.Metadata{
		ProjectID:    "0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c",
		SiloID:       "6d0a9c1e-8b7a-4c2e-9f3d-1a2b3c4d5e6f",
		SledID:       "9e0a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b",
		SledSerial:   "BRM42220001",
		SledRevision: 6,
		SledModel:    "913-0000019",
	},
}

var testSpec = json.RawMessage(`{"board":{"chipset":{"type":"i440_fx","value":{"enable_pcie":false}},"cpus":2,"memory_mb":1024},"components":{"com1":{"type":"serial_port","component":{"num":"com1"}}}}`)

// env is a server over a fake backend, behind a proxy that checks every
// exchange against upstream's document, and a client of it through the
// proxy.
type env struct {
	fake   *propolisapitest.Backend
	proxy  *openapitest.Proxy
	spec   *openapitest.Spec
	client *propolisapi.Client
	addr   string // the proxy's host:port
	direct string // the server's own URL, for requests that are no operation
	// shutdown ends the server's base context, as its shutdown would.
	shutdown func()
}

func newEnv(t *testing.T, bufferSize int) *env {
	t.Helper()
	return newEnvDoc(t, bufferSize, openapitest.Propolis)
}

// newEnvDoc is newEnv whose proxy checks against the document doc.
func newEnvDoc(t *testing.T, bufferSize int, doc string) *env {
	t.Helper()
	fake := propolisapitest.New(bufferSize)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := httptest.NewUnstartedServer(propolisapi.NewHandler(fake, log))
	ctx, cancel := context.WithCancel(context.Background())
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(cancel) // runs first: long polls and consoles end
	spec := openapitest.Load(t, doc)
	proxy := spec.Proxy(t, srv.URL)
	addr := strings.TrimPrefix(proxy.URL, "http://")
	return &env{fake: fake, proxy: proxy, spec: spec, client: propolisapi.NewClient(addr), addr: addr, direct: srv.URL, shutdown: cancel}
}

func (e *env) ensure(t *testing.T) {
	t.Helper()
	if err := e.client.Ensure(t.Context(), testProps, testSpec); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
}

// answer is an answer to a raw request.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    struct {
		RequestID string  `json:"request_id"`
		ErrorCode *string `json:"error_code"`
		Message   string  `json:"message"`
	}
}

// code is the error code, or "-" when the body has none.
func (a *answer) code() string {
	if a.err.ErrorCode == nil {
		return "-"
	}
	return *a.err.ErrorCode
}

type reqOpt func(*http.Request)

// invalid marks a request the document forbids: only its answer is
// checked.
func invalid(r *http.Request) { r.Header.Set(openapitest.InvalidRequest, "1") }

func header(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

func noVersion(r *http.Request) { r.Header.Del("api-version") }

// raw sends one request through the proxy with the api-version header
// and, for a body, a JSON content type.
func (e *env) raw(t *testing.T, method, path, body string, opts ...reqOpt) *answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.proxy.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("api-version", propolisapi.APIVersion)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	a := &answer{status: resp.StatusCode, header: resp.Header}
	a.body, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(a.body, &a.err); err != nil || a.err.RequestID == "" {
			t.Errorf("%s %s: %d answer is no dropshot error: %s", method, path, resp.StatusCode, a.body)
		}
		if a.err.RequestID != resp.Header.Get("x-request-id") {
			t.Errorf("%s %s: request_id %q, header %q", method, path, a.err.RequestID, resp.Header.Get("x-request-id"))
		}
	}
	return a
}

// wantError fails the test unless a is an error answer with status,
// error code ("-": none) and a message containing msg.
func wantError(t *testing.T, what string, a *answer, status int, code, msg string) {
	t.Helper()
	if a.status != status || a.code() != code || !strings.Contains(a.err.Message, msg) {
		t.Errorf("%s: %d %s %q, want %d %s and a message with %q", what, a.status, a.code(), a.err.Message, status, code, msg)
	}
}

// eventually polls cond until it holds, failing the test after a few
// seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y bytes.Buffer
	if err := json.Compact(&x, a); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Compact(&y, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return x.String() == y.String()
}
