package simhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

// waitInterval is how often waitFor looks; simhttptest.Deadline bounds it.
const waitInterval = 5 * time.Millisecond

// waitFor polls cond until it holds, failing the test after
// simhttptest.Deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(simhttptest.Deadline); !cond(); time.Sleep(waitInterval) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// newClient is a client with its own connections, closed at the end of
// the test.
func newClient(t *testing.T) *http.Client {
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// try sends an API request with the right version and returns the status,
// or the error when no answer came.
func try(ctx context.Context, c *http.Client, method, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("api-version", "1.2.3")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// startHangingCall sends a request and waits until s has it; the returned
// channel gets the request's error, or an error for an answer other than
// 2xx.
func startHangingCall(t *testing.T, s *simhttp.Server, c *http.Client, method, path, key string) <-chan error {
	t.Helper()
	before := s.Requests()[key]
	done := make(chan error, 1)
	go func() {
		status, err := try(context.Background(), c, method, s.URL()+path)
		if err == nil && status/100 != 2 {
			err = errors.New(http.StatusText(status))
		}
		done <- err
	}()
	waitFor(t, "the request to arrive", func() bool { return s.Requests()[key] > before })
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(simhttptest.Deadline):
		t.Fatal("the call did not return")
		return nil
	}
}

func TestAPIVersionHeader(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		version string
		status  int
	}{
		{"", 400},
		{"1.2.3", 200},
		{"1.0.0", 200},
		{"0.9.99", 200},
		{"1.2.3-rc.1", 200},
		{"1.2.3+build.5", 200},
		{"1.2.4", 400},
		{"1.3.0-rc1", 400},
		{"2.0.0", 400},
		{"banana", 400},
		{"1.2", 400},
		{"01.2.3", 400},
		{"1.2.3-", 400},
	} {
		a := simhttptest.Do(t, "GET", s.URL()+"/things/x", tt.version, "", "")
		if a.Status != tt.status {
			t.Errorf("api-version %q: %d %s, want %d", tt.version, a.Status, a.Body, tt.status)
		}
		if a.Status != 200 {
			simhttptest.CheckErrorBody(t, a)
		}
	}
	// The version is checked before the path, as in dropshot.
	if a := simhttptest.Do(t, "GET", s.URL()+"/nonesuch", "", "", ""); a.Status != 400 {
		t.Errorf("unknown path without version: %d, want 400", a.Status)
	}
}

func TestFaultErrorAnswers500AndRunsNoHandler(t *testing.T) {
	s, st := start(t)
	if err := s.SetFault(simhttp.FaultError); err != nil {
		t.Fatal(err)
	}
	a := do(t, "PUT", s.URL()+"/store/a")
	if a.Status != 500 {
		t.Fatalf("under FaultError: %d %s, want 500", a.Status, a.Body)
	}
	simhttptest.CheckErrorBody(t, a)
	if got := st.list(); len(got) != 0 {
		t.Errorf("a failed request changed the state: %v", got)
	}
	if err := s.SetFault(simhttp.FaultNone); err != nil {
		t.Fatal(err)
	}
	if a := do(t, "PUT", s.URL()+"/store/a"); a.Status != 204 || !cmp.Equal(st.list(), []string{"a"}) {
		t.Errorf("after clearing: %d %s, state %v", a.Status, a.Body, st.list())
	}
}

func TestFaultRefuseDropsConnectionsAndClearsOnTheSameAddress(t *testing.T) {
	s, _ := start(t)
	c := newClient(t)
	ctx := t.Context()
	addr := s.Addr()
	// A kept-alive connection must not outlive the refusal.
	if status, err := try(ctx, c, "GET", s.URL()+"/things/x"); status != 200 {
		t.Fatalf("GET: %d, %v", status, err)
	}
	if err := s.SetFault(simhttp.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := try(ctx, c, "GET", s.URL()+"/things/x"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("under FaultRefuse: %v, want connection refused", err)
		}
	}
	if err := s.SetFault(simhttp.FaultNone); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Errorf("address changed from %s to %s", addr, s.Addr())
	}
	if status, err := try(ctx, c, "PUT", s.URL()+"/store/a"); status != 204 {
		t.Errorf("after clearing: %d, %v", status, err)
	}
	if n := s.Requests()["GET /things/{ip}"]; n != 1 {
		t.Errorf("GET /things/{ip} served %d times, want 1 (refused ones never arrive)", n)
	}
}

func TestFaultHangUntilClientGivesUp(t *testing.T) {
	s, _ := start(t)
	s.SetFault(simhttp.FaultHang)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := try(ctx, newClient(t), "GET", s.URL()+"/things/x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("under FaultHang: %v, want DeadlineExceeded", err)
	}
	if n := s.Requests()["GET /things/{ip}"]; n != 1 {
		t.Errorf("GET /things/{ip} counted %d times, want 1", n)
	}
}

