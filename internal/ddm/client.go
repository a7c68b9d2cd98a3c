// Package ddm is a client of the DDM admin API (maghemite's ddmd), through
// which the agent advertises and withdraws the sled's underlay prefixes.
package ddm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// APIVersion is the DDM admin API version this client speaks; it is sent in
// the api-version header of every request.
const APIVersion = "2.0.0"

// DefaultTimeout bounds every call whose Client.Timeout is zero.
const DefaultTimeout = 5 * time.Second

const (
	// dialTimeout and responseHeaderTimeout are backstops under the
	// per-call deadline; a Timeout longer than them does not extend them.
	dialTimeout           = 3 * time.Second
	responseHeaderTimeout = 30 * time.Second
	// maxAnswerBytes caps what is read of an answer.
	maxAnswerBytes = 16 << 20
	// snippetBytes is how much of an unexpected error body an APIError keeps.
	snippetBytes = 256
)

// ErrUnreachable is wrapped by every error where no complete HTTP answer came
// back: connection refused or reset, DNS failure, dial or response timeouts
// and the call's deadline. The underlying error stays in the chain, so
// errors.Is(err, context.DeadlineExceeded) works too. A call cancelled by its
// caller (context.Canceled) is not ErrUnreachable.
var ErrUnreachable = errors.New("ddm unreachable")

// APIError is a non-2xx answer from DDM.
type APIError struct {
	// Method and Path name the request that was refused.
	Method, Path string
	StatusCode   int
	// RequestID, ErrorCode and Message come from the upstream error body;
	// when the body is not one, Message holds a snippet of it (or the status
	// text when it was empty).
	RequestID, ErrorCode, Message string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ddm %s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
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

// ClientError reports whether DDM refused the request itself (4xx).
func (e *APIError) ClientError() bool { return e.StatusCode >= 400 && e.StatusCode < 500 }

// ServerError reports whether DDM failed to carry out the request (5xx).
func (e *APIError) ServerError() bool { return e.StatusCode >= 500 && e.StatusCode < 600 }

// errorBody is the upstream error body.
type errorBody struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code"`
	Message   string `json:"message"`
}

// Client talks to one ddmd's admin API. It is safe for concurrent use.
type Client struct {
	// Timeout bounds every call: a call runs until the earlier of its
	// context's deadline and Timeout from its start. Zero means
	// DefaultTimeout. Set it before the first call.
	Timeout time.Duration

	base string // scheme://host[/path], no trailing slash
	http *http.Client
}

