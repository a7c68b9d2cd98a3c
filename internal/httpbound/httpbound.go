// Package httpbound bounds what an HTTP server holds for a client: header and idle time, each route's body size and read time, and the number of connections.
package httpbound

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// Server defaults. There is no ReadTimeout or WriteTimeout: ReadTimeout is
// one deadline for every route (a 16 MiB config and a 30-byte request
// alike), so bodies get theirs per route instead (Route); WriteTimeout
// counts from the request, so it would cut the answer of a long poll (the
// propolis state monitor) that waits longer.
const (
	// ReadHeaderTimeout bounds reading a request's line and headers.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout bounds how long a kept-alive connection waits for its
	// next request.
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes bounds a request's line and headers (net/http's
	// default is 1 MiB; no client of ours sends more than a few hundred
	// bytes).
	MaxHeaderBytes = 64 << 10
)

// Body sizes and read times for routes.
const (
	// SmallBody bounds the body of an operation that takes none (GET,
	// DELETE), as dropshot's default request_body_max_bytes does.
	SmallBody = 1 << 10
	// ReadTimeout bounds reading a small body: enough for a megabyte at
	// a slow link's speed.
	ReadTimeout = 10 * time.Second
)

// NewServer returns a server for h with the bounds above, which tells a
// Listener which connections are being served. Callers set the fields of
// their own (ErrorLog, BaseContext) on the result, and chain ConnState and
// ConnContext to the ones set here.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         connState,
		ConnContext:       connContext,
	}
}

// Route is what one route may be sent: at most MaxBodyBytes of body, read
// within ReadTimeout of the handler starting.
type Route struct {
	MaxBodyBytes int64
	ReadTimeout  time.Duration
}

// Small is the Route of an operation that takes no body.
var Small = Sized(SmallBody)

// Sized is the Route of a body of at most n bytes: ReadTimeout, and two
// more seconds for each MiB (half a megabyte a second, a slow link's pace).
func Sized(n int64) Route {
	return Route{MaxBodyBytes: n, ReadTimeout: ReadTimeout + time.Duration(n>>20)*2*time.Second}
}

// Valid reports whether rt bounds both size and time.
func (rt Route) Valid() bool { return rt.MaxBodyBytes >= 0 && rt.ReadTimeout > 0 }

// Doc is the sentence that documents rt in an operation's description.
func (rt Route) Doc() string {
	return fmt.Sprintf("A request body over %d bytes is refused with 413; the body must arrive within %s.", rt.MaxBodyBytes, rt.ReadTimeout)
}

// TooLargeMessage is the message of a 413 for a body over limit (dropshot's
// words).
func TooLargeMessage(limit int64) string {
	return fmt.Sprintf("request body exceeded maximum size of %d bytes", limit)
}

// TimeoutMessage is the message of a 408 for a body that did not arrive in
// time.
const TimeoutMessage = "request body not received in time"

// TooLargeError is the error Apply returns for a request whose Content-Length
// is over the route's limit; its message names the limit.
type TooLargeError struct{ Limit int64 }

func (e *TooLargeError) Error() string { return TooLargeMessage(e.Limit) }

// Apply bounds r's body by rt. A Content-Length over the limit is refused
// before anything of the body is read: Apply returns *TooLargeError, and the
// caller answers 413 (Status says with what); nothing more is read from the
// connection, which closes after the answer. Otherwise the body must arrive
// within rt.ReadTimeout, and reading past the limit (a body of unknown
// length, chunked) fails with *http.MaxBytesError. A request without a body
// gets no deadline: there is nothing to read. The connection counts as
// served (Listener) once the request is in.
func (rt Route) Apply(w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength > rt.MaxBodyBytes {
		StopReading(w)
		return &TooLargeError{Limit: rt.MaxBodyBytes}
	}
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		served(r)
		return nil
	}
	rc := http.NewResponseController(w)
	// A writer without deadlines (a test's recorder) reads without one.
	_ = rc.SetReadDeadline(time.Now().Add(rt.ReadTimeout))
	r.Body = &body{rc: rc, rd: http.MaxBytesReader(w, r.Body, rt.MaxBodyBytes), r: r}
	return nil
}

// Handler is h behind rt: Apply, with a refusal answered by fail (413 and a
// message naming the limit) in the server's own error shape.
func (rt Route) Handler(h http.Handler, fail func(w http.ResponseWriter, status int, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rt.Apply(w, r); err != nil {
			st, msg := Status(err)
			fail(w, st, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// StopReading makes sure nothing more is read from w's connection after an
// answer written without reading the request's body: net/http would
// otherwise read up to 256 KiB of it, at whatever pace the client sends.
func StopReading(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(longAgo)
}

var longAgo = time.Unix(1, 0)

// body is a request body under a Route's bounds.
type body struct {
	rc  *http.ResponseController
	rd  io.ReadCloser
	r   *http.Request
	err error // the first failure, EOF aside
	eof bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rd.Read(p)
	if err == io.EOF && !b.eof {
		b.eof = true
		served(b.r) // the request is in
	}
	if err != nil && err != io.EOF && b.err == nil {
		// Over the limit or past the deadline: nothing more is read from
		// this connection, not even what net/http would read after the
		// answer to reuse it. (At EOF net/http lifts the deadline itself,
		// before its background read, so long handlers are not cut.)
		b.err = err
		_ = b.rc.SetReadDeadline(longAgo)
	}
	return n, err
}

func (b *body) Close() error { return b.rd.Close() }

// Failure is what cut r's body, bounded by Apply: *http.MaxBytesError, a
// timeout, or another read error; nil if nothing did. It lets a server
// whose handlers answer any body failure 400 answer Status's instead.
func Failure(r *http.Request) error {
	if b, ok := r.Body.(*body); ok {
		return b.err
	}
	return nil
}

// Status is the answer to err, an error reading a bounded body: 413 over the
// limit, 408 past the deadline, with a message naming which; 0 for any other
// error.
func Status(err error) (int, string) {
	var tl *http.MaxBytesError
	var ttl *TooLargeError
	switch {
	case errors.As(err, &tl):
		return http.StatusRequestEntityTooLarge, TooLargeMessage(tl.Limit)
	case errors.As(err, &ttl):
		return http.StatusRequestEntityTooLarge, ttl.Error()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return http.StatusRequestTimeout, TimeoutMessage
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return http.StatusRequestTimeout, TimeoutMessage
	}
	return 0, ""
}
