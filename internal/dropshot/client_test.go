package dropshot_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/dropshot"
)

// hangDeadline only detects hangs; nothing here asserts how fast anything is.
const hangDeadline = 20 * time.Second

var (
	errUnreachable = errors.New("fake unreachable")
	config         = dropshot.Config{Name: "fake", APIVersion: "1.2.3", Unreachable: errUnreachable}
)

// seen is one request a fake server received.
type seen struct {
	Method, URI, APIVersion, Accept, ContentType string
	// IdempotencyKey is whether the header reached the wire at all.
	IdempotencyKey bool
	Body           string
}

// recorder is a fake dropshot server that records requests and answers as
// scripted.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
	// answer writes the answer to a request; nil answers 204.
	answer func(w http.ResponseWriter, r *http.Request)
}

func (f *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	_, idem := r.Header["Idempotency-Key"]
	f.mu.Lock()
	f.reqs = append(f.reqs, seen{r.Method, r.URL.RequestURI(), r.Header.Get("api-version"), r.Header.Get("Accept"), r.Header.Get("Content-Type"), idem, string(body)})
	f.mu.Unlock()
	if f.answer != nil {
		f.answer(w, r)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *recorder) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

// startFake runs a recorder and returns a client of it whose base URL has
// basePath appended.
func startFake(t *testing.T, basePath string, answer func(w http.ResponseWriter, r *http.Request)) (*recorder, *dropshot.Client) {
	t.Helper()
	f := &recorder{answer: answer}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := dropshot.NewClient(srv.URL+basePath, config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return f, c
}

func TestNewClientValidatesURLAndConfig(t *testing.T) {
	for _, u := range []string{"", "[::1]:8000", "ftp://[::1]:8000", "http://", "http://[::1]:8000/?x=1", "http://[::1]:8000/#top",
		"http://u:p@[::1]:8000", "http://[::1"} {
		_, err := dropshot.NewClient(u, config)
		if err == nil || !strings.HasPrefix(err.Error(), "fake URL ") {
			t.Errorf("NewClient(%q) = %v, want an error naming the server", u, err)
		}
	}
	for _, u := range []string{"http://[::1]:8000", "https://ddm.example:8000/", "http://127.0.0.1:8000/base"} {
		if _, err := dropshot.NewClient(u, config); err != nil {
			t.Errorf("NewClient(%q) = %v", u, err)
		}
	}
	for _, cfg := range []dropshot.Config{
		{APIVersion: "1.2.3", Unreachable: errUnreachable},
		{Name: "fake", Unreachable: errUnreachable},
		{Name: "fake", APIVersion: "1.2.3"},
		{Name: "fake", APIVersion: "1.2.3", Unversioned: true, Unreachable: errUnreachable},
	} {
		if _, err := dropshot.NewClient("http://[::1]:8000", cfg); err == nil {
			t.Errorf("NewClient with config %+v succeeded", cfg)
		}
	}
	if _, err := dropshot.NewClient("http://[::1]:8000", dropshot.Config{Name: "fake", Unversioned: true, Unreachable: errUnreachable}); err != nil {
		t.Errorf("NewClient of an unversioned API = %v", err)
	}
}

func TestRequestsCarryVersionQueryAndJSONBody(t *testing.T) {
	f, c := startFake(t, "/base/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"n": 7, "extra": true}`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	ctx := t.Context()
	var got struct{ N int }
	if err := c.Do(ctx, 0, "GET", "/thing", nil, nil, &got); err != nil || got.N != 7 {
		t.Errorf("GET = %+v, %v; want N 7", got, err)
	}
	if err := c.Do(ctx, 0, "GET", "/list", url.Values{"page_token": {"p/2 +="}}, nil, &got); err != nil {
		t.Error(err)
	}
	if err := c.Do(ctx, 0, "PUT", "/thing/1", nil, []string{"fd00::/64"}, nil); err != nil {
		t.Error(err)
	}
	if err := c.Do(ctx, 0, "DELETE", "/thing/1", nil, nil, nil); err != nil {
		t.Error(err)
	}
	if err := c.Do(ctx, 0, "DELETE", "/thing", nil, map[string]int{"a": 1}, nil); err != nil {
		t.Error(err)
	}
	// A 2xx answer is not read as JSON when nothing is to be decoded.
	if err := c.Do(ctx, 0, "POST", "/thing", nil, nil, nil); err != nil {
		t.Error(err)
	}
	// The Idempotency-Key of PUT and DELETE only tells the transport it may
	// retry: it is never sent.
	want := []seen{
		{"GET", "/base/thing", "1.2.3", "application/json", "", false, ""},
		{"GET", "/base/list?page_token=p%2F2+%2B%3D", "1.2.3", "application/json", "", false, ""},
		{"PUT", "/base/thing/1", "1.2.3", "application/json", "application/json", false, `["fd00::/64"]`},
		{"DELETE", "/base/thing/1", "1.2.3", "application/json", "", false, ""},
		{"DELETE", "/base/thing", "1.2.3", "application/json", "application/json", false, `{"a":1}`},
		{"POST", "/base/thing", "1.2.3", "application/json", "", false, ""},
	}
	if diff := cmp.Diff(want, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestUndecodableAnswerIsNeitherAPIErrorNorUnreachable(t *testing.T) {
	_, c := startFake(t, "", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `<html>not json</html>`)
	})
	var out []string
	err := c.Do(t.Context(), 0, "GET", "/thing", nil, nil, &out)
	if err == nil || !strings.HasPrefix(err.Error(), "fake GET /thing: decoding answer: ") {
		t.Errorf("Do = %v, want a decoding error naming the server and request", err)
	}
	if _, ok := errors.AsType[*dropshot.APIError](err); ok || errors.Is(err, errUnreachable) {
		t.Errorf("Do = %v, want neither an APIError nor unreachable", err)
	}
	if err := c.Do(t.Context(), 0, "GET", "/thing", nil, nil, nil); err != nil {
		t.Errorf("Do without out = %v, want the body ignored", err)
	}
}

func TestErrorAnswersAreAPIErrors(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    dropshot.APIError
		wantMsg string
		client  bool
	}{
		{
			name:    "400 upstream body",
			status:  400,
			body:    `{"request_id": "5f2c", "error_code": "InvalidRequest", "message": "unable to parse JSON body"}`,
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 400, RequestID: "5f2c", ErrorCode: "InvalidRequest", Message: "unable to parse JSON body"},
			wantMsg: "PUT /prefix: 400 Bad Request: unable to parse JSON body (error_code InvalidRequest) (request_id 5f2c)",
			client:  true,
		},
		{
			name:    "409 conflicting mapping",
			status:  409,
			body:    `{"request_id":"r1","error_code":"conflicting mapping","message":"conflicting mapping: 192.0.2.10 ports 0-65535"}`,
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 409, RequestID: "r1", ErrorCode: "conflicting mapping", Message: "conflicting mapping: 192.0.2.10 ports 0-65535"},
			wantMsg: "PUT /prefix: 409 Conflict: conflicting mapping: 192.0.2.10 ports 0-65535 (error_code conflicting mapping) (request_id r1)",
			client:  true,
		},
		{
			name:    "500 upstream body without code",
			status:  500,
			body:    `{"request_id": "77", "message": "admin event send: disconnected"}`,
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 500, RequestID: "77", Message: "admin event send: disconnected"},
			wantMsg: "PUT /prefix: 500 Internal Server Error: admin event send: disconnected (request_id 77)",
		},
		{
			name:    "502 from something else",
			status:  502,
			body:    "<html>\n  bad gateway\n</html>",
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 502, Message: "<html> bad gateway </html>"},
			wantMsg: "PUT /prefix: 502 Bad Gateway: <html> bad gateway </html>",
		},
		{
			name:    "long body is cut",
			status:  500,
			body:    strings.Repeat("x", 5000),
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 500, Message: strings.Repeat("x", 256) + "…"},
			wantMsg: "PUT /prefix: 500 Internal Server Error: " + strings.Repeat("x", 256) + "…",
		},
		{
			name:    "error code alone is not an upstream body",
			status:  503,
			body:    `{"error_code":"x"}`,
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 503, Message: `{"error_code":"x"}`},
			wantMsg: `PUT /prefix: 503 Service Unavailable: {"error_code":"x"}`,
		},
		{
			name:    "empty body",
			status:  404,
			want:    dropshot.APIError{Method: "PUT", Path: "/prefix", StatusCode: 404},
			wantMsg: "PUT /prefix: 404 Not Found",
			client:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := startFake(t, "", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			err := c.Do(t.Context(), 0, "PUT", "/prefix", nil, []string{"fd00::/64"}, nil)
			got, ok := err.(*dropshot.APIError) // not wrapped, for the caller to convert
			if !ok {
				t.Fatalf("Do = %v, want a *APIError", err)
			}
			if diff := cmp.Diff(tt.want, *got); diff != "" {
				t.Errorf("APIError (-want +got):\n%s", diff)
			}
			if got.ClientError() != tt.client || got.ServerError() == tt.client {
				t.Errorf("ClientError = %v, ServerError = %v for %d", got.ClientError(), got.ServerError(), got.StatusCode)
			}
			if errors.Is(err, errUnreachable) {
				t.Errorf("an answer was reported unreachable: %v", err)
			}
			if msg := err.Error(); msg != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", msg, tt.wantMsg)
			}
		})
	}
}

