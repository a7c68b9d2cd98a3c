package propolisapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
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
var ErrUnreachable = errors.New("propolis-server unreachable")

// APIError is a non-2xx answer from propolis-server. It matches the
// package's errors by status, as the server sends them: 424 ErrNoInstance,
// 409 ErrConflict, 403 ErrInvalidTransition, 501 ErrUnsupported. Its
// fields are dropshot.APIError's.
type APIError dropshot.APIError

func (e *APIError) Error() string { return "propolis-server " + (*dropshot.APIError)(e).Error() }

// Is matches the package's errors by status.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNoInstance:
		return e.StatusCode == http.StatusFailedDependency
	case ErrConflict:
		return e.StatusCode == http.StatusConflict
	case ErrInvalidTransition:
		return e.StatusCode == http.StatusForbidden
	case ErrUnsupported:
		return e.StatusCode == http.StatusNotImplemented
	}
	return false
}

// Client is the sled agent's client of one propolis-server. It is safe for
// concurrent use.
type Client struct {
	// Timeout bounds every call: a call runs until the earlier of its
	// context's deadline and Timeout from its start (for StateMonitor,
	// MonitorWait plus Timeout; for a serial console, its handshake and
	// every message of input). Zero means DefaultTimeout. Set it before
	// the first call.
	Timeout time.Duration

	addr string
	api  *dropshot.Client
	// api5 speaks Version5, to a service that predates APIVersion (a VMM
	// service an earlier agent started, adopted after an upgrade); older
	// is set once such a service refused APIVersion.
	api5  *dropshot.Client
	older atomic.Bool
	err   error // why addr makes no client; every call returns it
}

// NewClient returns a client of the propolis-server at addr, host:port (an
// IPv6 host in brackets). It keeps no connections: a VMM's zone may vanish
// or be replaced at the same address at any moment.
func NewClient(addr string) *Client {
	cfg := dropshot.Config{
		Name:        "propolis-server",
		APIVersion:  APIVersion,
		Unreachable: ErrUnreachable,
		NoKeepAlive: true,
		NoRedirects: true,
		LongPoll:    MonitorWait,
	}
	api, err := dropshot.NewClient("http://"+addr, cfg)
	if err != nil {
		return &Client{addr: addr, err: err}
	}
	cfg.APIVersion = Version5
	api5, err := dropshot.NewClient("http://"+addr, cfg)
	return &Client{addr: addr, api: api, api5: api5, err: err}
}

func (c *Client) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// do sends one request; a non-2xx answer is an *APIError.
func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, query url.Values, in, out any) error {
	if c.err != nil {
		return c.err
	}
	if c.older.Load() {
		return c.result(c.api5.Do(ctx, timeout, method, path, query, in, out))
	}
	err := c.api.Do(ctx, timeout, method, path, query, in, out)
	if e, ok := errors.AsType[*dropshot.APIError](err); ok && e.StatusCode == http.StatusBadRequest && method == http.MethodGet {
		// A request with nothing in it but its api-version refused: a
		// service that predates APIVersion (started by an earlier agent
		// and adopted after an upgrade; its guest must not be failed for
		// it). It is spoken to in Version5 from now on; what it is
		// asked changes nothing in that version.
		if err5 := c.api5.Do(ctx, timeout, method, path, query, in, out); !isBadRequest(err5) {
			c.older.Store(true)
			return c.result(err5)
		}
	}
	return c.result(err)
}

// result is err as the package returns it: a non-2xx answer an *APIError.
func (c *Client) result(err error) error {
	if e, ok := errors.AsType[*dropshot.APIError](err); ok {
		return (*APIError)(e)
	}
	return err
}

func isBadRequest(err error) bool {
	e, ok := errors.AsType[*dropshot.APIError](err)
	return ok && e.StatusCode == http.StatusBadRequest
}

// Ensure creates the instance from spec, an InstanceSpec object, with
// init method Spec. Ensuring it again with the same properties and spec
// succeeds; other ones are an *APIError matching ErrConflict, and a spec
// the server cannot realise a 400.
func (c *Client) Ensure(ctx context.Context, props Properties, spec json.RawMessage) error {
	req := ensureRequest{Properties: props, Init: initSpec{Method: "Spec"}}
	req.Init.Value.Spec = spec
	var resp ensureResponse
	return c.do(ctx, c.timeout(), http.MethodPut, "/instance", nil, req, &resp)
}

// Instance is an instance's properties and state.
type Instance struct {
	Properties Properties
	State      InstanceState
}

