// Package dpd is a client of dendrite's dpd NAT API, through which the
// agent maps its service zones' external addresses to the sled on the
// rack's switches.
package dpd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/dropshot"
)

// APIVersion is the dpd API version this client speaks; it is sent in the
// api-version header of every request.
const APIVersion = "12.0.0"

// DefaultTimeout bounds every request whose Client.Timeout is zero.
const DefaultTimeout = dropshot.DefaultTimeout

// MaxVNI is the largest Geneve VNI (24 bits).
const MaxVNI = 1<<24 - 1

// maxPages caps the pages one listing follows. It would take 65536
// single-port entries on one address served 16 a page to reach it: only a
// server that never ends a listing does.
const maxPages = 4096

var (
	// ErrUnreachable is wrapped by every error where no complete HTTP
	// answer came back: connection refused or reset, DNS failure, dial or
	// response timeouts and the request's deadline. The underlying error
	// stays in the chain, so errors.Is(err, context.DeadlineExceeded) works
	// too. A call cancelled by its caller (context.Canceled) is not
	// ErrUnreachable.
	ErrUnreachable = errors.New("dpd unreachable")
	// ErrConflict matches (errors.Is) an APIError of status 409: the NAT
	// entry overlaps another one on the same address ("conflicting
	// mapping").
	ErrConflict = errors.New("dpd: conflict")
	// ErrNotFound matches (errors.Is) an APIError of status 404: for
	// GetNAT, no entry covers the port.
	ErrNotFound = errors.New("dpd: not found")
)

// APIError is a non-2xx answer from dpd. errors.Is(err, ErrConflict) holds
// for a 409 and errors.Is(err, ErrNotFound) for a 404. Its fields are those
// of dropshot.APIError: Method and Path (without its query) name the
// request that was refused; RequestID, ErrorCode and Message come from the
// upstream error body, or Message holds a snippet of a body that is not one.
type APIError dropshot.APIError

func (e *APIError) Error() string { return "dpd " + (*dropshot.APIError)(e).Error() }

// Is makes a 409 match ErrConflict and a 404 match ErrNotFound.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrConflict:
		return e.StatusCode == http.StatusConflict
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	}
	return false
}

// ClientError reports whether dpd refused the request itself (4xx).
func (e *APIError) ClientError() bool { return (*dropshot.APIError)(e).ClientError() }

// ServerError reports whether dpd failed to carry out the request (5xx).
func (e *APIError) ServerError() bool { return (*dropshot.APIError)(e).ServerError() }

// MacAddr is an EUI-48 MAC address. In JSON it is what dpd speaks, an
// object holding the bytes: {"a":[168,64,37,255,128,5]}.
type MacAddr [6]byte

// ParseMAC parses the six colon-separated hex bytes of a sled config's
// MAC, "A8:40:25:FF:80:05", in either case.
func ParseMAC(s string) (MacAddr, error) {
	var m MacAddr
	parts := strings.Split(s, ":")
	if len(parts) != len(m) {
		return MacAddr{}, fmt.Errorf("MAC address %q: want six colon-separated hex bytes", s)
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 16, 8)
		if err != nil || len(p) != 2 {
			return MacAddr{}, fmt.Errorf("MAC address %q: byte %q is not two hex digits", s, p)
		}
		m[i] = byte(n)
	}
	return m, nil
}

// String is m as "a8:40:25:ff:80:05".
func (m MacAddr) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// MarshalJSON encodes m as {"a":[b0,b1,b2,b3,b4,b5]}.
func (m MacAddr) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"a":[%d,%d,%d,%d,%d,%d]}`, m[0], m[1], m[2], m[3], m[4], m[5]), nil
}

// UnmarshalJSON decodes {"a":[b0,…,b5]}: exactly six integers 0–255.
// Anything else, null and the string form included, is an error.
func (m *MacAddr) UnmarshalJSON(b []byte) error {
	var v struct {
		A []int `json:"a"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("MAC address %s: want {\"a\": [six bytes]}: %w", b, err)
	}
	if len(v.A) != len(m) {
		return fmt.Errorf("MAC address %s: want {\"a\": [six bytes]}", b)
	}
	var out MacAddr
	for i, n := range v.A {
		if n < 0 || n > 255 {
			return fmt.Errorf("MAC address %s: %d is not a byte", b, n)
		}
		out[i] = byte(n)
	}
	*m = out
	return nil
}