func TestAPIErrorPathHasNoQuery(t *testing.T) {
	_, c := startFake(t, "", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"request_id":"1","message":"bad page token"}`)
	})
	err := c.Do(t.Context(), 0, "GET", "/nat/ipv4", url.Values{"page_token": {"x"}}, nil, new(any))
	if e, ok := errors.AsType[*dropshot.APIError](err); !ok || e.Path != "/nat/ipv4" {
		t.Errorf("Do = %v, want an APIError with Path /nat/ipv4", err)
	}
}

func TestRefusedConnectionIsUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := dropshot.NewClient("http://"+addr, config)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Do(t.Context(), 0, "GET", "/thing", nil, nil, nil)
	if !errors.Is(err, errUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Do = %v, want the Unreachable error wrapping ECONNREFUSED", err)
	}
	if !strings.HasPrefix(err.Error(), "fake unreachable: Get ") {
		t.Errorf("Error() = %q, want it to name the server and the method", err)
	}
	if _, ok := errors.AsType[*dropshot.APIError](err); ok {
		t.Errorf("refused connection gave an APIError: %v", err)
	}
}

func TestAnswerCutShortIsUnreachable(t *testing.T) {
	_, c := startFake(t, "", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"n":`)
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	err := c.Do(t.Context(), 0, "GET", "/thing", nil, nil, new(any))
	if !errors.Is(err, errUnreachable) || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "GET /thing: reading answer") {
		t.Errorf("Do = %v, want the Unreachable error wrapping io.ErrUnexpectedEOF while reading the answer", err)
	}
}

