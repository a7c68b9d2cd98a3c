package propolis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sled-agent/sled-agent/internal/dropshot"
)

// DefaultTimeout bounds every call whose Client.Timeout is zero.
const DefaultTimeout = dropshot.DefaultTimeout

// ErrUnreachable is wrapped by every error where no complete HTTP answer
// came back: connection refused or reset, a dial or read failure, and the
// call's deadline. The cause stays in the chain, so errors.Is(err,
// context.DeadlineExceeded) works too. A call cancelled by its caller
// (context.Canceled) is not ErrUnreachable.
var ErrUnreachable = errors.New("vmm service unreachable")

// APIError is a non-2xx answer from the VMM service. A 409 is a refused
// transition: errors.Is(err, ErrInvalidTransition) holds for it. Its
// fields are those of dropshot.APIError: Method and Path name the request
// that was refused; RequestID, ErrorCode and Message come from the error
// body, or Message holds a snippet of a body that is not one.
type APIError dropshot.APIError

func (e *APIError) Error() string { return "vmm service " + (*dropshot.APIError)(e).Error() }

// Is makes a 409 match ErrInvalidTransition.
func (e *APIError) Is(target error) bool {
	return target == ErrInvalidTransition && e.StatusCode == http.StatusConflict
}

// Client talks to the VMM service of one VMM zone. It is safe for
// concurrent use.
type Client struct {
	// Timeout bounds every call: a call runs until the earlier of its
	// context's deadline and Timeout from its start (for WaitChange, wait
	// plus Timeout). Zero means DefaultTimeout. Set it before the first
	// call.
	Timeout time.Duration

	api *dropshot.Client
	err error // why addr makes no client; every call returns it
}

// NewClient returns a client for the VMM service at addr, host:port (an
// IPv6 host in brackets).
//
// The client keeps no connections: a VMM's zone may vanish or be replaced
// at the same address at any moment, and a fresh connection per call means
// no stale one is ever reused and nothing is left behind when a VMM goes.
func NewClient(addr string) *Client {
	api, err := dropshot.NewClient("http://"+addr, dropshot.Config{
		Name:        "vmm service",
		Unversioned: true,
		Unreachable: ErrUnreachable,
		NoKeepAlive: true,
		NoRedirects: true,
		LongPoll:    MaxWait,
	})
	return &Client{Timeout: DefaultTimeout, api: api, err: err}
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
	// The query stays in the path, so that an APIError names it.
	path := "/state?after_gen=" + strconv.FormatUint(afterGen, 10) + "&wait=" + wait.String()
	return c.do(ctx, http.MethodGet, path, nil, wait+c.timeout())
}

// Request asks the guest to reach r and returns its status once the
// request is taken (the transition completes later). A refused transition
// is an *APIError matching ErrInvalidTransition.
func (c *Client) Request(ctx context.Context, r Request) (Status, error) {
	return c.do(ctx, http.MethodPut, "/state", putStateBody{State: r}, c.timeout())
}

func (c *Client) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// do sends one request under a deadline of timeout and decodes a status
// from the answer.
func (c *Client) do(ctx context.Context, method, path string, in any, timeout time.Duration) (Status, error) {
	if c.err != nil {
		return Status{}, c.err
	}
	var st Status
	if err := c.api.Do(ctx, timeout, method, path, nil, in, &st); err != nil {
		if e, ok := errors.AsType[*dropshot.APIError](err); ok {
			return Status{}, (*APIError)(e)
		}
		return Status{}, err
	}
	if st.Gen == 0 || st.State == "" {
		return Status{}, fmt.Errorf("vmm service %s %s: answer is not a status: gen %d, state %q", method, path, st.Gen, st.State)
	}
	return st, nil
}