// NatTarget is where dpd sends traffic for an external address and port
// range: a sled's underlay address, the inner MAC and the VNI of the NIC
// behind it.
type NatTarget struct {
	InternalIP netip.Addr `json:"internal_ip"`
	InnerMAC   MacAddr    `json:"inner_mac"`
	VNI        uint32     `json:"vni"`
}

// NatEntry is one NAT mapping: an external address and an inclusive port
// range, IPv4 or IPv6 (dpd's Ipv4Nat and Ipv6Nat).
type NatEntry struct {
	External netip.Addr `json:"external"`
	Low      uint16     `json:"low"`
	High     uint16     `json:"high"`
	Target   NatTarget  `json:"target"`
}

// SwitchIdentifiers identifies the switch a dpd manages. dpd's optional
// hardware fields (fab, lot, wafer, fuse data…) are not decoded.
type SwitchIdentifiers struct {
	// SidecarID identifies the switch ASIC (a UUID).
	SidecarID string `json:"sidecar_id"`
	// Slot is the switch's slot in the rack: 0 or 1.
	Slot        uint16 `json:"slot"`
	Model       string `json:"model"`
	Serial      string `json:"serial"`
	AsicBackend string `json:"asic_backend"`
	Revision    uint32 `json:"revision"`
}

// Client talks to one dpd. It is safe for concurrent use.
type Client struct {
	// Timeout bounds every request: a request runs until the earlier of
	// its context's deadline and Timeout from its start. A listing that
	// takes several pages is bounded page by page. Zero means
	// DefaultTimeout. Set it before the first call.
	Timeout time.Duration

	api *dropshot.Client
}

// NewClient returns a client for the dpd API at baseURL, e.g.
// "http://[fd00:1122:3344:101::2]:12224".
func NewClient(baseURL string) (*Client, error) {
	api, err := dropshot.NewClient(baseURL, dropshot.Config{Name: "dpd", APIVersion: APIVersion, Unreachable: ErrUnreachable})
	if err != nil {
		return nil, err
	}
	return &Client{Timeout: DefaultTimeout, api: api}, nil
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.api.CloseIdleConnections() }

// natPath is "/nat/ipv4/<ip>" or "/nat/ipv6/<ip>" for an external address,
// by its family. An IPv4-mapped IPv6 address is refused: dpd would keep
// it in the IPv6 table, where no IPv4 packet ever looks.
func natPath(a netip.Addr) (string, error) {
	switch {
	case !a.IsValid():
		return "", errors.New("no external address")
	case a.Zone() != "":
		return "", fmt.Errorf("external address %s has a zone", a)
	case a.Is4():
		return "/nat/ipv4/" + a.String(), nil
	case a.Is4In6():
		return "", fmt.Errorf("external address %s is IPv4-mapped: use %s", a, a.Unmap())
	}
	return "/nat/ipv6/" + a.String(), nil
}

// CreateNAT adds e (PUT /nat/ipv{4,6}/{ip}/{low}/{high}). It is idempotent:
// adding an entry dpd already has, same range and same target, succeeds.
// An entry overlapping another one fails with an APIError matching
// ErrConflict. Invalid entries (low > high, an internal address that is not
// IPv6, a VNI over 24 bits) fail before anything is sent.
func (c *Client) CreateNAT(ctx context.Context, e NatEntry) error {
	p, err := natPath(e.External)
	if err != nil {
		return fmt.Errorf("dpd: creating NAT entry: %w", err)
	}
	path := fmt.Sprintf("%s/%d/%d", p, e.Low, e.High)
	t := e.Target
	switch {
	case e.Low > e.High:
		err = fmt.Errorf("port range %d-%d is empty", e.Low, e.High)
	case !t.InternalIP.Is6() || t.InternalIP.Zone() != "":
		err = fmt.Errorf("internal address %q is not an IPv6 address", t.InternalIP)
	case t.VNI > MaxVNI:
		err = fmt.Errorf("VNI %d is over 24 bits", t.VNI)
	}
	if err != nil {
		return fmt.Errorf("dpd PUT %s: %w", path, err)
	}
	return c.do(ctx, http.MethodPut, path, nil, t, nil)
}

