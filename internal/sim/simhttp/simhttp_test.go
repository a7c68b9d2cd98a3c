package simhttp_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp/simhttptest"
)

var errClosed = errors.New("closed")

// store is the test daemon's state: the keys PUT /store/{k} added.
type store struct {
	mu   sync.Mutex
	keys []string
}

func (st *store) add(k string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.keys = append(st.keys, k)
}

func (st *store) list() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.keys)
}

func (st *store) forget() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.keys = nil
}

// config is the test daemon: newest api-version 1.2.3, GET and DELETE
// /things/{ip}, GET /things/{ip}/static and PUT /store/{k}, and no control
// endpoints of its own.
func config() (simhttp.Config, *store) {
	st := &store{}
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
	api.Handle("PUT /store/{k}", func(rp *simhttp.Reply, r *http.Request) {
		st.add(r.PathValue("k"))
		rp.NoContent()
	})
	return simhttp.Config{Name: "test", APIVersion: "1.2.3", ErrClosed: errClosed, API: api, Forget: st.forget}, st
}

func start(t *testing.T) (*simhttp.Server, *store) {
	t.Helper()
	cfg, st := config()
	s := simhttp.New(cfg)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, st
}

// do sends an API request with the right version.
func do(t *testing.T, method, url string) simhttptest.Answer {
	t.Helper()
	return simhttptest.Do(t, method, url, "1.2.3", "", "")
}

func TestRouter(t *testing.T) {
	s, _ := start(t)
	if a := do(t, "GET", s.URL()+"/things/a%2Fb"); a.Status != 200 || !strings.Contains(a.Body, `"ip":"a/b"`) {
		t.Errorf("escaped slash: %d %s, want one segment a/b", a.Status, a.Body)
	}
	if a := do(t, "GET", s.URL()+"/things/x/static"); a.Status != 200 || !strings.Contains(a.Body, `"ip":"x"`) {
		t.Errorf("longer route: %d %s", a.Status, a.Body)
	}
	if a := do(t, "DELETE", s.URL()+"/things/x"); a.Status != 204 {
		t.Errorf("DELETE: %d %s (Conn must be set)", a.Status, a.Body)
	}
	for _, tt := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"PUT", "/things/x", 405, "GET, DELETE"},
		{"HEAD", "/things/x", 405, "GET, DELETE"},
		{"DELETE", "/things/x/static", 405, "GET"},
		{"GET", "/things/", 404, ""},
		{"GET", "/things", 404, ""},
		{"GET", "/things/x/other", 404, ""},
	} {
		a := do(t, tt.method, s.URL()+tt.path)
		if a.Status != tt.status || a.Header.Get("Allow") != tt.allow {
			t.Errorf("%s %s = %d, Allow %q; want %d, Allow %q", tt.method, tt.path, a.Status, a.Header.Get("Allow"), tt.status, tt.allow)
			continue
		}
		if tt.method != "HEAD" { // a HEAD answer has no body
			simhttptest.CheckErrorBody(t, a)
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

func TestWithoutControlRouterOrForgetFaultAndRestartAreServed(t *testing.T) {
	s := simhttp.New(simhttp.Config{Name: "bare", APIVersion: "1.0.0", ErrClosed: errClosed})
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if a := simhttptest.Do(t, "GET", s.URL()+"/__sim/state", "", "", ""); a.Status != 404 {
		t.Errorf("GET /__sim/state: %d, want 404", a.Status)
	}
	if a := simhttptest.Do(t, "PUT", s.URL()+"/__sim/fault", "", "", `{"fault":"error"}`); a.Status != 204 || s.Fault() != simhttp.FaultError {
		t.Errorf("PUT /__sim/fault: %d, fault %q", a.Status, s.Fault())
	}
	if a := simhttptest.Do(t, "POST", s.URL()+"/__sim/restart-empty", "", "", ""); a.Status != 204 {
		t.Errorf("POST /__sim/restart-empty: %d %s", a.Status, a.Body)
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
