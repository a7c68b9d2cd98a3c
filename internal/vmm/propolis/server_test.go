package propolis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/zoneservice"
)

// The HTTP layer runs on real loopback sockets. Deadlines here only detect
// hangs; nothing asserts how fast anything is.
const hangDeadline = 10 * time.Second

const testID = "5e9c1a2b-8f3d-4b6e-a7c1-0d2e4f6a8b9c"

// Guests served over HTTP take an hour per transition, so that nothing
// changes unless a test asks for it.
var slowOpts = Options{BootTime: time.Hour, StopTime: time.Hour, RebootTime: time.Hour}

type service struct {
	addr string
	stop context.CancelFunc
	// done is closed when ServeListener has returned err.
	done chan struct{}
	err  error
}

// serve runs a VMM service on a free loopback port until the test ends.
func serve(t *testing.T, opts Options) *service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &service{addr: ln.Addr().String(), stop: stop, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = ServeListener(ctx, ln, testID, opts)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-s.done:
		case <-time.After(hangDeadline):
			t.Errorf("Serve did not return within %s of its ctx ending", hangDeadline)
		}
	})
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), hangDeadline)
	t.Cleanup(cancel)
	return ctx
}

// within runs f and fails the test if it does not return within the hang
// deadline.
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	c := make(chan T, 1)
	go func() { c <- f() }()
	select {
	case v := <-c:
		return v
	case <-time.After(hangDeadline):
		t.Fatalf("%s hung", what)
		panic("unreachable")
	}
}

// longPolls counts the goroutines of this process blocked in a long poll.
func longPolls() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "propolis.(*Guest).Wait(")
}

// eventually fails the test unless cond holds before the hang deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, hangDeadline)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStateRoundTrip(t *testing.T) {
	s := serve(t, Options{BootTime: time.Millisecond, StopTime: time.Millisecond, RebootTime: time.Millisecond})
	c := NewClient(s.addr)
	ctx := testCtx(t)

	st, err := c.Status(ctx)
	if err != nil || st.Gen != 1 || st.State != StateStarting || st.Detail != detailWaiting {
		t.Fatalf("Status = %+v, %v; want gen 1, starting, waiting", st, err)
	}
	st, err = c.Request(ctx, RequestRunning)
	if err != nil || st.Gen != 2 || st.State != StateStarting || st.Detail != detailBooting {
		t.Fatalf("Request(running) = %+v, %v; want gen 2, starting, booting", st, err)
	}
	// Follow the guest by long polls until it runs.
	for st.State != StateRunning {
		next, err := c.WaitChange(ctx, st.Gen, MaxWait)
		if err != nil {
			t.Fatal(err)
		}
		if next.Gen < st.Gen {
			t.Fatalf("generation went back: %+v after %+v", next, st)
		}
		st = next
	}
	if st.Gen != 3 {
		t.Errorf("running at %+v, want gen 3", st)
	}
	// A repeated request is a no-op.
	if again, err := c.Request(ctx, RequestRunning); err != nil || again != st {
		t.Errorf("repeated Request(running) = %+v, %v; want the unchanged %+v", again, err, st)
	}
	if _, err := c.Request(ctx, RequestStopped); err != nil {
		t.Fatal(err)
	}
	for st.State != StateStopped {
		if st, err = c.WaitChange(ctx, st.Gen, MaxWait); err != nil {
			t.Fatal(err)
		}
	}
	if st.Gen != 5 {
		t.Errorf("stopped at %+v, want gen 5", st)
	}
}

func TestLongPoll(t *testing.T) {
	s := serve(t, slowOpts)
	c := NewClient(s.addr)
	ctx := testCtx(t)

	// Nothing changes: the wait ends with the current status, and no error.
	st, err := c.WaitChange(ctx, 1, 50*time.Millisecond)
	if err != nil || st.Gen != 1 || st.State != StateStarting {
		t.Fatalf("WaitChange with nothing changing = %+v, %v; want gen 1", st, err)
	}
	// A change ends the wait: the change comes once the poll is waiting.
	type result struct {
		st  Status
		err error
	}
	res := make(chan result, 1)
	go func() {
		st, err := c.WaitChange(ctx, 1, MaxWait)
		res <- result{st, err}
	}()
	eventually(t, "the long poll waits", func() bool { return longPolls() == 1 })
	if _, err := c.Request(ctx, RequestRunning); err != nil {
		t.Fatal(err)
	}
	r := within(t, "the long poll after a change", func() result { return <-res })
	if r.err != nil || r.st.Gen != 2 || r.st.Detail != detailBooting {
		t.Errorf("WaitChange after a change = %+v, %v; want gen 2, booting", r.st, r.err)
	}

	// A poll for a past generation answers at once.
	if st, err := c.WaitChange(ctx, 1, MaxWait); err != nil || st.Gen != 2 {
		t.Errorf("WaitChange(1) at gen 2 = %+v, %v", st, err)
	}
	// So does one from a client that followed another incarnation of the
	// service, further along: it sees a lower generation.
	if st, err := c.WaitChange(ctx, 99, MaxWait); err != nil || st.Gen != 2 {
		t.Errorf("WaitChange(99) at gen 2 = %+v, %v; want gen 2 at once", st, err)
	}
}