// NewClient returns a client for the DDM admin API at baseURL, e.g.
// "http://[::1]:8000".
func NewClient(baseURL string) (*Client, error) {
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("ddm URL %q: %w", baseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("ddm URL %q: scheme %q is not http or https", baseURL, u.Scheme)
	case u.Host == "":
		return nil, fmt.Errorf("ddm URL %q: no host", baseURL)
	case u.User != nil:
		return nil, fmt.Errorf("ddm URL %q: user info is not supported", baseURL)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("ddm URL %q: a query or fragment is not supported", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	tr := &http.Transport{
		Proxy: nil, // ddmd is a local daemon: never go through a proxy
		DialContext: (&net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: responseHeaderTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	return &Client{
		Timeout: DefaultTimeout,
		base:    u.String(),
		http:    &http.Client{Transport: tr},
	}, nil
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Originated returns the prefixes this DDM originates, exactly as DDM
// reports them: host bits are kept, not masked.
func (c *Client) Originated(ctx context.Context) ([]netip.Prefix, error) {
	var raw []string
	if err := c.do(ctx, http.MethodGet, "/originated", nil, &raw); err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(raw))
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("ddm GET /originated: entry %q: %w", s, err)
		}
		if !p.Addr().Is6() {
			return nil, fmt.Errorf("ddm GET /originated: entry %q is not an IPv6 prefix", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// Advertise asks DDM to originate prefixes. It is idempotent.
//
// Prefixes are sent exactly as given. DDM keys its entries by address bits
// and width without masking host bits, so fd00::1/64 and fd00::/64 are two
// different entries: callers normalise (netip.Prefix.Masked) before calling.
// A prefix that is not IPv6 fails the call before anything is sent; an empty
// slice sends nothing.
func (c *Client) Advertise(ctx context.Context, prefixes []netip.Prefix) error {
	return c.prefixCall(ctx, http.MethodPut, prefixes)
}

// Withdraw asks DDM to stop originating prefixes. It is idempotent:
// withdrawing a prefix DDM does not originate succeeds. The prefixes travel
// as a JSON body on the DELETE request. Prefixes are sent exactly as given,
// as with Advertise: withdrawing fd00::/64 leaves fd00::1/64 in place.
func (c *Client) Withdraw(ctx context.Context, prefixes []netip.Prefix) error {
	return c.prefixCall(ctx, http.MethodDelete, prefixes)
}

func (c *Client) prefixCall(ctx context.Context, method string, prefixes []netip.Prefix) error {
	if len(prefixes) == 0 {
		return nil
	}
	strs := make([]string, len(prefixes))
	for i, p := range prefixes {
		if !p.IsValid() || !p.Addr().Is6() || p.Addr().Zone() != "" {
			return fmt.Errorf("ddm %s /prefix: %q is not an IPv6 prefix", method, p)
		}
		strs[i] = p.String()
	}
	body, err := json.Marshal(strs)
	if err != nil {
		return fmt.Errorf("ddm %s /prefix: %w", method, err)
	}
	return c.do(ctx, method, "/prefix", body, nil)
}

// PeerInfo is what DDM knows of one peer.
type PeerInfo struct {
	Addr   string     `json:"addr"`
	Host   string     `json:"host"`
	Kind   RouterKind `json:"kind"`
	Status PeerStatus `json:"status"`
}

// RouterKind is a peer's role: 0 server (a sled), 1 transit (a switch).
type RouterKind int

const (
	RouterKindServer  RouterKind = 0
	RouterKindTransit RouterKind = 1
)

func (k RouterKind) String() string {
	switch k {
	case RouterKindServer:
		return "server"
	case RouterKindTransit:
		return "transit"
	}
	return "kind " + strconv.Itoa(int(k))
}

// UnmarshalJSON accepts the spec's integer and, leniently, the names
// "Server" and "Transit" in any case.
func (k *RouterKind) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		*k = RouterKind(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("router kind %s: want an integer or a name", b)
	}
	switch strings.ToLower(s) {
	case "server":
		*k = RouterKindServer
	case "transit":
		*k = RouterKindTransit
	default:
		return fmt.Errorf("router kind %q: unknown", s)
	}
	return nil
}

// PeerStatus is a peer's state (Init, Solicit, Exchange, Expired) and how
// long it has been in it.
type PeerStatus struct {
	Type     string   `json:"type"`
	Duration Duration `json:"duration"`
}

// Duration is the upstream {secs, nanos} duration.
type Duration struct {
	Secs  uint64 `json:"secs"`
	Nanos uint32 `json:"nanos"`
}

// Std converts d, saturating at the largest time.Duration.
func (d Duration) Std() time.Duration {
	const maxSecs = uint64(1<<63-1) / uint64(time.Second)
	if d.Secs >= maxSecs {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(d.Secs)*time.Second + time.Duration(d.Nanos)
}

// Peers returns DDM's peers, keyed as DDM keys them (an interface index).
func (c *Client) Peers(ctx context.Context) (map[string]PeerInfo, error) {
	out := map[string]PeerInfo{}
	if err := c.do(ctx, http.MethodGet, "/peers", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// PathVector is one imported route: a destination and the path of routers
// it was learned through.
type PathVector struct {
	Destination netip.Prefix `json:"destination"`
	Path        []string     `json:"path"`
}

// Prefixes returns the prefixes DDM imported from its peers, keyed by
// next hop.
func (c *Client) Prefixes(ctx context.Context) (map[string][]PathVector, error) {
	out := map[string][]PathVector{}
	if err := c.do(ctx, http.MethodGet, "/prefixes", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// do sends one request under the call's deadline and decodes a 2xx answer
// into out (when out is not nil).
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(callCtx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("ddm %s %s: %w", method, path, err)
	}
	req.Header.Set("api-version", APIVersion)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if method == http.MethodPut || method == http.MethodDelete {
		// Advertise and withdraw are idempotent: let the transport retry
		// them on a kept-alive connection that turns out to be dead (as
		// after a ddmd restart). A nil value is not sent on the wire.
		req.Header["Idempotency-Key"] = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return noAnswer(ctx, err) // a *url.Error: it names the method and URL
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return noAnswer(ctx, fmt.Errorf("%s %s: reading answer: %w", method, path, err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return newAPIError(method, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("ddm %s %s: decoding answer: %w", method, path, err)
	}
	return nil
}

// noAnswer wraps a failure to get a complete answer. The caller's own
// cancellation is reported as such, not as DDM being unreachable.
func noAnswer(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("ddm: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrUnreachable, err)
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
