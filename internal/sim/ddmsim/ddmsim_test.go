package ddmsim_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
)

// Deadlines of the hang detectors; nothing here asserts how fast anything is.
const (
	waitDeadline = 20 * time.Second
	waitInterval = 5 * time.Millisecond
)

var prefixEq = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

func start(t *testing.T) (*ddmsim.Server, *ddm.Client) {
	t.Helper()
	s := ddmsim.New(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	c, err := ddm.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return s, c
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// answer is a raw HTTP answer.
type answer struct {
	status int
	body   string
}

// raw sends a request the client would never send. version "" omits the
// api-version header; contentType "" omits Content-Type.
func raw(t *testing.T, method, url, version, contentType, body string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if version != "" {
		req.Header.Set("api-version", version)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b)}
}

// checkErrorBody checks the upstream error body shape.
func checkErrorBody(t *testing.T, a answer) {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal([]byte(a.body), &body); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	id, _ := body["request_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Errorf("error body %s: request_id is not a uuid", a.body)
	}
	if msg, _ := body["message"].(string); msg == "" {
		t.Errorf("error body %s: no message", a.body)
	}
	for k := range body {
		if k != "request_id" && k != "message" && k != "error_code" {
			t.Errorf("error body %s: unexpected field %q", a.body, k)
		}
	}
}

// waitFor polls cond until it holds, failing the test after waitDeadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitDeadline); !cond(); time.Sleep(waitInterval) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestAdvertiseAndWithdrawAreIdempotent(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	for range 2 {
		if err := c.Advertise(ctx, prefixes("fd00:1122:3344:102::/64", "fd00:1122:3344:101::/64")); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := c.Withdraw(ctx, prefixes("fd00:1122:3344:102::/64", "fd00:9::/64")); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(prefixes("fd00:1122:3344:101::/64"), s.Originated(), prefixEq); diff != "" {
		t.Errorf("Originated (-want +got):\n%s", diff)
	}
	want := map[string]int{"PUT /prefix": 2, "DELETE /prefix": 2}
	if diff := cmp.Diff(want, s.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}

func TestHostBitsAreNotMasked(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.Advertise(ctx, prefixes("fd00::1/64", "fd00::/64")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prefixes("fd00::/64", "fd00::1/64"), s.Originated(), prefixEq); diff != "" {
		t.Errorf("after advertising both (-want +got):\n%s", diff)
	}
	if err := c.Withdraw(ctx, prefixes("fd00::/64")); err != nil {
		t.Fatal(err)
	}
	got, err := c.Originated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prefixes("fd00::1/64"), got, prefixEq); diff != "" {
		t.Errorf("after withdrawing the masked one (-want +got):\n%s", diff)
	}
}

func TestOriginatedIsASortedArray(t *testing.T) {
	s, _ := start(t)
	if a := raw(t, "GET", s.URL()+"/originated", "2.0.0", "", ""); a.status != 200 || a.body != "[]" {
		t.Errorf("empty: %d %s, want 200 []", a.status, a.body)
	}
	s.Inject(prefixes("fd00:1122:3344:102::/64", "fd00::/48", "fd00:1122:3344:101::/64", "fd00::/47")...)
	a := raw(t, "GET", s.URL()+"/originated", "2.0.0", "", "")
	want := `["fd00::/47","fd00::/48","fd00:1122:3344:101::/64","fd00:1122:3344:102::/64"]`
	if a.status != 200 || a.body != want {
		t.Errorf("GET /originated = %d %s, want 200 %s", a.status, a.body, want)
	}
}

func TestAPIVersionHeader(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		version string
		status  int
	}{
		{"", 400},
		{"2.0.0", 200},
		{"1.0.0", 200},
		{"2.0.0-rc.1", 200},
		{"2.0.0+build.5", 200},
		{"2.0.1", 400},
		{"2.1.0-rc1", 400},
		{"3.0.0", 400},
		{"banana", 400},
		{"2.0", 400},
		{"02.0.0", 400},
		{"2.0.0-", 400},
	} {
		a := raw(t, "GET", s.URL()+"/originated", tt.version, "", "")
		if a.status != tt.status {
			t.Errorf("api-version %q: %d %s, want %d", tt.version, a.status, a.body, tt.status)
		}
		if a.status != 200 {
			checkErrorBody(t, a)
		}
	}
	// The version is checked before the path, as in dropshot.
	if a := raw(t, "GET", s.URL()+"/nonesuch", "", "", ""); a.status != 400 {
		t.Errorf("unknown path without version: %d, want 400", a.status)
	}
}