// TestLongPollLeavesNothingBehind closes long polls from the client side
// and from the server side and checks that no server goroutine is left
// waiting.
func TestLongPollLeavesNothingBehind(t *testing.T) {
	s := serve(t, slowOpts)
	c := NewClient(s.addr)

	// The client gives up: its connection closes, and the server's wait
	// ends with it.
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := c.WaitChange(ctx, 1, MaxWait)
		errc <- err
	}()
	eventually(t, "the long poll waits", func() bool { return longPolls() == 1 })
	cancel()
	err := within(t, "a cancelled long poll", func() error { return <-errc })
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Errorf("cancelled WaitChange = %v, want context.Canceled and not ErrUnreachable", err)
	}
	eventually(t, "the server's wait ends after the client left", func() bool { return longPolls() == 0 })

	// Many clients leave at once.
	ctx, cancel = context.WithCancel(testCtx(t))
	for range 20 {
		go c.WaitChange(ctx, 1, MaxWait)
	}
	eventually(t, "20 long polls wait", func() bool { return longPolls() == 20 })
	cancel()
	eventually(t, "the server's waits end after the clients left", func() bool { return longPolls() == 0 })

	// The service shuts down under a long poll: the poll is answered with
	// the current status and Serve returns.
	pollCtx := testCtx(t)
	go func() {
		st, err := c.WaitChange(pollCtx, 1, MaxWait)
		if err == nil && st.Gen != 1 {
			err = errors.New("wrong status")
		}
		errc <- err
	}()
	eventually(t, "the long poll waits", func() bool { return longPolls() == 1 })
	s.stop()
	within(t, "Serve under a long poll", func() struct{} { return <-s.done })
	if s.err != nil {
		t.Errorf("Serve = %v, want nil", s.err)
	}
	if err := within(t, "a long poll during shutdown", func() error { return <-errc }); err != nil {
		t.Errorf("long poll during shutdown = %v, want the current status", err)
	}
	if n := longPolls(); n != 0 {
		t.Errorf("%d long polls left after shutdown", n)
	}
}

func TestClientErrors(t *testing.T) {
	s := serve(t, slowOpts)
	c := NewClient(s.addr)
	ctx := testCtx(t)

	// A refused transition.
	_, err := c.Request(ctx, RequestReboot)
	var ae *APIError
	if !errors.Is(err, ErrInvalidTransition) || !errors.As(err, &ae) {
		t.Fatalf("reboot while starting = %v, want an *APIError matching ErrInvalidTransition", err)
	}
	if ae.StatusCode != http.StatusConflict || ae.ErrorCode != "InvalidTransition" || ae.RequestID == "" ||
		!strings.Contains(ae.Message, "starting") || !strings.Contains(ae.Message, "reboot") {
		t.Errorf("refusal %+v: want 409 InvalidTransition with a request id, naming the state and the request", ae)
	}
	if errors.Is(err, ErrUnreachable) {
		t.Errorf("refusal %v matches ErrUnreachable", err)
	}

	// A request the service does not know: 400, not a transition.
	_, err = c.Request(ctx, "migrate")
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || errors.Is(err, ErrInvalidTransition) {
		t.Errorf("unknown request = %v, want a 400 *APIError", err)
	}
	if st, err := c.Status(ctx); err != nil || st.Gen != 1 {
		t.Errorf("refusals changed the guest: %+v, %v", st, err)
	}

	// Nobody listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, err = NewClient(closed).Status(ctx)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Status of a closed port = %v, want ErrUnreachable with ECONNREFUSED in the chain", err)
	}

	// Something else answers, not with a status.
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Write([]byte(`{"hello":"world"}`))
			return
		}
		http.Error(w, "not\nhere", http.StatusServiceUnavailable)
	})}
	oln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(oln)
	defer other.Close()
	oc := NewClient(oln.Addr().String())
	_, err = oc.Status(ctx)
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.Message != "not here" {
		t.Errorf("Status of a 503 = %v, want an *APIError with the body's snippet", err)
	}
	if _, err = oc.Request(ctx, RequestRunning); err == nil || errors.As(err, &ae) || errors.Is(err, ErrUnreachable) {
		t.Errorf("200 without a status = %v, want a decoding error", err)
	}
}