func TestFaultHangClearedServesTheWaitingRequest(t *testing.T) {
	s, st := start(t)
	s.SetFault(simhttp.FaultHang)
	done := startHangingCall(t, s, newClient(t), "PUT", "/store/a", "PUT /store/{k}")
	if err := s.SetFault(simhttp.FaultNone); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Errorf("request released by clearing the fault: %v", err)
	}
	if diff := cmp.Diff([]string{"a"}, st.list()); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

func TestCloseWhileHangingReturns(t *testing.T) {
	cfg, _ := config()
	s := simhttp.New(cfg)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	s.SetFault(simhttp.FaultHang)
	done := startHangingCall(t, s, newClient(t), "GET", "/things/x", "GET /things/{ip}")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := result(t, closed); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := result(t, done); err == nil {
		t.Error("request cut by Close succeeded")
	}
	if err := s.SetFault(simhttp.FaultNone); !errors.Is(err, errClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}

func TestRestartEmptyForgetsAndDropsInFlightRequests(t *testing.T) {
	s, st := start(t)
	if a := do(t, "PUT", s.URL()+"/store/a"); a.Status != 204 {
		t.Fatalf("PUT: %d %s", a.Status, a.Body)
	}
	s.SetFault(simhttp.FaultHang)
	// A fresh client: a request on a fresh connection is not retried by
	// the transport when that connection drops.
	done := startHangingCall(t, s, newClient(t), "GET", "/things/x", "GET /things/{ip}")
	s.RestartEmpty()
	if err := result(t, done); err == nil {
		t.Error("in-flight request across the restart succeeded")
	}
	if got := st.list(); len(got) != 0 {
		t.Errorf("state after restart = %v, want empty", got)
	}
	if f := s.Fault(); f != simhttp.FaultHang {
		t.Errorf("fault after restart = %q, want it kept", f)
	}
	s.SetFault(simhttp.FaultNone)
	if a := do(t, "GET", s.URL()+"/things/x"); a.Status != 200 {
		t.Errorf("after restart: %d %s (the listener stays open)", a.Status, a.Body)
	}
}

func TestControlEndpoints(t *testing.T) {
	s, st := start(t)
	// Control requests need no api-version header.
	ctl := func(method, path, body string) simhttptest.Answer {
		t.Helper()
		return simhttptest.Do(t, method, s.URL()+path, "", "application/json", body)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "error"}`); a.Status != 204 {
		t.Fatalf("set error fault: %d %s", a.Status, a.Body)
	}
	if a := do(t, "GET", s.URL()+"/things/x"); a.Status != 500 {
		t.Errorf("under error fault: %d %s, want 500", a.Status, a.Body)
	}
	if a := ctl("PUT", "/__sim/fault", `{"fault": "none"}`); a.Status != 204 {
		t.Fatalf("clear fault: %d %s", a.Status, a.Body)
	}
	if a := do(t, "PUT", s.URL()+"/store/a"); a.Status != 204 {
		t.Fatalf("after clearing: %d %s", a.Status, a.Body)
	}

	// restart-empty answers on the connection it does not drop.
	if a := ctl("POST", "/__sim/restart-empty", ""); a.Status != 204 {
		t.Fatalf("restart-empty: %d %s", a.Status, a.Body)
	}
	if got := st.list(); len(got) != 0 {
		t.Errorf("after restart-empty: %v", got)
	}

	for _, bad := range []string{`{"fault": "sulk"}`, `{}`, `{"fault": "hang", "refuse_for": "1s"}`, `{"refuse_for": "soon"}`, `{"refuse_for": "-1s"}`, `{"fault": "none", "extra": 1}`} {
		a := ctl("PUT", "/__sim/fault", bad)
		if a.Status != 400 {
			t.Errorf("fault %s: %d, want 400", bad, a.Status)
		} else {
			simhttptest.CheckErrorBody(t, a)
		}
	}
	if s.Fault() != simhttp.FaultNone {
		t.Errorf("a refused fault body changed the fault to %q", s.Fault())
	}
	if a := ctl("GET", "/__sim/nonesuch", ""); a.Status != 404 {
		t.Errorf("unknown control path: %d, want 404", a.Status)
	}

	// A timed refusal answers, refuses, then listens again by itself.
	if a := ctl("PUT", "/__sim/fault", `{"refuse_for": "50ms"}`); a.Status != 204 {
		t.Fatalf("refuse_for: %d %s", a.Status, a.Body)
	}
	waitFor(t, "the refusal to end", func() bool { return s.Fault() == simhttp.FaultNone })
	if a := do(t, "PUT", s.URL()+"/store/b"); a.Status != 204 {
		t.Errorf("after the timed refusal: %d %s", a.Status, a.Body)
	}
	for k := range s.Requests() {
		if strings.Contains(k, "__sim") {
			t.Errorf("control request counted: %q", k)
		}
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
	cfg, _ := config()
	other := simhttp.New(cfg)
	if err := other.Start(s.Addr()); err == nil {
		other.Close()
		t.Error("Start on a taken address succeeded")
	}
	other.Close()
	if err := other.Start("127.0.0.1:0"); !errors.Is(err, errClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := other.SetFault(simhttp.FaultNone); !errors.Is(err, errClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}
