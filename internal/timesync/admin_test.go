package timesync

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sled-agent/sled-agent/internal/openapitest"
)

// ntpAdminDoc is upstream's ntp-admin v2 document, omicron's
// openapi/ntp-admin/ntp-admin-2.0.0-f8d00a.json, expected in
// ../shared/upstream-api beside the other upstream documents.
const ntpAdminDoc = "ntp-admin-2.0.0.json"

// ntpAdmin validates answers against upstream's document.
type ntpAdmin struct{ spec *openapitest.Spec }

func loadNTPAdmin(t *testing.T) *ntpAdmin {
	t.Helper()
	if path := openapitest.UpstreamPath(t, ntpAdminDoc); !exists(path) {
		t.Skipf("upstream's ntp-admin document is not at %s: omicron's openapi/ntp-admin/ntp-admin-2.0.0-f8d00a.json belongs there", path)
	}
	spec := openapitest.Load(t, ntpAdminDoc)
	if v := spec.Doc().Info.Version; v != APIVersion {
		t.Fatalf("%s is version %s, want %s", ntpAdminDoc, v, APIVersion)
	}
	return &ntpAdmin{spec: spec}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// check validates one request and its answer.
func (s *ntpAdmin) check(t *testing.T, req *http.Request, rec *httptest.ResponseRecorder) {
	t.Helper()
	x := openapitest.Exchange{Request: req, Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	if err := s.spec.Check(x); err != nil {
		t.Fatalf("answer %d %s is not upstream's: %v", rec.Code, rec.Body, err)
	}
}

// fakeTracker answers as scripted and counts the asks. With hang set, it
// ignores its ctx and blocks until release is closed.
type fakeTracker struct {
	mu      sync.Mutex
	line    string
	err     error
	hang    bool
	release chan struct{}
	asks    int
}

func (f *fakeTracker) Tracking(ctx context.Context) (string, error) {
	f.mu.Lock()
	f.asks++
	line, err, hang, release := f.line, f.err, f.hang, f.release
	f.mu.Unlock()
	if hang {
		<-release
		return "", errors.New("released")
	}
	return line, err
}

func (f *fakeTracker) set(line string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.line, f.err = line, err
}

func get(t *testing.T, h http.Handler, method, path string, header http.Header) (*http.Request, *httptest.ResponseRecorder) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return req, rec
}

var v2 = http.Header{"Api-Version": {APIVersion}}

func TestTimesyncAnswersUpstreamsShape(t *testing.T) {
	spec := loadNTPAdmin(t)
	for _, line := range []string{recSyncedV4, recSyncedV6, recLocal8, recUnsynced, editUnsynced00, editMaxError} {
		tr, _ := ParseTracking(line)
		h := NewHandler(&fakeTracker{line: line + "\n"}, HandlerOptions{})
		req, rec := get(t, h, "GET", "/timesync", v2)
		if rec.Code != http.StatusOK {
			t.Fatalf("%q: %d %s", line, rec.Code, rec.Body)
		}
		spec.check(t, req, rec)
		var got TimeSync
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if want := tr.TimeSync(); got != want {
			t.Fatalf("%q:\ngot  %+v\nwant %+v", line, got, want)
		}
	}
}

// TestTimesyncFieldsAreUpstreams holds the body to upstream's v2 field
// names and JSON types even where the document is not at hand.
func TestTimesyncFieldsAreUpstreams(t *testing.T) {
	h := NewHandler(&fakeTracker{line: recUnsynced}, HandlerOptions{})
	_, rec := get(t, h, "GET", "/timesync", nil) // no api-version: served too
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"sync": "bool", "ref_id": "number", "ip_addr": "string", "stratum": "number", "ref_time": "number",
		"correction": "number", "last_offset": "number", "rms_offset": "number", "root_delay": "number",
		"root_dispersion": "number", "max_error": "number",
	}
	for k, v := range body {
		var kind string
		switch v.(type) {
		case bool:
			kind = "bool"
		case float64:
			kind = "number"
		case string:
			kind = "string"
		}
		if want[k] != kind {
			t.Errorf("field %s = %v (a %s); upstream's: %s", k, v, kind, cmpOr(want[k], "no such field"))
		}
	}
	for k := range want {
		if _, ok := body[k]; !ok {
			t.Errorf("no field %s", k)
		}
	}
	if body["ip_addr"] != "::" || body["sync"] != false {
		t.Errorf("unsynchronized: %s", rec.Body)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestTimesyncErrorsAre500sWithAMessage(t *testing.T) {
	spec := loadNTPAdmin(t)
	for _, tc := range []struct {
		name, line string
		err        error
		want       string
	}{
		{name: "chronyc fails", err: errors.New("506 Cannot talk to daemon"), want: "chronyc tracking failed: 506 Cannot talk to daemon"},
		{name: "an unreadable line", line: "7F000001,127.0.0.1,x,1796123851.011532821,0,0,0,0,0,0,0,0,0.3,Normal", want: `failed to parse chronyc tracking output: chronyc tracking line "7F000001,127.0.0.1,x,`},
		{name: "too few fields", line: "506 Cannot talk to daemon", want: "1 fields, want at least 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(&fakeTracker{line: tc.line, err: tc.err}, HandlerOptions{})
			req, rec := get(t, h, "GET", "/timesync", v2)
			if rec.Code != http.StatusInternalServerError {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			spec.check(t, req, rec)
			var e errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.RequestID == "" || e.ErrorCode != "Internal" {
				t.Fatalf("error body %s (%v)", rec.Body, err)
			}
			if !strings.Contains(e.Message, tc.want) {
				t.Fatalf("message %q does not say %q", e.Message, tc.want)
			}
		})
	}
}

func TestTimesyncDoesNotWaitForAHangingTracker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeTracker{hang: true, release: make(chan struct{})}
		defer close(f.release)
		h := NewHandler(f, HandlerOptions{Timeout: 3 * time.Second})
		start := time.Now()
		_, rec := get(t, h, "GET", "/timesync", v2)
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("answered after %v, want the 3s timeout", waited)
		}
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "chronyc tracking gave no answer within 3s") {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
}

func TestTimesyncRefusesOtherVersionsAndOperations(t *testing.T) {
	spec := loadNTPAdmin(t)
	h := NewHandler(&fakeTracker{line: recSyncedV4}, HandlerOptions{})
	for _, v := range []string{"1.0.0", "3.0.0", "2"} {
		req, rec := get(t, h, "GET", "/timesync", http.Header{"Api-Version": {v}})
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "this server serves only 2.0.0") {
			t.Fatalf("api-version %s: %d %s", v, rec.Code, rec.Body)
		}
		spec.check(t, req, rec)
	}
	_, rec := get(t, h, "GET", "/timesync", http.Header{"Api-Version": {"2.0.0", "2.0.0"}})
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("two api-version headers: %d %s", rec.Code, rec.Body)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/timesync", http.StatusMethodNotAllowed},
		{"GET", "/timesync/x", http.StatusNotFound},
		{"GET", "/", http.StatusNotFound},
	} {
		_, rec := get(t, h, tc.method, tc.path, v2)
		var e errorBody
		if rec.Code != tc.status || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Message == "" {
			t.Errorf("%s %s: %d %s, want %d with an error body", tc.method, tc.path, rec.Code, rec.Body, tc.status)
		}
	}
	if _, rec := get(t, h, "POST", "/timesync", nil); !slices.Equal(rec.Header().Values("Allow"), []string{"GET, HEAD"}) {
		t.Errorf("Allow %q", rec.Header().Values("Allow"))
	}
}