// TestClientDeadlines points clients at a server that accepts connections
// and never answers: every call ends with ErrUnreachable within its own
// deadline, even when the caller's ctx has none.
func TestClientDeadlines(t *testing.T) {
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 100)
	defer func() {
		hang.Close()
		close(conns)
		for c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			conn, err := hang.Accept()
			if err != nil {
				return
			}
			conns <- conn // read nothing, answer nothing
		}
	}()
	c := NewClient(hang.Addr().String())
	c.Timeout = 100 * time.Millisecond
	calls := map[string]func() error{
		"Status":     func() error { _, err := c.Status(context.Background()); return err },
		"Request":    func() error { _, err := c.Request(context.Background(), RequestRunning); return err },
		"WaitChange": func() error { _, err := c.WaitChange(context.Background(), 1, 100*time.Millisecond); return err },
	}
	for name, call := range calls {
		err := within(t, name+" against a silent server", call)
		if !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s against a silent server = %v, want ErrUnreachable and DeadlineExceeded", name, err)
		}
	}

	// The caller's own deadline counts as no answer too.
	c.Timeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = within(t, "Status with a caller deadline", func() error { _, err := c.Status(ctx); return err })
	if !errors.Is(err, ErrUnreachable) {
		t.Errorf("Status past the caller's deadline = %v, want ErrUnreachable", err)
	}
}

