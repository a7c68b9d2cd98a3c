package api

import (
	"fmt"
	"mime"
	"net/http"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// dropshotErrors answers what the mux would answer in text/plain as
// dropshot does, with its JSON Error body: a path no route serves is a 404,
// a method the path does not serve a 405 (with the mux's Allow header), and
// a request whose body is not JSON a 400. Before any of that, it bounds the
// request's body by its route (httpbound.Route): a body over the limit is a
// 413 naming it. Requests it passes on reach the mux unchanged but for their
// bounded body.
//
// Like dropshot, a body without a Content-Type header is read as JSON (its
// TypedBody takes a missing header for application/json), and media type
// parameters (charset) are ignored. Unlike dropshot, whose router-level
// messages are the bare reason phrases ("Not Found"), the messages name the
// method and path.
func dropshotErrors(mux *http.ServeMux, route func(pattern string) httpbound.Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		// The body is bounded before anything reads it; a Content-Length
		// over the limit is refused without reading a byte.
		if err := route(pattern).Apply(w, r); err != nil {
			r.Pattern = pattern // for the metrics
			st, msg := httpbound.Status(err)
			writeHandlerError(w, r, st, msg)
			return
		}
		if pattern == "" {
			// No route: h is the mux's 404 or 405 handler. Run it into a
			// recorder to learn which, and the methods it allows.
			rec := &headerRecorder{header: http.Header{}}
			h.ServeHTTP(rec, r)
			status := rec.status
			if status != http.StatusMethodNotAllowed {
				status = http.StatusNotFound
			}
			if allow := rec.header.Values("Allow"); len(allow) > 0 {
				w.Header()["Allow"] = allow
			}
			msg := fmt.Sprintf("Not Found: no operation at %s", r.URL.Path)
			if status == http.StatusMethodNotAllowed {
				msg = fmt.Sprintf("Method Not Allowed: %s is not an operation of %s", r.Method, r.URL.Path)
			}
			writeDropshotError(w, r, status, msg)
			return
		}
		if hasBody(r) {
			if err := checkJSONContentType(r.Header); err != nil {
				r.Pattern = pattern // for the metrics
				writeDropshotError(w, r, http.StatusBadRequest, err.Error())
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

// hasBody reports whether the request carries a body (of known or unknown
// length).
func hasBody(r *http.Request) bool {
	return r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
}

// checkJSONContentType accepts a missing Content-Type and application/json
// with any parameters, in any letter case.
func checkJSONContentType(h http.Header) error {
	values := h.Values("Content-Type")
	if len(values) == 0 {
		return nil
	}
	if len(values) > 1 {
		return fmt.Errorf("more than one Content-Type header: %q", values)
	}
	mt, _, err := mime.ParseMediaType(values[0])
	if err != nil {
		return fmt.Errorf("invalid content type %q: %v", values[0], err)
	}
	if mt != "application/json" {
		return fmt.Errorf(`expected content type "application/json", got %q`, mt)
	}
	return nil
}

// writeDropshotError writes an error that dropshot itself (not a handler)
// would answer: upstream's Error body without an error_code, which
// dropshot's router, body extractors and version policy do not set.
func writeDropshotError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := jsonMarshal(&Error{RequestID: id, Message: msg})
	w.Write(b)
}

// writeHandlerError writes an error as a handler would: upstream's Error
// body with its error_code.
func writeHandlerError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := jsonMarshal(&Error{RequestID: id, ErrorCode: errorCode(status), Message: msg})
	w.Write(b)
}

// headerRecorder keeps the status and headers a handler writes and drops
// its body.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header { return h.header }

func (h *headerRecorder) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}

func (h *headerRecorder) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return len(b), nil
}
