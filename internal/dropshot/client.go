// Package dropshot is a client of an upstream dropshot server: api-version
// header, upstream error bodies, deadlines, typed errors.
package dropshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultTimeout bounds every call whose timeout is zero.
const DefaultTimeout = 5 * time.Second

const (
	// dialTimeout and responseHeaderTimeout are backstops under the
	// per-call deadline; a longer timeout does not extend them.
	dialTimeout           = 3 * time.Second
	responseHeaderTimeout = 30 * time.Second
	// maxAnswerBytes caps what is read of an answer.
	maxAnswerBytes = 16 << 20
	// snippetBytes is how much of an unexpected error body an APIError keeps.
	snippetBytes = 256
)

// Config is what a Client knows of the API it speaks and how its errors
// read.
type Config struct {
	// Name names the server at the start of every error: "ddm", "dpd".
	Name string
	// APIVersion is sent in the api-version header of every request.
	APIVersion string
	// Unversioned says that the API has no versions: no api-version
	// header is sent, and APIVersion is empty.
	Unversioned bool
	// Unreachable is wrapped by every error where no complete HTTP answer
	// came back: connection refused or reset, DNS failure, dial or
	// response timeouts and the call's deadline. The underlying error
	// stays in the chain, so errors.Is(err, context.DeadlineExceeded)
	// works too. A call cancelled by its caller (context.Canceled) does
	// not wrap it.
	Unreachable error
	// NoKeepAlive makes every call use a new connection, closed after
	// its answer: for a server that may vanish, or be replaced by another
	// at the same address, at any moment.
	NoKeepAlive bool
	// NoRedirects answers a redirect as an *APIError instead of
	// following it.
	NoRedirects bool
	// LongPoll is the longest the server holds a request on purpose
	// before it answers (a long poll): the backstop on waiting for an
	// answer's headers is extended by it.
	LongPoll time.Duration
}

// Client sends requests to one dropshot server. It is safe for concurrent
// use.
type Client struct {
	cfg  Config
	base string // scheme://host[/path], no trailing slash
	http *http.Client
}

// NewClient returns a client for the server at baseURL, e.g.
// "http://[::1]:8000".
func NewClient(baseURL string, cfg Config) (*Client, error) {
	if cfg.Name == "" || (cfg.APIVersion == "") != cfg.Unversioned || cfg.Unreachable == nil {
		return nil, errors.New("dropshot: the config needs a Name, an APIVersion or Unversioned, and an Unreachable error")
	}
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s URL %q: %w", cfg.Name, baseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%s URL %q: scheme %q is not http or https", cfg.Name, baseURL, u.Scheme)
	case u.Host == "":
		return nil, fmt.Errorf("%s URL %q: no host", cfg.Name, baseURL)
	case u.User != nil:
		return nil, fmt.Errorf("%s URL %q: user info is not supported", cfg.Name, baseURL)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%s URL %q: a query or fragment is not supported", cfg.Name, baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	tr := &http.Transport{
		// The servers are local daemons or on the rack's underlay: never
		// go through a proxy.
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout + max(cfg.LongPoll, 0),
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		DisableKeepAlives:     cfg.NoKeepAlive,
	}
	hc := &http.Client{Transport: tr}
	if cfg.NoRedirects {
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	return &Client{cfg: cfg, base: u.String(), http: hc}, nil
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Do sends one request and decodes a 2xx answer into out, when out is not
// nil. The query, when not empty, is added to path; in, when not nil, is
// sent as a JSON body. The call runs until the earlier of ctx's deadline
// and timeout from its start; a timeout of zero or less means
// DefaultTimeout.
//
// A non-2xx answer is returned as a *APIError, not wrapped, for the caller
// to convert to its own error type. Every other error names the server,
// and those where no complete answer came back wrap Config.Unreachable.
func (c *Client) Do(ctx context.Context, timeout time.Duration, method, path string, query url.Values, in, out any) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s %s: %w", c.cfg.Name, method, path, err)
		}
		body = bytes.NewReader(b)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(callCtx, method, u, body)
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", c.cfg.Name, method, path, err)
	}
	if !c.cfg.Unversioned {
		req.Header.Set("api-version", c.cfg.APIVersion)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if method == http.MethodPut || method == http.MethodDelete {
		// PUT and DELETE are idempotent: let the transport retry them on
		// a kept-alive connection that turns out to be dead (as after the
		// server restarts). A nil value is not sent on the wire.
		req.Header["Idempotency-Key"] = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return c.noAnswer(ctx, err) // a *url.Error: it names the method and URL
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return c.noAnswer(ctx, fmt.Errorf("%s %s: reading answer: %w", method, path, err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return newAPIError(method, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s %s: decoding answer: %w", c.cfg.Name, method, path, err)
	}
	return nil
}

// noAnswer wraps a failure to get a complete answer. The caller's own
// cancellation is reported as such, not as the server being unreachable.
func (c *Client) noAnswer(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("%s: %w", c.cfg.Name, err)
	}
	return fmt.Errorf("%w: %w", c.cfg.Unreachable, err)
}

// APIError is a non-2xx answer. Clients convert it to a type of their own
// (type APIError dropshot.APIError) whose Error names the server.
type APIError struct {
	// Method and Path name the request that was refused (Path without
	// its query).
	Method, Path string
	StatusCode   int
	// RequestID, ErrorCode and Message come from the upstream error body;
	// when the body is not one, Message holds a snippet of it (empty when
	// the body was).
	RequestID, ErrorCode, Message string
}

// Error is "METHOD path: status text[: message][ (error_code …)][
// (request_id …)]", without the server's name.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.ErrorCode != "" {
		fmt.Fprintf(&b, " (error_code %s)", e.ErrorCode)
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, " (request_id %s)", e.RequestID)
	}
	return b.String()
}

// ClientError reports whether the server refused the request itself (4xx).
func (e *APIError) ClientError() bool { return e.StatusCode >= 400 && e.StatusCode < 500 }

// ServerError reports whether the server failed to carry out the request
// (5xx).
func (e *APIError) ServerError() bool { return e.StatusCode >= 500 && e.StatusCode < 600 }

// errorBody is the upstream error body.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code"`
	Message   string `json:"message"`
}

func newAPIError(method, path string, status int, data []byte) *APIError {
	e := &APIError{Method: method, Path: path, StatusCode: status}
	var b errorBody
	if json.Unmarshal(data, &b) == nil && (b.Message != "" || b.RequestID != "") {
		e.RequestID, e.ErrorCode, e.Message = b.RequestID, b.ErrorCode, b.Message
		return e
	}
	e.Message = snippet(data)
	return e
}

// snippet is the start of an unexpected body, on one line.
func snippet(data []byte) string {
	cut := len(data) > snippetBytes
	if cut {
		data = data[:snippetBytes]
	}
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(data), "")), " ")
	if cut {
		s += "…"
	}
	return s
}