func TestHTTPErrors(t *testing.T) {
	s := serve(t, slowOpts)
	base := "http://" + s.addr
	tests := []struct {
		method, path, ctype, body string
		status                    int
		code, inMessage           string
	}{
		{"PUT", "/state", "application/json", `{"state":"running"`, 400, "InvalidRequest", "body"},
		{"PUT", "/state", "application/json", `{"state":"running","force":true}`, 400, "InvalidRequest", "force"},
		{"PUT", "/state", "application/json", `{}`, 400, "InvalidRequest", `missing field "state"`},
		{"PUT", "/state", "application/json", `{"state":"running"} {}`, 400, "InvalidRequest", "after the JSON object"},
		{"PUT", "/state", "application/json", `{"state":{"type":"running"}}`, 400, "InvalidRequest", "body"},
		{"PUT", "/state", "application/json", `{"state":"paused"}`, 400, "InvalidRequest", `"paused"`},
		{"PUT", "/state", "text/plain", `{"state":"running"}`, 400, "InvalidRequest", "content type"},
		{"PUT", "/state", "application/json", `{"state":"` + strings.Repeat("x", maxBodyBytes) + `"}`, 400, "InvalidRequest", "too large"},
		{"PUT", "/state", "application/json", `{"state":"reboot"}`, 409, "InvalidTransition", "starting"},
		{"GET", "/state?after_gen=x", "", "", 400, "InvalidRequest", "after_gen"},
		{"GET", "/state?after_gen=-1", "", "", 400, "InvalidRequest", "after_gen"},
		{"GET", "/state?after_gen=1&wait=forever", "", "", 400, "InvalidRequest", "wait"},
		{"GET", "/state?after_gen=1&wait=31s", "", "", 400, "InvalidRequest", "30s"},
		{"GET", "/state?after_gen=1&wait=-1s", "", "", 400, "InvalidRequest", "wait"},
		{"GET", "/state?wait=1s", "", "", 400, "InvalidRequest", "after_gen"},
		{"POST", "/state", "application/json", `{"state":"running"}`, 405, "MethodNotAllowed", "POST"},
		{"DELETE", "/health", "", "", 405, "MethodNotAllowed", "DELETE"},
		{"GET", "/", "", "", 404, "ObjectNotFound", "/"},
		{"GET", "/state/x", "", "", 404, "ObjectNotFound", "/state/x"},
	}
	for _, tt := range tests {
		req, err := http.NewRequestWithContext(testCtx(t), tt.method, base+tt.path, strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if tt.ctype != "" {
			req.Header.Set("Content-Type", tt.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e errorBody
		name := tt.method + " " + tt.path + " " + tt.body
		if len(name) > 80 {
			name = name[:80]
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Errorf("%s: body %q is not an error body: %v", name, b, err)
			continue
		}
		if resp.StatusCode != tt.status || e.ErrorCode != tt.code || !strings.Contains(e.Message, tt.inMessage) ||
			e.RequestID == "" || e.RequestID != resp.Header.Get("x-request-id") || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s %+v; want %d %s with %q in the message and the request id of the header", name, resp.StatusCode, resp.Header, e, tt.status, tt.code, tt.inMessage)
		}
		if tt.status == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s: 405 without Allow", name)
		}
	}
	// Nothing of that changed the guest; a body without a content type is
	// taken as JSON.
	if st, err := NewClient(s.addr).Status(testCtx(t)); err != nil || st.Gen != 1 {
		t.Errorf("after bad requests: %+v, %v; want gen 1", st, err)
	}
	resp, err := http.DefaultClient.Do(must(http.NewRequest("PUT", base+"/state", bytes.NewReader([]byte(`{"state":"running"}`)))))
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || st.Gen != 2 {
		t.Errorf("PUT without a content type: %d %+v %v", resp.StatusCode, st, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestStatusWireFormat(t *testing.T) {
	s := serve(t, slowOpts)
	resp, err := http.Get("http://" + s.addr + "/state")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	err = json.NewDecoder(resp.Body).Decode(&raw)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gen", "state", "time_updated", "detail"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("status JSON %v lacks %q", raw, k)
		}
	}
	if raw["gen"] != 1.0 || raw["state"] != "starting" {
		t.Errorf("status JSON %v", raw)
	}
	if _, err := time.Parse(time.RFC3339Nano, raw["time_updated"].(string)); err != nil {
		t.Errorf("time_updated: %v", err)
	}
}

// TestHealth checks that the linux runtime's readiness check accepts the
// service and that it says which VMM it serves.
func TestHealth(t *testing.T) {
	s := serve(t, slowOpts)
	if err := zoneservice.Check(testCtx(t), s.addr); err != nil {
		t.Fatalf("zoneservice.Check: %v", err)
	}
	h, err := zoneservice.Get(testCtx(t), s.addr)
	if err != nil {
		t.Fatal(err)
	}
	want := "oxz_propolis-server_" + testID
	if h.ID != testID || h.Zone != want || h.Zone != ZoneName(strings.ToUpper(testID)) || h.Kind != ZoneKind || h.PID != os.Getpid() || h.StartedAt.IsZero() {
		t.Errorf("health %+v, want id %s, zone %s", h, testID, want)
	}
	resp, err := http.Get("http://" + s.addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	err = json.NewDecoder(resp.Body).Decode(&raw)
	resp.Body.Close()
	if err != nil || raw["status"] != "ok" || raw["id"] != testID {
		t.Errorf("health JSON %v, %v; want status ok and the id", raw, err)
	}
}

func TestServeRefuses(t *testing.T) {
	ctx := testCtx(t)
	for _, id := range []string{"", "vmm-1", "../../etc", "{" + testID + "}", "urn:uuid:" + testID} {
		if err := Serve(ctx, "127.0.0.1:0", id, Options{}); err == nil || !strings.Contains(err.Error(), "not a UUID") {
			t.Errorf("Serve with id %q = %v, want a refusal", id, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := ServeListener(ctx, ln, id, Options{}); err == nil {
			t.Errorf("ServeListener with id %q succeeded", id)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("ServeListener with id %q left its listener open", id)
		}
	}
	if err := Serve(ctx, "256.0.0.1:1", testID, Options{}); err == nil {
		t.Error("Serve on a bad address succeeded")
	}
	// A ctx that ended before the start: Serve returns at once.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	within(t, "Serve with an ended ctx", func() error { return Serve(done, "127.0.0.1:0", testID, Options{}) })
}

// TestClientWaitBounds checks the wait a client asks for: the default for
// none, at most MaxWait.
func TestClientWaitBounds(t *testing.T) {
	queries := make(chan string, 10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries <- r.URL.RawQuery
		w.Write([]byte(`{"gen":1,"state":"starting","time_updated":"2000-01-01T00:00:00Z"}`))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c := NewClient(ln.Addr().String())
	for _, tt := range []struct {
		wait time.Duration
		want string
	}{
		{0, "after_gen=7&wait=10s"},
		{-time.Second, "after_gen=7&wait=10s"},
		{1500 * time.Millisecond, "after_gen=7&wait=1.5s"},
		{time.Hour, "after_gen=7&wait=30s"},
	} {
		if _, err := c.WaitChange(testCtx(t), 7, tt.wait); err != nil {
			t.Fatal(err)
		}
		if q := <-queries; q != tt.want {
			t.Errorf("WaitChange(7, %s) asked %q, want %q", tt.wait, q, tt.want)
		}
	}
}

// TestClientConnectionPerCall checks that a client keeps no connection
// between calls, since a VMM's zone may be replaced at the same address,
// and sends no api-version header, since the service has no versions.
func TestClientConnectionPerCall(t *testing.T) {
	var (
		mu       sync.Mutex
		conns    int
		versions int
	)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := r.Header["Api-Version"]; ok {
				mu.Lock()
				versions++
				mu.Unlock()
			}
			w.Write([]byte(`{"gen":1,"state":"starting","time_updated":"2000-01-01T00:00:00Z"}`))
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				mu.Lock()
				conns++
				mu.Unlock()
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c := NewClient(ln.Addr().String())
	ctx := testCtx(t)
	for range 3 {
		if _, err := c.Status(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 3 || versions != 0 {
		t.Errorf("3 calls used %d connections and sent %d api-version headers, want 3 and 0", conns, versions)
	}
}