func TestBadBodiesChangeNothing(t *testing.T) {
	s, _ := start(t)
	s.Inject(prefixes("fd00:1::/64")...)
	for _, tt := range []struct{ name, contentType, body string }{
		{"empty", "application/json", ""},
		{"null", "application/json", "null"},
		{"object", "application/json", `{"prefix": "fd00:2::/64"}`},
		{"string", "application/json", `"fd00:2::/64"`},
		{"ipv4", "application/json", `["fd00:2::/64", "10.0.0.0/8"]`},
		{"number", "application/json", `["fd00:2::/64", 5]`},
		{"garbage entry", "application/json", `["fd00:2::/64", "nope"]`},
		{"no width", "application/json", `["fd00:2::"]`},
		{"width too big", "application/json", `["fd00:2::/129"]`},
		{"trailing data", "application/json", `["fd00:2::/64"] x`},
		{"wrong content type", "text/plain", `["fd00:2::/64"]`},
	} {
		for _, method := range []string{"PUT", "DELETE"} {
			a := raw(t, method, s.URL()+"/prefix", "2.0.0", tt.contentType, tt.body)
			if a.status != 400 {
				t.Errorf("%s %s: %d %s, want 400", method, tt.name, a.status, a.body)
				continue
			}
			checkErrorBody(t, a)
		}
	}
	if diff := cmp.Diff(prefixes("fd00:1::/64"), s.Originated(), prefixEq); diff != "" {
		t.Errorf("state changed (-want +got):\n%s", diff)
	}
	// Without a Content-Type the body is taken as JSON, as dropshot does.
	if a := raw(t, "PUT", s.URL()+"/prefix", "2.0.0", "", `["fd00:3::/64"]`); a.status != 204 || a.body != "" {
		t.Errorf("PUT without Content-Type: %d %q, want 204", a.status, a.body)
	}
}

func TestUnknownPathsAndMethods(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/nonesuch", 404},
		{"GET", "/", 404},
		{"GET", "/tunnel_endpoints", 404}, // real, but not simulated
		{"POST", "/prefix", 405},
		{"GET", "/prefix", 405},
		{"DELETE", "/originated", 405},
	} {
		a := raw(t, tt.method, s.URL()+tt.path, "2.0.0", "", "")
		if a.status != tt.status {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, a.status, a.body, tt.status)
			continue
		}
		checkErrorBody(t, a)
	}
}

func TestPeersAndPrefixesAreEmptyMaps(t *testing.T) {
	s, _ := start(t)
	for _, path := range []string{"/peers", "/prefixes"} {
		if a := raw(t, "GET", s.URL()+path, "2.0.0", "", ""); a.status != 200 || a.body != "{}" {
			t.Errorf("GET %s = %d %s, want 200 {}", path, a.status, a.body)
		}
	}
}

func TestFaultError(t *testing.T) {
	s, c := start(t)
	if err := s.SetFault(ddmsim.FaultError); err != nil {
		t.Fatal(err)
	}
	a := raw(t, "PUT", s.URL()+"/prefix", "2.0.0", "application/json", `["fd00::/64"]`)
	if a.status != 500 {
		t.Fatalf("under FaultError: %d %s, want 500", a.status, a.body)
	}
	checkErrorBody(t, a)
	if len(s.Originated()) != 0 {
		t.Errorf("a failed advertise changed the state: %v", s.Originated())
	}
	s.SetFault(ddmsim.FaultNone)
	if err := c.Advertise(t.Context(), prefixes("fd00::/64")); err != nil {
		t.Errorf("after clearing: %v", err)
	}
}