// Get returns the instance; before Ensure, an *APIError matching
// ErrNoInstance.
func (c *Client) Get(ctx context.Context) (Instance, error) {
	var resp getResponse
	if err := c.do(ctx, c.timeout(), http.MethodGet, "/instance", nil, nil, &resp); err != nil {
		return Instance{}, err
	}
	if !resp.Instance.State.Valid() {
		return Instance{}, fmt.Errorf("propolis-server GET /instance: answer has no valid state: %q", resp.Instance.State)
	}
	return Instance{Properties: resp.Instance.Properties, State: resp.Instance.State}, nil
}

// InstanceWithSpec is an instance with its spec. Spec is nil while a migration
// target waits for its source's spec.
type InstanceWithSpec struct {
	Properties Properties
	State      InstanceState
	Spec       json.RawMessage
}

// Spec returns the instance with its spec.
func (c *Client) Spec(ctx context.Context) (InstanceWithSpec, error) {
	var resp specResponse
	if err := c.do(ctx, c.timeout(), http.MethodGet, "/instance/spec", nil, nil, &resp); err != nil {
		return InstanceWithSpec{}, err
	}
	out := InstanceWithSpec{Properties: resp.Properties, State: resp.State}
	switch resp.Spec.Type {
	case "Present":
		out.Spec = resp.Spec.Value
	case "WaitingForMigrationSource":
	default:
		return InstanceWithSpec{}, fmt.Errorf("propolis-server GET /instance/spec: unknown spec status %q", resp.Spec.Type)
	}
	return out, nil
}

// StateMonitor long-polls the instance's status: it returns as soon as
// the status's generation is at least gen, as upstream's clients ask with
// the last generation they saw plus one; a generation below gen means the
// server's wait ended first (MonitorWait) and nothing changed. gen 0
// returns the current status at once. The call lasts at most MonitorWait
// plus Timeout.
func (c *Client) StateMonitor(ctx context.Context, gen uint64) (Status, error) {
	var resp monitorResponse
	if err := c.do(ctx, MonitorWait+c.timeout(), http.MethodGet, "/instance/state-monitor", nil, monitorRequest{Gen: &gen}, &resp); err != nil {
		return Status{}, err
	}
	if resp.Gen == 0 || !resp.State.Valid() {
		return Status{}, fmt.Errorf("propolis-server GET /instance/state-monitor: answer is not a status: gen %d, state %q", resp.Gen, resp.State)
	}
	return Status{Gen: resp.Gen, State: resp.State, Detail: resp.Detail}, nil
}

// PutState asks the instance to run, stop or reboot; a change its state
// does not allow is an *APIError matching ErrInvalidTransition.
func (c *Client) PutState(ctx context.Context, r StateRequest) error {
	return c.do(ctx, c.timeout(), http.MethodPut, "/instance/state", nil, r, nil)
}

// NMI injects a non-maskable interrupt; one the VM cannot take is an
// *APIError matching ErrUnsupported.
func (c *Client) NMI(ctx context.Context) error {
	return c.do(ctx, c.timeout(), http.MethodPost, "/instance/nmi", nil, nil, nil)
}

// SerialOffset is where serial console output is read from: an absolute
// offset (SerialFromStart) or a count of bytes back from the end
// (SerialMostRecent). The zero value is neither: a console connection then
// sends only new output.
type SerialOffset struct {
	set        bool
	mostRecent bool
	n          uint64
}

// SerialFromStart is the output from absolute offset n, counted from the
// VMM's start.
func SerialFromStart(n uint64) SerialOffset { return SerialOffset{set: true, n: n} }

// SerialMostRecent is the output from n bytes before its end.
func SerialMostRecent(n uint64) SerialOffset {
	return SerialOffset{set: true, mostRecent: true, n: n}
}

func (o SerialOffset) query() url.Values {
	q := url.Values{}
	switch {
	case !o.set:
	case o.mostRecent:
		q.Set("most_recent", strconv.FormatUint(o.n, 10))
	default:
		q.Set("from_start", strconv.FormatUint(o.n, 10))
	}
	return q
}

// SerialHistory returns up to maxBytes of the console's output from off
// (the server's default of 16 KiB when maxBytes ≤ 0) and the absolute
// offset one past the last byte returned. Output no longer held is a 400.
func (c *Client) SerialHistory(ctx context.Context, off SerialOffset, maxBytes int) (data []byte, end uint64, err error) {
	if !off.set {
		return nil, 0, errors.New("propolis-server serial history: want SerialFromStart or SerialMostRecent")
	}
	q := off.query()
	if maxBytes > 0 {
		q.Set("max_bytes", strconv.Itoa(maxBytes))
	}
	var resp historyResponse
	if err := c.do(ctx, c.timeout(), http.MethodGet, "/instance/serial/history", q, nil, &resp); err != nil {
		return nil, 0, err
	}
	return resp.Data, resp.LastByteOffset, nil
}
