// Package ddm is a client of the DDM admin API (maghemite's ddmd), through
// which the agent advertises and withdraws the sled's underlay prefixes and
// learns the tunnel endpoints (boundary services) the rack originates.
package ddm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/dropshot"
)

// APIVersion is the DDM admin API version this client speaks; it is sent in
// the api-version header of every request.
const APIVersion = "2.0.0"

// DefaultTimeout bounds every call whose Client.Timeout is zero.
const DefaultTimeout = dropshot.DefaultTimeout

// ErrUnreachable is wrapped by every error where no complete HTTP answer came
// back: connection refused or reset, DNS failure, dial or response timeouts
// and the call's deadline. The underlying error stays in the chain, so
// errors.Is(err, context.DeadlineExceeded) works too. A call cancelled by its
// caller (context.Canceled) is not ErrUnreachable.
var ErrUnreachable = errors.New("ddm unreachable")

// APIError is a non-2xx answer from DDM. Its fields are those of
// dropshot.APIError: Method and Path name the request that was refused;
// RequestID, ErrorCode and Message come from the upstream error body, or
// Message holds a snippet of a body that is not one.
type APIError dropshot.APIError

func (e *APIError) Error() string { return "ddm " + (*dropshot.APIError)(e).Error() }

// ClientError reports whether DDM refused the request itself (4xx).
func (e *APIError) ClientError() bool { return (*dropshot.APIError)(e).ClientError() }

// ServerError reports whether DDM failed to carry out the request (5xx).
func (e *APIError) ServerError() bool { return (*dropshot.APIError)(e).ServerError() }

// Client talks to one ddmd's admin API. It is safe for concurrent use.
type Client struct {
	// Timeout bounds every call: a call runs until the earlier of its
	// context's deadline and Timeout from its start. Zero means
	// DefaultTimeout. Set it before the first call.
	Timeout time.Duration

	api *dropshot.Client
}

// NewClient returns a client for the DDM admin API at baseURL, e.g.
// "http://[::1]:8000".
func NewClient(baseURL string) (*Client, error) {
	api, err := dropshot.NewClient(baseURL, dropshot.Config{Name: "ddm", APIVersion: APIVersion, Unreachable: ErrUnreachable})
	if err != nil {
		return nil, err
	}
	return &Client{Timeout: DefaultTimeout, api: api}, nil
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.api.CloseIdleConnections() }

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
	return c.do(ctx, method, "/prefix", strs, nil)
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
// into out (when out is not nil). in, when not nil, is the JSON body.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	err := c.api.Do(ctx, c.Timeout, method, path, nil, in, out)
	if e, ok := errors.AsType[*dropshot.APIError](err); ok {
		return (*APIError)(e)
	}
	return err
}
