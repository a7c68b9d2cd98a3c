package ddmsim_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/ddmsim"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
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
	if a := simhttptest.Do(t, "GET", s.URL()+"/originated", "2.0.0", "", ""); a.Status != 200 || a.Body != "[]" {
		t.Errorf("empty: %d %s, want 200 []", a.Status, a.Body)
	}
	s.Inject(prefixes("fd00:1122:3344:102::/64", "fd00::/48", "fd00:1122:3344:101::/64", "fd00::/47")...)
	a := simhttptest.Do(t, "GET", s.URL()+"/originated", "2.0.0", "", "")
	want := `["fd00::/47","fd00::/48","fd00:1122:3344:101::/64","fd00:1122:3344:102::/64"]`
	if a.Status != 200 || a.Body != want {
		t.Errorf("GET /originated = %d %s, want 200 %s", a.Status, a.Body, want)
	}
}

// The api-version check itself is tested in simhttp.
func TestServesUpToAPIVersion(t *testing.T) {
	s, _ := start(t)
	for _, tt := range []struct {
		version string
		status  int
	}{{ddmsim.APIVersion, 200}, {"1.0.0", 200}, {"2.0.1", 400}, {"3.0.0", 400}} {
		if a := simhttptest.Do(t, "GET", s.URL()+"/originated", tt.version, "", ""); a.Status != tt.status {
			t.Errorf("api-version %q: %d %s, want %d", tt.version, a.Status, a.Body, tt.status)
		}
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
			a := simhttptest.Do(t, method, s.URL()+"/prefix", "2.0.0", tt.contentType, tt.body)
			if a.Status != 400 {
				t.Errorf("%s %s: %d %s, want 400", method, tt.name, a.Status, a.Body)
				continue
			}
			simhttptest.CheckErrorBody(t, a)
		}
	}
	if diff := cmp.Diff(prefixes("fd00:1::/64"), s.Originated(), prefixEq); diff != "" {
		t.Errorf("state changed (-want +got):\n%s", diff)
	}
	// Without a Content-Type the body is taken as JSON, as dropshot does.
	if a := simhttptest.Do(t, "PUT", s.URL()+"/prefix", "2.0.0", "", `["fd00:3::/64"]`); a.Status != 204 || a.Body != "" {
		t.Errorf("PUT without Content-Type: %d %q, want 204", a.Status, a.Body)
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
		{"PUT", "/sync", 404}, // real, but not simulated
		{"GET", "/tunnel_endpoint", 405},
		{"POST", "/tunnel_endpoint", 405},
		{"PUT", "/tunnel_endpoints", 405},
		{"POST", "/prefix", 405},
		{"GET", "/prefix", 405},
		{"DELETE", "/originated", 405},
	} {
		a := simhttptest.Do(t, tt.method, s.URL()+tt.path, "2.0.0", "", "")
		if a.Status != tt.status {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, a.Status, a.Body, tt.status)
			continue
		}
		simhttptest.CheckErrorBody(t, a)
	}
}

func TestPeersAndPrefixesAreEmptyMaps(t *testing.T) {
	s, _ := start(t)
	for _, path := range []string{"/peers", "/prefixes"} {
		if a := simhttptest.Do(t, "GET", s.URL()+path, "2.0.0", "", ""); a.Status != 200 || a.Body != "{}" {
			t.Errorf("GET %s = %d %s, want 200 {}", path, a.Status, a.Body)
		}
	}
}

// Faults, and restarts dropping connections, are tested in simhttp.
func TestRestartEmptyLosesState(t *testing.T) {
	s, c := start(t)
	ctx := t.Context()
	if err := c.Advertise(ctx, prefixes("fd00::/64", "fd00:1::/64")); err != nil {
		t.Fatal(err)
	}
	s.RestartEmpty()
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
	ctl := func(method, path, body string) simhttptest.Answer {
		t.Helper()
		return simhttptest.Do(t, method, s.URL()+path, "", "application/json", body)
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
	if err := json.Unmarshal([]byte(a.Body), &st); err != nil || a.Status != 200 {
		t.Fatalf("state: %d %s: %v", a.Status, a.Body, err)
	}
	if st.Fault != "none" || !cmp.Equal(st.Originated, []string{"fd00::/64"}) || st.Requests["PUT /prefix"] != 1 {
		t.Errorf("state = %+v", st)
	}

	if a := ctl("POST", "/__sim/restart-empty", ""); a.Status != 204 {
		t.Fatalf("restart-empty: %d %s", a.Status, a.Body)
	}
	if got := s.Originated(); len(got) != 0 {
		t.Errorf("after restart-empty: %v", got)
	}
	if a := ctl("GET", "/__sim/state", ""); !strings.Contains(a.Body, `"originated":[]`) {
		t.Errorf("state after restart-empty = %s, want an empty originated array", a.Body)
	}
}

func TestClosedServerSaysErrClosed(t *testing.T) {
	s := ddmsim.New(nil)
	s.Close()
	if err := s.Start("127.0.0.1:0"); !errors.Is(err, ddmsim.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := s.SetFault(ddmsim.FaultNone); !errors.Is(err, ddmsim.ErrClosed) {
		t.Errorf("SetFault after Close = %v, want ErrClosed", err)
	}
}
