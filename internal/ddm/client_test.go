package ddm_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
)

// hangDeadline only detects hangs; nothing here asserts how fast anything is.
const hangDeadline = 20 * time.Second

// seen is one request a fake server received.
type seen struct {
	Method, Path, APIVersion, ContentType, Body string
}

// recorder is a fake ddmd that records requests and answers as scripted.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
	// answer writes the answer to a request; nil answers 204 or "[]"/"{}".
	answer func(w http.ResponseWriter, r *http.Request)
}

func (f *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, seen{r.Method, r.URL.Path, r.Header.Get("api-version"), r.Header.Get("Content-Type"), string(body)})
	answer := f.answer
	f.mu.Unlock()
	if answer != nil {
		answer(w, r)
		return
	}
	switch r.URL.Path {
	case "/originated":
		io.WriteString(w, "[]")
	case "/peers", "/prefixes":
		io.WriteString(w, "{}")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (f *recorder) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

func startFake(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*recorder, *ddm.Client) {
	t.Helper()
	f := &recorder{answer: answer}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := ddm.NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return f, c
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func TestEveryCallSendsVersionAndWithdrawSendsBody(t *testing.T) {
	f, c := startFake(t, nil)
	ctx := t.Context()
	if _, err := c.Originated(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Advertise(ctx, prefixes("fd00:1122:3344:101::/64", "fd00::1/64")); err != nil {
		t.Fatal(err)
	}
	if err := c.Withdraw(ctx, prefixes("fd00:1122:3344:102::/64")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Peers(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prefixes(ctx); err != nil {
		t.Fatal(err)
	}
	want := []seen{
		{"GET", "/originated", "2.0.0", "", ""},
		{"PUT", "/prefix", "2.0.0", "application/json", `["fd00:1122:3344:101::/64","fd00::1/64"]`},
		{"DELETE", "/prefix", "2.0.0", "application/json", `["fd00:1122:3344:102::/64"]`},
		{"GET", "/peers", "2.0.0", "", ""},
		{"GET", "/prefixes", "2.0.0", "", ""},
	}
	if diff := cmp.Diff(want, f.requests()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestOriginatedKeepsHostBits(t *testing.T) {
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `["fd00:1122:3344:101::1/64","fd00::/48"]`)
	})
	got, err := c.Originated(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := prefixes("fd00:1122:3344:101::1/64", "fd00::/48")
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("Originated (-want +got):\n%s", diff)
	}
}

func TestOriginatedRejectsBadEntries(t *testing.T) {
	for _, entry := range []string{"10.0.0.0/8", "not-a-prefix", "fd00::1", "fd00::/129"} {
		t.Run(entry, func(t *testing.T) {
			_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `["fd00::/64",`+strconv.Quote(entry)+`]`)
			})
			_, err := c.Originated(t.Context())
			if err == nil || !strings.Contains(err.Error(), entry) {
				t.Errorf("Originated = %v, want an error naming %q", err, entry)
			}
		})
	}
}

func TestAdvertiseWithdrawRefuseNonIPv6AndSendNothingWhenEmpty(t *testing.T) {
	f, c := startFake(t, nil)
	ctx := t.Context()
	for _, bad := range [][]netip.Prefix{
		prefixes("fd00::/64", "10.0.0.0/8"),
		{netip.Prefix{}},
	} {
		if err := c.Advertise(ctx, bad); err == nil {
			t.Errorf("Advertise(%v) succeeded", bad)
		}
		if err := c.Withdraw(ctx, bad); err == nil {
			t.Errorf("Withdraw(%v) succeeded", bad)
		}
	}
	if err := c.Advertise(ctx, nil); err != nil {
		t.Errorf("Advertise(nil) = %v", err)
	}
	if err := c.Withdraw(ctx, []netip.Prefix{}); err != nil {
		t.Errorf("Withdraw(empty) = %v", err)
	}
	if got := f.requests(); len(got) != 0 {
		t.Errorf("requests sent: %v, want none", got)
	}
}

func TestPeersAndPrefixesDecodeRealAnswers(t *testing.T) {
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/peers":
			io.WriteString(w, `{"2": {"addr": "fe80::aa40:25ff:fe00:1", "host": "switch0", "kind": 1,
				"status": {"type": "Exchange", "duration": {"secs": 12, "nanos": 500}}, "extra": true},
				"3": {"addr": "fe80::aa40:25ff:fe00:2", "host": "sled7", "kind": "Server",
				"status": {"type": "Solicit", "duration": {"secs": 0, "nanos": 0}}}}`)
		case "/prefixes":
			io.WriteString(w, `{"fe80::aa40:25ff:fe00:1": [{"destination": "fd00:1122:3344:102::/64", "path": ["switch0"]}]}`)
		}
	})
	peers, err := c.Peers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	wantPeers := map[string]ddm.PeerInfo{
		"2": {Addr: "fe80::aa40:25ff:fe00:1", Host: "switch0", Kind: ddm.RouterKindTransit,
			Status: ddm.PeerStatus{Type: "Exchange", Duration: ddm.Duration{Secs: 12, Nanos: 500}}},
		"3": {Addr: "fe80::aa40:25ff:fe00:2", Host: "sled7", Kind: ddm.RouterKindServer,
			Status: ddm.PeerStatus{Type: "Solicit"}},
	}
	if diff := cmp.Diff(wantPeers, peers); diff != "" {
		t.Errorf("Peers (-want +got):\n%s", diff)
	}
	if d := peers["2"].Status.Duration.Std(); d != 12*time.Second+500 {
		t.Errorf("Duration.Std = %v", d)
	}
	routes, err := c.Prefixes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := routes["fe80::aa40:25ff:fe00:1"]
	if len(r) != 1 || r[0].Destination != netip.MustParsePrefix("fd00:1122:3344:102::/64") || !cmp.Equal(r[0].Path, []string{"switch0"}) {
		t.Errorf("Prefixes = %v", routes)
	}
}