func TestFaultRefuseDropsConnectionsAndClearsOnTheSameAddress(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	addr := s.Addr()
	// A kept-alive connection must not outlive the refusal.
	if _, err := c.Originated(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFault(ddmsim.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := c.Originated(ctx)
		if !errors.Is(err, ddm.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("under FaultRefuse: %v, want connection refused", err)
		}
	}
	if err := s.SetFault(ddmsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("address changed from %s to %s", addr, s.Addr())
	}
	if err := c.Advertise(ctx, prefixes("fd00::/64")); err != nil {
		t.Errorf("after clearing: %v", err)
	}
	if n := s.Requests()["GET /originated"]; n != 1 {
		t.Errorf("GET /originated served %d times, want 1 (refused ones never arrive)", n)
	}
}

// startHangingCall starts call and waits until the simulator has the
// request; the returned channel gets the call's result.
func startHangingCall(t *testing.T, s *ddmsim.Server, key string, call func() error) <-chan error {
	t.Helper()
	before := s.Requests()[key]
	done := make(chan error, 1)
	go func() { done <- call() }()
	waitFor(t, "the request to arrive", func() bool { return s.Requests()[key] > before })
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitDeadline):
		t.Fatal("the call did not return")
		return nil
	}
}

func TestFaultHangUntilClientGivesUp(t *testing.T) {
	s, c := start(t)
	s.SetFault(ddmsim.FaultHang)
	c.Timeout = 50 * time.Millisecond
	err := result(t, startHangingCall(t, s, "GET /originated", func() error {
		_, err := c.Originated(context.Background())
		return err
	}))
	if !errors.Is(err, ddm.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("under FaultHang: %v, want ErrUnreachable wrapping DeadlineExceeded", err)
	}
}

func TestFaultHangClearedServesTheWaitingRequest(t *testing.T) {
	s, c := start(t)
	s.SetFault(ddmsim.FaultHang)
	c.Timeout = time.Hour
	done := startHangingCall(t, s, "PUT /prefix", func() error {
		return c.Advertise(t.Context(), prefixes("fd00::/64"))
	})
	if err := s.SetFault(ddmsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Errorf("Advertise released by clearing the fault: %v", err)
	}
	if diff := cmp.Diff(prefixes("fd00::/64"), s.Originated(), prefixEq); diff != "" {
		t.Errorf("Originated (-want +got):\n%s", diff)
	}
}

func TestCloseWhileHangingReturns(t *testing.T) {
	s := ddmsim.New(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c, err := ddm.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = time.Hour
	s.SetFault(ddmsim.FaultHang)
	done := startHangingCall(t, s, "GET /peers", func() error {
		_, err := c.Peers(t.Context())
		return err
	})
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := result(t, closed); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := result(t, done); !errors.Is(err, ddm.ErrUnreachable) {
		t.Errorf("call cut by Close: %v, want ErrUnreachable", err)
	}
	if err := s.SetFault(ddmsim.FaultNone); !errors.Is(err, ddmsim.ErrClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}

func TestRestartEmptyLosesStateAndDropsInFlightRequests(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.Advertise(ctx, prefixes("fd00::/64", "fd00:1::/64")); err != nil {
		t.Fatal(err)
	}
	s.SetFault(ddmsim.FaultHang)
	// A fresh client: a request on a fresh connection is not retried by
	// the transport when that connection drops.
	fresh, err := ddm.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	fresh.Timeout = time.Hour
	done := startHangingCall(t, s, "GET /originated", func() error {
		_, err := fresh.Originated(ctx)
		return err
	})
	s.RestartEmpty()
	if err := result(t, done); !errors.Is(err, ddm.ErrUnreachable) {
		t.Errorf("in-flight call across the restart: %v, want ErrUnreachable", err)
	}
	s.SetFault(ddmsim.FaultNone)
	got, err := c.Originated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("Originated after restart = %v, want empty", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, byte(i)}), 64)
			for range 10 {
				if err := c.Advertise(ctx, []netip.Prefix{p}); err != nil {
					t.Error(err)
				}
				if _, err := c.Originated(ctx); err != nil {
					t.Error(err)
				}
				if err := c.Withdraw(ctx, []netip.Prefix{p}); err != nil {
					t.Error(err)
				}
				s.Requests()
			}
			if err := c.Advertise(ctx, []netip.Prefix{p}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			s.SetFault(ddmsim.FaultNone)
			s.Originated()
		}
	})
	wg.Wait()
	if n := len(s.Originated()); n != 8 {
		t.Errorf("%d prefixes originated, want 8", n)
	}
}