// GetNAT returns the target of the entry on external whose port range
// holds low (GET /nat/ipv{4,6}/{ip}/{low}). When there is none, the error
// is an APIError matching ErrNotFound.
func (c *Client) GetNAT(ctx context.Context, external netip.Addr, low uint16) (NatTarget, error) {
	p, err := natPath(external)
	if err != nil {
		return NatTarget{}, fmt.Errorf("dpd: getting NAT entry: %w", err)
	}
	var t NatTarget
	if err := c.do(ctx, http.MethodGet, p+"/"+strconv.Itoa(int(low)), nil, nil, &t); err != nil {
		return NatTarget{}, err
	}
	return t, nil
}

// DeleteNAT removes the entry on external whose port range holds low
// (DELETE /nat/ipv{4,6}/{ip}/{low}). It is idempotent: deleting where there
// is no entry succeeds.
func (c *Client) DeleteNAT(ctx context.Context, external netip.Addr, low uint16) error {
	p, err := natPath(external)
	if err != nil {
		return fmt.Errorf("dpd: deleting NAT entry: %w", err)
	}
	return c.do(ctx, http.MethodDelete, p+"/"+strconv.Itoa(int(low)), nil, nil, nil)
}

// NATAddresses lists the external addresses with NAT entries, IPv6 ones
// when v6 and IPv4 ones otherwise (GET /nat/ipv{4,6}, every page).
func (c *Client) NATAddresses(ctx context.Context, v6 bool) ([]netip.Addr, error) {
	path := "/nat/ipv4"
	if v6 {
		path = "/nat/ipv6"
	}
	addrs, err := listAll[netip.Addr](ctx, c, path)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if !a.IsValid() || a.Is6() != v6 || a.Zone() != "" {
			return nil, fmt.Errorf("dpd GET %s: item %q is not an address of this family", path, a)
		}
	}
	return addrs, nil
}

// NATEntries lists the entries of one external address (GET
// /nat/ipv{4,6}/{ip}, every page), in dpd's order.
func (c *Client) NATEntries(ctx context.Context, external netip.Addr) ([]NatEntry, error) {
	path, err := natPath(external)
	if err != nil {
		return nil, fmt.Errorf("dpd: listing NAT entries: %w", err)
	}
	entries, err := listAll[NatEntry](ctx, c, path)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.External != external || e.Low > e.High || !e.Target.InternalIP.IsValid() {
			return nil, fmt.Errorf("dpd GET %s: item %+v is not an entry of %s", path, e, external)
		}
	}
	return entries, nil
}

// AllNAT lists every NAT entry, IPv4 then IPv6: the addresses of each
// family, then the entries of each address. It is not a snapshot: dpd may
// change between the requests.
func (c *Client) AllNAT(ctx context.Context) ([]NatEntry, error) {
	var out []NatEntry
	for _, v6 := range []bool{false, true} {
		addrs, err := c.NATAddresses(ctx, v6)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			entries, err := c.NATEntries(ctx, a)
			if err != nil {
				return nil, err
			}
			out = append(out, entries...)
		}
	}
	return out, nil
}

// SwitchIdentifiers returns the identifiers of dpd's switch (GET
// /switch/identifiers). dpd answers 503 (an APIError) until it knows them.
func (c *Client) SwitchIdentifiers(ctx context.Context) (SwitchIdentifiers, error) {
	var ids SwitchIdentifiers
	if err := c.do(ctx, http.MethodGet, "/switch/identifiers", nil, nil, &ids); err != nil {
		return SwitchIdentifiers{}, err
	}
	return ids, nil
}

// page is one page of a dropshot listing.
type page[T any] struct {
	Items    []T     `json:"items"`
	NextPage *string `json:"next_page"`
}

// listAll follows a listing's pages until one without a next page or
// without items.
func listAll[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	var out []T
	var query url.Values
	for range maxPages {
		var p page[T]
		if err := c.do(ctx, http.MethodGet, path, query, nil, &p); err != nil {
			return nil, err
		}
		out = append(out, p.Items...)
		if p.NextPage == nil || *p.NextPage == "" || len(p.Items) == 0 {
			return out, nil
		}
		query = url.Values{"page_token": {*p.NextPage}}
	}
	return nil, fmt.Errorf("dpd GET %s: the listing did not end within %d pages", path, maxPages)
}

// do sends one request under its deadline and decodes a 2xx answer into
// out (when out is not nil). in, when not nil, is the JSON body.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	err := c.api.Do(ctx, c.Timeout, method, path, query, in, out)
	if e, ok := errors.AsType[*dropshot.APIError](err); ok {
		return (*APIError)(e)
	}
	return err
}
