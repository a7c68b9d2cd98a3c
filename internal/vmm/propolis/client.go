package propolis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds every call whose Client.Timeout is zero.
const DefaultTimeout = 5 * time.Second

const (
	// dialTimeout is a backstop under the per-call deadline.
	dialTimeout = 3 * time.Second
	// maxAnswerBytes caps what is read of an answer.
	maxAnswerBytes = 1 << 20
	// snippetBytes is how much of an unexpected error body an APIError keeps.
	snippetBytes = 256
)

// ErrUnreachable is wrapped by every error where no complete HTTP answer
// came back: connection refused or reset, a dial or read failure, and the
// call's deadline. The cause stays in the chain, so errors.Is(err,
// context.DeadlineExceeded) works too. A call cancelled by its caller
// (context.Canceled) is not ErrUnreachable.
var ErrUnreachable = errors.New("vmm service unreachable")

// APIError is a non-2xx answer from the VMM service. A 409 is a refused
// transition: errors.Is(err, ErrInvalidTransition) holds for it.
type APIError struct {
	// Method and Path name the request that was refused.
	Method, Path string
	StatusCode   int
	// RequestID, ErrorCode and Message come from the error body; when the
	// body is not one, Message holds a snippet of it.
	RequestID, ErrorCode, Message string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vmm service %s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, " (request_id %s)", e.RequestID)
	}
	return b.String()
}

// Is makes a 409 match ErrInvalidTransition.
func (e *APIError) Is(target error) bool {
	return target == ErrInvalidTransition && e.StatusCode == http.StatusConflict
}

// httpClient keeps no connections: a VMM's zone may vanish or be replaced
// at the same address at any moment, and a fresh connection per call means
// no stale one is ever reused and nothing is left behind when a VMM goes.
// No proxy stands between the agent and its zones.
var httpClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{Timeout: dialTimeout}).DialContext,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Client talks to the VMM service of one VMM zone. It is safe for
// concurrent use.
type Client struct {
	// Timeout bounds every call: a call runs until the earlier of its
	// context's deadline and Timeout from its start (for WaitChange, wait
	// plus Timeout). Zero means DefaultTimeout. Set it before the first
	// call.
	Timeout time.Duration

	base string // http://host:port
}

// NewClient returns a client for the VMM service at addr, host:port (an
// IPv6 host in brackets).
func NewClient(addr string) *Client {
	return &Client{Timeout: DefaultTimeout, base: "http://" + addr}
}

// Status returns the guest's current status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.do(ctx, http.MethodGet, "/state", nil, c.timeout())
}

// WaitChange long-polls the guest: it returns as soon as the status has a
// generation greater than afterGen, or the current status when wait ends;
// callers compare generations. A generation lower than afterGen means the
// service is another incarnation than the one that reported afterGen. wait
// of zero or less means DefaultWait; more than MaxWait means MaxWait. The
// call never lasts longer than wait plus Timeout.
func (c *Client) WaitChange(ctx context.Context, afterGen uint64, wait time.Duration) (Status, error) {
	if wait <= 0 {
		wait = DefaultWait
	}
	wait = min(wait, MaxWait)
	path := "/state?after_gen=" + strconv.FormatUint(afterGen, 10) + "&wait=" + wait.String()
	return c.do(ctx, http.MethodGet, path, nil, wait+c.timeout())
}

// Request asks the guest to reach r and returns its status once the
// request is taken (the transition completes later). A refused transition
// is an *APIError matching ErrInvalidTransition.
func (c *Client) Request(ctx context.Context, r Request) (Status, error) {
	body, err := json.Marshal(putStateBody{State: r})
	if err != nil {
		return Status{}, fmt.Errorf("vmm service PUT /state: %w", err)
	}
	return c.do(ctx, http.MethodPut, "/state", body, c.timeout())
}

func (c *Client) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// do sends one request under a deadline of timeout and decodes a 200
// answer.
func (c *Client) do(ctx context.Context, method, path string, body []byte, timeout time.Duration) (Status, error) {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(callCtx, method, c.base+path, rd)
	if err != nil {
		return Status{}, fmt.Errorf("vmm service %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return Status{}, noAnswer(ctx, err) // a *url.Error: it names the method and URL
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return Status{}, noAnswer(ctx, fmt.Errorf("%s %s: reading answer: %w", method, path, err))
	}
	if resp.StatusCode != http.StatusOK {
		return Status{}, newAPIError(method, path, resp.StatusCode, data)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return Status{}, fmt.Errorf("vmm service %s %s: decoding answer: %w", method, path, err)
	}
	if st.Gen == 0 || st.State == "" {
		return Status{}, fmt.Errorf("vmm service %s %s: answer %q is not a status", method, path, snippet(data))
	}
	return st, nil
}

// noAnswer wraps a failure to get a complete answer. The caller's own
// cancellation is reported as such, not as the service being unreachable.
func noAnswer(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("vmm service: %w", err)
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