func TestControlEndpoints(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	ctl := func(method, path, body string) answer {
		t.Helper()
		return raw(t, method, s.URL()+path, "", "application/json", body)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "error"}`); a.status != 204 {
		t.Fatalf("set error fault: %d %s", a.status, a.body)
	}
	var apiErr *ddm.APIError
	if _, err := c.Originated(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 500 {
		t.Errorf("under error fault: %v, want 500", err)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "none"}`); a.status != 204 {
		t.Fatalf("clear fault: %d %s", a.status, a.body)
	}
	if err := c.Advertise(ctx, prefixes("fd00::/64")); err != nil {
		t.Fatal(err)
	}

	a := ctl("GET", "/__sim/state", "")
	var st struct {
		Fault      string         `json:"fault"`
		Originated []string       `json:"originated"`
		Requests   map[string]int `json:"requests"`
	}
	if err := json.Unmarshal([]byte(a.body), &st); err != nil || a.status != 200 {
		t.Fatalf("state: %d %s: %v", a.status, a.body, err)
	}
	if st.Fault != "none" || !cmp.Equal(st.Originated, []string{"fd00::/64"}) || st.Requests["PUT /prefix"] != 1 {
		t.Errorf("state = %+v", st)
	}

	if a := ctl("POST", "/__sim/restart-empty", ""); a.status != 204 {
		t.Fatalf("restart-empty: %d %s", a.status, a.body)
	}
	if got := s.Originated(); len(got) != 0 {
		t.Errorf("after restart-empty: %v", got)
	}
	if a := ctl("GET", "/__sim/state", ""); !strings.Contains(a.body, `"originated":[]`) {
		t.Errorf("state after restart-empty = %s, want an empty originated array", a.body)
	}

	for _, bad := range []string{`{"fault": "sulk"}`, `{}`, `{"fault": "hang", "refuse_for": "1s"}`, `{"refuse_for": "soon"}`, `{"fault": "none", "extra": 1}`} {
		a := ctl("PUT", "/__sim/fault", bad)
		if a.status != 400 {
			t.Errorf("fault %s: %d, want 400", bad, a.status)
		} else {
			checkErrorBody(t, a)
		}
	}
	if a := ctl("GET", "/__sim/nonesuch", ""); a.status != 404 {
		t.Errorf("unknown control path: %d, want 404", a.status)
	}

	// A timed refusal answers, refuses, then listens again by itself.
	if a := ctl("PUT", "/__sim/fault", `{"refuse_for": "50ms"}`); a.status != 204 {
		t.Fatalf("refuse_for: %d %s", a.status, a.body)
	}
	waitFor(t, "the refusal to end", func() bool { return s.Fault() == ddmsim.FaultNone })
	if err := c.Advertise(ctx, prefixes("fd00::/64")); err != nil {
		t.Errorf("after the timed refusal: %v", err)
	}
	if _, ok := s.Requests()["PUT /__sim/fault"]; ok {
		t.Error("control requests were counted")
	}
}

func TestStartErrors(t *testing.T) {
	s, _ := start(t)
	if err := s.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start succeeded")
	}
	if err := s.SetFault("sulk"); err == nil {
		t.Error("SetFault of an unknown fault succeeded")
	}
	other := ddmsim.New(nil)
	if err := other.Start(s.Addr()); err == nil {
		other.Close()
		t.Error("Start on a taken address succeeded")
	}
	other.Close()
	if err := other.Start("127.0.0.1:0"); !errors.Is(err, ddmsim.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}
