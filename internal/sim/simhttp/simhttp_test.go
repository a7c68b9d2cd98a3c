package simhttp_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

func start(t *testing.T) *simhttp.Server {
	t.Helper()
	api := &simhttp.Router{}
	echo := func(rp *simhttp.Reply, r *http.Request) {
		rp.JSON(http.StatusOK, map[string]string{"ip": r.PathValue("ip")})
	}
	api.Handle("GET /things/{ip}", echo)
	api.Handle("DELETE /things/{ip}", func(rp *simhttp.Reply, r *http.Request) {
		if simhttp.Conn(r) == nil {
			rp.Error(http.StatusInternalServerError, "", "no connection")
			return
		}
		rp.NoContent()
	})
	api.Handle("GET /things/{ip}/static", echo)
	s := simhttp.New(simhttp.Config{Name: "test", APIVersion: "1.2.3", ErrClosed: errors.New("closed"), API: api})
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type answer struct {
	status int
	allow  string
	body   string
}

func do(t *testing.T, method, url string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("api-version", "1.2.3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Allow"), string(b)}
}

func TestRouter(t *testing.T) {
	s := start(t)
	if a := do(t, "GET", s.URL()+"/things/a%2Fb"); a.status != 200 || !strings.Contains(a.body, `"ip":"a/b"`) {
		t.Errorf("escaped slash: %d %s, want one segment a/b", a.status, a.body)
	}
	if a := do(t, "GET", s.URL()+"/things/x/static"); a.status != 200 || !strings.Contains(a.body, `"ip":"x"`) {
		t.Errorf("longer route: %d %s", a.status, a.body)
	}
	if a := do(t, "DELETE", s.URL()+"/things/x"); a.status != 204 {
		t.Errorf("DELETE: %d %s (Conn must be set)", a.status, a.body)
	}
	for _, tt := range []struct {
		method, path string
		want         answer
	}{
		{"PUT", "/things/x", answer{status: 405, allow: "GET, DELETE"}},
		{"HEAD", "/things/x", answer{status: 405, allow: "GET, DELETE"}},
		{"DELETE", "/things/x/static", answer{status: 405, allow: "GET"}},
		{"GET", "/things/", answer{status: 404}},
		{"GET", "/things", answer{status: 404}},
		{"GET", "/things/x/other", answer{status: 404}},
	} {
		a := do(t, tt.method, s.URL()+tt.path)
		a.body = ""
		if a != tt.want {
			t.Errorf("%s %s = %+v, want %+v", tt.method, tt.path, a, tt.want)
		}
	}
	want := map[string]int{
		"GET /things/{ip}":           1,
		"GET /things/{ip}/static":    1,
		"DELETE /things/{ip}":        1,
		"PUT /things/{ip}":           1,
		"HEAD /things/{ip}":          1,
		"DELETE /things/{ip}/static": 1,
		"GET /things/":               1,
		"GET /things":                1,
		"GET /things/x/other":        1,
	}
	if diff := cmp.Diff(want, s.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}

func TestNoControlRouterServesOnlyTheFault(t *testing.T) {
	s := start(t)
	if a := do(t, "GET", s.URL()+"/__sim/state"); a.status != 404 {
		t.Errorf("GET /__sim/state: %d, want 404", a.status)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "PUT", s.URL()+"/__sim/fault", strings.NewReader(`{"fault":"error"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || s.Fault() != simhttp.FaultError {
		t.Errorf("PUT /__sim/fault: %d, fault %q", resp.StatusCode, s.Fault())
	}
}

func TestCheckVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"1.2.3": true, "1.2.2": true, "0.9.99": true, "1.2.3-rc.1": true, "1.2.3+b": true,
		"": false, "1.2.4": false, "1.3.0-rc.1": false, "2.0.0": false, "1.2": false, "v1.2.3": false, "1.02.3": false, "1.2.3-01": false,
	} {
		if err := simhttp.CheckVersion(v, "1.2.3"); (err == nil) != ok {
			t.Errorf("CheckVersion(%q) = %v, want ok %v", v, err, ok)
		}
	}
}