// startHanging runs a server that never answers until the test ends.
func startHanging(t *testing.T) *dropshot.Client {
	t.Helper()
	release := make(chan struct{})
	_, c := startFake(t, "", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the server closes
	return c
}

// callWithin runs call, failing the test if it does not return in
// hangDeadline.
func callWithin(t *testing.T, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangDeadline):
		t.Fatal("call did not give up on a server that never answers")
		return nil
	}
}

func TestHangEndsAtTimeout(t *testing.T) {
	c := startHanging(t)
	// No deadline on the context: the timeout still applies.
	err := callWithin(t, func() error {
		return c.Do(context.Background(), 100*time.Millisecond, "PUT", "/thing", nil, []string{"x"}, nil)
	})
	if !errors.Is(err, errUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, want the Unreachable error wrapping context.DeadlineExceeded", err)
	}
}

func TestHangEndsAtContextDeadline(t *testing.T) {
	c := startHanging(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := callWithin(t, func() error { return c.Do(ctx, time.Hour, "GET", "/thing", nil, nil, new(any)) })
	if !errors.Is(err, errUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, want the Unreachable error wrapping context.DeadlineExceeded", err)
	}
}

func TestCallerCancellationIsNotUnreachable(t *testing.T) {
	c := startHanging(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := callWithin(t, func() error { return c.Do(ctx, time.Hour, "DELETE", "/thing", nil, nil, nil) })
	if !errors.Is(err, context.Canceled) || errors.Is(err, errUnreachable) {
		t.Errorf("Do = %v, want context.Canceled and not the Unreachable error", err)
	}
	if !strings.HasPrefix(err.Error(), "fake: ") {
		t.Errorf("Error() = %q, want it to name the server", err)
	}
}

// startDropper runs a server that answers 204 to the first request on each
// connection and drops the connection, unanswered, when a second request
// comes on it: what a restarted server does to a kept-alive connection. It
// returns the server's URL and a count of the requests it read.
func startDropper(t *testing.T) (string, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		n     int
		conns []net.Conn
		wg    sync.WaitGroup
	)
	serve := func(conn net.Conn) {
		defer wg.Done()
		defer conn.Close()
		br := bufio.NewReader(conn)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			mu.Lock()
			n++
			mu.Unlock()
			if i > 0 {
				return
			}
			if _, err := io.WriteString(conn, "HTTP/1.1 204 No Content\r\n\r\n"); err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go serve(conn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestIdempotentCallsSurviveADroppedKeptAliveConnection(t *testing.T) {
	for _, tt := range []struct {
		method  string
		retried bool
	}{
		{"PUT", true},
		{"DELETE", true},
		// POST is not marked idempotent: the transport does not retry it,
		// which shows that the mark is what lets PUT and DELETE through.
		{"POST", false},
	} {
		t.Run(tt.method, func(t *testing.T) {
			u, requests := startDropper(t)
			c, err := dropshot.NewClient(u, config)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.CloseIdleConnections) // runs before the server closes
			ctx := t.Context()
			if err := c.Do(ctx, 0, tt.method, "/thing", nil, []string{"a"}, nil); err != nil {
				t.Fatalf("first call: %v", err)
			}
			err = c.Do(ctx, 0, tt.method, "/thing", nil, []string{"b"}, nil)
			switch {
			case tt.retried && (err != nil || requests() != 3):
				t.Errorf("call on the dropped connection = %v after %d requests, want success after a retry (3 requests)", err, requests())
			case !tt.retried && !errors.Is(err, errUnreachable):
				t.Errorf("call on the dropped connection = %v, want the Unreachable error", err)
			}
		})
	}
}

// TestReplaceableServerOptions checks the options for a server that may be
// replaced at its address at any moment (a VMM's zone): no api-version
// header, a new connection per call, a redirect answered, not followed.
func TestReplaceableServerOptions(t *testing.T) {
	var (
		mu       sync.Mutex
		conns    int
		versions []bool // whether each request had an api-version header
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		_, v := r.Header["Api-Version"]
		versions = append(versions, v)
		mu.Unlock()
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	counts := func() (int, []bool) {
		mu.Lock()
		defer mu.Unlock()
		c, v := conns, versions
		conns, versions = 0, nil
		return c, v
	}
	ctx := t.Context()

	for _, tt := range []struct {
		name      string
		cfg       dropshot.Config
		wantConns int
		wantVer   bool
	}{
		// The default, for comparison: one kept-alive connection.
		{"default", config, 1, true},
		{"replaceable", dropshot.Config{Name: "fake", Unversioned: true, Unreachable: errUnreachable, NoKeepAlive: true, NoRedirects: true}, 3, false},
	} {
		c, err := dropshot.NewClient(srv.URL, tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := c.Do(ctx, 0, http.MethodGet, "/thing", nil, nil, nil); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
		}
		c.CloseIdleConnections()
		n, vers := counts()
		if n != tt.wantConns {
			t.Errorf("%s: 3 calls used %d connections, want %d", tt.name, n, tt.wantConns)
		}
		for _, v := range vers {
			if v != tt.wantVer {
				t.Errorf("%s: api-version header sent = %v, want %v", tt.name, v, tt.wantVer)
			}
		}
	}

	c, err := dropshot.NewClient(srv.URL, dropshot.Config{Name: "fake", Unversioned: true, Unreachable: errUnreachable, NoRedirects: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	err = c.Do(ctx, 0, http.MethodGet, "/moved", nil, nil, nil)
	if e, ok := errors.AsType[*dropshot.APIError](err); !ok || e.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("redirect = %v, want a 307 *APIError", err)
	}
	if _, vers := counts(); len(vers) != 1 {
		t.Errorf("the redirect made %d requests, want 1: it was followed", len(vers))
	}
}
