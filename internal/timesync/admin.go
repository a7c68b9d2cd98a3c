package timesync

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// AdminPort is ntp-admin's port on an NTP zone's underlay address
// (upstream's NTP_ADMIN_PORT).
const AdminPort = 10123

// APIVersion is the version of upstream's NTP admin API that /timesync
// speaks (openapi/ntp-admin/ntp-admin-2.0.0-*.json in omicron).
const APIVersion = "2.0.0"

// DefaultTrackingTimeout bounds one ask for the tracking report. It is
// shorter than the watcher's default request deadline, so that a watcher
// sees this server's message, not its own timeout.
const DefaultTrackingTimeout = 1500 * time.Millisecond

// TimeSync is the body of GET /timesync: upstream's ntp-admin v2 TimeSync.
type TimeSync struct {
	// Sync is the rule's verdict (Tracking.Synced).
	Sync    bool       `json:"sync"`
	RefID   uint32     `json:"ref_id"`
	IPAddr  netip.Addr `json:"ip_addr"`
	Stratum uint8      `json:"stratum"`
	RefTime float64    `json:"ref_time"`
	// Correction and the rest are seconds.
	Correction     float64 `json:"correction"`
	LastOffset     float64 `json:"last_offset"`
	RMSOffset      float64 `json:"rms_offset"`
	RootDelay      float64 `json:"root_delay"`
	RootDispersion float64 `json:"root_dispersion"`
	MaxError       float64 `json:"max_error"`
}

// TimeSync is the report /timesync answers for t.
func (t Tracking) TimeSync() TimeSync {
	sync, _ := t.Synced()
	return TimeSync{
		Sync: sync, RefID: t.RefID, IPAddr: t.IPAddr, Stratum: t.Stratum, RefTime: t.RefTime,
		Correction: t.Correction, LastOffset: t.LastOffset, RMSOffset: t.RMSOffset,
		RootDelay: t.RootDelay, RootDispersion: t.RootDispersion, MaxError: t.MaxError(),
	}
}

// Tracking is the report t carries, for the rule's reasons on the host.
func (t TimeSync) Tracking() Tracking {
	tr := Tracking{
		RefID: t.RefID, IPAddr: t.IPAddr, Stratum: t.Stratum, RefTime: t.RefTime,
		Correction: t.Correction, LastOffset: t.LastOffset, RMSOffset: t.RMSOffset,
		RootDelay: t.RootDelay, RootDispersion: t.RootDispersion,
	}
	if tr.hasAddr() {
		tr.RefName = t.IPAddr.String()
	}
	return tr
}

// Tracker gives one line of `chronyc -c tracking` (the NTP zone's chronyd).
// It should give up when ctx ends; the handler does not wait for it longer.
type Tracker interface {
	Tracking(ctx context.Context) (string, error)
}

// HandlerOptions set the handler up. Zero values take the defaults.
type HandlerOptions struct {
	// Timeout bounds each ask for the tracking report
	// (DefaultTrackingTimeout).
	Timeout time.Duration
	Log     *slog.Logger
	// BodyReadTimeout bounds reading a request's body (httpbound.Small's;
	// tests shorten it).
	BodyReadTimeout time.Duration
}

// NewHandler returns ntp-admin's HTTP API: GET /timesync answers the
// tracker's report as a TimeSync, with the rule's verdict in sync. A
// tracker that fails, hangs past the timeout or gives a line that cannot
// be read is a 500 with upstream's error body and a message saying which;
// the answer never waits longer than the timeout.
//
// Versions: a request without an api-version header, or with 2.0.0, is
// served. Upstream's server also serves 1.x requests, in v1's shape (v2
// without last_offset, rms_offset, root_delay, root_dispersion and
// max_error); this one answers them 400, as our sled-agent API answers
// versions other than its own: the agent is its only client.
//
// No operation takes a body: one over httpbound.SmallBody is a 413, and a
// body must arrive within its deadline.
func NewHandler(tr Tracker, opts HandlerOptions) http.Handler {
	h := &handler{tracker: tr, timeout: cmp.Or(opts.Timeout, DefaultTrackingTimeout), log: opts.Log}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /timesync", h.timesync)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/timesync" {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("Method Not Allowed: %s is not an operation of /timesync", r.Method))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("Not Found: no operation at %s", r.URL.Path))
	})
	rt := httpbound.Small
	if opts.BodyReadTimeout > 0 {
		rt.ReadTimeout = opts.BodyReadTimeout
	}
	return rt.Handler(mux, writeError)
}

type handler struct {
	tracker Tracker
	timeout time.Duration
	log     *slog.Logger
}

func (h *handler) timesync(w http.ResponseWriter, r *http.Request) {
	switch v := r.Header.Values("api-version"); {
	case len(v) > 1:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad value for header \"api-version\": %d values; send one, %s", len(v), APIVersion))
		return
	case len(v) == 1 && v[0] != APIVersion:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("server does not support this API version: %q; this server serves only %s", v[0], APIVersion))
		return
	}
	line, err := h.tracking(r.Context())
	if err != nil {
		h.log.Warn("timesync: no tracking report", "err", err)
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	t, err := ParseTracking(line)
	if err != nil {
		h.log.Warn("timesync: unreadable tracking report", "err", err)
		writeError(w, http.StatusInternalServerError, "failed to parse chronyc tracking output: "+err.Error())
		return
	}
	b, err := json.Marshal(t.TimeSync())
	if err != nil { // not reached: ParseTracking keeps every number finite
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// tracking asks the tracker under the timeout, and stops waiting for it at
// the timeout even if it does not heed its ctx.
func (h *handler) tracking(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	type answer struct {
		line string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		line, err := h.tracker.Tracking(ctx)
		done <- answer{line, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			return "", fmt.Errorf("chronyc tracking failed: %w", a.err)
		}
		return a.line, nil
	case <-ctx.Done():
		return "", fmt.Errorf("chronyc tracking gave no answer within %v: %w", h.timeout, ctx.Err())
	}
}

// errorBody is upstream's (dropshot's) error body.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	code := ""
	switch {
	case status == http.StatusBadRequest:
		code = "InvalidRequest"
	case status == http.StatusNotFound:
		code = "ObjectNotFound"
	case status == http.StatusRequestEntityTooLarge:
		code = "PayloadTooLarge"
	case status >= 500:
		code = "Internal"
	}
	id := uuid.NewString()
	b, _ := json.Marshal(errorBody{RequestID: id, ErrorCode: code, Message: msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("x-request-id", id)
	w.WriteHeader(status)
	w.Write(b)
}