func TestNewClientNamesDDMAndSetsDefaultTimeout(t *testing.T) {
	// The rules for a base URL are dropshot's and tested there.
	if _, err := ddm.NewClient("ftp://[::1]:8000"); err == nil || !strings.HasPrefix(err.Error(), "ddm URL ") {
		t.Errorf("NewClient(ftp) = %v, want an error naming ddm", err)
	}
	c, err := ddm.NewClient("http://[::1]:8000")
	if err != nil || c.Timeout != ddm.DefaultTimeout {
		t.Errorf("NewClient = %+v, %v; want Timeout %v", c, err, ddm.DefaultTimeout)
	}
}

// How an error body becomes an APIError is dropshot's and tested there; this
// is that the error is DDM's and names it.
func TestErrorAnswerIsDDMAPIError(t *testing.T) {
	_, c := startFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"request_id": "5f2c", "error_code": "InvalidRequest", "message": "unable to parse JSON body"}`)
	})
	err := c.Advertise(t.Context(), prefixes("fd00::/64"))
	var got *ddm.APIError
	if !errors.As(err, &got) {
		t.Fatalf("Advertise = %v, want an APIError", err)
	}
	want := ddm.APIError{Method: "PUT", Path: "/prefix", StatusCode: 400, RequestID: "5f2c", ErrorCode: "InvalidRequest", Message: "unable to parse JSON body"}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("APIError (-want +got):\n%s", diff)
	}
	if !got.ClientError() || got.ServerError() {
		t.Errorf("ClientError = %v, ServerError = %v for 400", got.ClientError(), got.ServerError())
	}
	if errors.Is(err, ddm.ErrUnreachable) {
		t.Errorf("an answer was reported unreachable: %v", err)
	}
	const wantMsg = "ddm PUT /prefix: 400 Bad Request: unable to parse JSON body (error_code InvalidRequest) (request_id 5f2c)"
	if msg := err.Error(); msg != wantMsg {
		t.Errorf("Error() = %q, want %q", msg, wantMsg)
	}
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

// The tests below run the client against the simulator. Deadlines,
// ErrUnreachable and caller cancellation are tested in full in dropshot;
// the fault test here checks that the client wires up ErrUnreachable and
// its Timeout.

func startSim(t *testing.T) (*ddmsim.Server, *ddm.Client) {
	t.Helper()
	s := ddmsim.New(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := ddm.NewClient(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return s, c
}

func TestSimulatorRoundTripKeepsHostBits(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()
	if err := c.Advertise(ctx, prefixes("fd00:1122:3344:101::/64", "fd00:1122:3344:101::1/64", "fd00:1122:3344:1::/64")); err != nil {
		t.Fatal(err)
	}
	if err := c.Withdraw(ctx, prefixes("fd00:1122:3344:101::/64", "fd00:1122:3344:999::/64")); err != nil {
		t.Fatal(err)
	}
	got, err := c.Originated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := prefixes("fd00:1122:3344:1::/64", "fd00:1122:3344:101::1/64")
	eq := cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })
	if diff := cmp.Diff(want, got, eq); diff != "" {
		t.Errorf("Originated (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, s.Originated(), eq); diff != "" {
		t.Errorf("simulator state (-want +got):\n%s", diff)
	}
	peers, err := c.Peers(ctx)
	if err != nil || len(peers) != 0 {
		t.Errorf("Peers = %v, %v; want empty", peers, err)
	}
	routes, err := c.Prefixes(ctx)
	if err != nil || len(routes) != 0 {
		t.Errorf("Prefixes = %v, %v; want empty", routes, err)
	}
}

func TestSimulatorFaultsGiveTypedErrors(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()

	s.SetFault(ddmsim.FaultError)
	err := c.Advertise(ctx, prefixes("fd00::/64"))
	var apiErr *ddm.APIError
	if !errors.As(err, &apiErr) || !apiErr.ServerError() || apiErr.RequestID == "" {
		t.Errorf("under FaultError: %v, want a 5xx APIError with a request id", err)
	}

	s.SetFault(ddmsim.FaultRefuse)
	_, err = c.Originated(ctx)
	if !errors.Is(err, ddm.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("under FaultRefuse: %v, want ErrUnreachable wrapping ECONNREFUSED", err)
	}

	s.SetFault(ddmsim.FaultHang)
	c.Timeout = 100 * time.Millisecond
	err = callWithin(t, func() error { _, err := c.Originated(ctx); return err })
	if !errors.Is(err, ddm.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("under FaultHang: %v, want ErrUnreachable wrapping context.DeadlineExceeded", err)
	}

	if err := s.SetFault(ddmsim.FaultNone); err != nil {
		t.Fatal(err)
	}
	c.Timeout = ddm.DefaultTimeout
	if err := c.Advertise(ctx, prefixes("fd00::/64")); err != nil {
		t.Errorf("after clearing the fault: %v", err)
	}
}

func TestSimulatorRestartIsSurvivedByKeptAliveClient(t *testing.T) {
	s, c := startSim(t)
	ctx := t.Context()
	if err := c.Advertise(ctx, prefixes("fd00::/64")); err != nil {
		t.Fatal(err)
	}
	s.RestartEmpty()
	// The kept-alive connection was dropped; advertise is idempotent, so
	// the transport may retry it on a new one.
	if err := c.Advertise(ctx, prefixes("fd00:1::/64")); err != nil {
		t.Fatalf("Advertise after restart: %v", err)
	}
	got, err := c.Originated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := prefixes("fd00:1::/64"); !cmp.Equal(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })) {
		t.Errorf("Originated after restart = %v, want %v", got, want)
	}
}
