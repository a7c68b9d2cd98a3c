// Package client talks to a sled agent's HTTP API, for the operator commands,
// the development mode and the benchmarks.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// Client is a sled agent API client. Every call has a deadline: the caller's,
// or Timeout when the caller's context has none.
type Client struct {
	base    string
	http    *http.Client
	Timeout time.Duration
}

// New returns a client for the agent at baseURL (e.g. http://[::1]:12345).
func New(baseURL string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("agent URL %q: want http://host:port", baseURL)
	}
	return &Client{base: u.String(), http: &http.Client{}, Timeout: 30 * time.Second}, nil
}

// APIError is an error answer from the agent.
type APIError struct {
	Status int
	Body   api.Error
}

func (e *APIError) Error() string {
	if e.Body.Message == "" {
		return fmt.Sprintf("agent answered %d", e.Status)
	}
	return fmt.Sprintf("agent answered %d: %s", e.Status, e.Body.Message)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("api-version", api.Version)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var buf []byte // what the answer is read into: a raw body's own, if it has one
	if raw, ok := out.(*rawBody); ok {
		buf = (*raw)[:0]
	}
	data, err := readBody(resp, buf)
	if err != nil {
		return fmt.Errorf("%s %s: reading answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		e := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, &e.Body) != nil {
			e.Body.Message = string(bytes.TrimSpace(data))
		}
		return e
	}
	if raw, ok := out.(*rawBody); ok {
		*raw = data
		return nil
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}

// rawBody receives an answer's bytes as they came, without decoding (for
// documents of a megabyte, decoding into a json.RawMessage would scan them).
type rawBody []byte

// maxAnswerBytes bounds an answer read into memory.
const maxAnswerBytes = 256 << 20

// readBody reads an answer into buf, grown once to its announced length when
// it has one (a large sled's inventory is megabytes) and buf is too small.
func readBody(resp *http.Response, buf []byte) ([]byte, error) {
	body := io.LimitReader(resp.Body, maxAnswerBytes)
	if n := resp.ContentLength; n > 0 && n <= maxAnswerBytes {
		b := bytes.NewBuffer(buf[:0])
		b.Grow(int(n) + 1) // +1: ReadFrom wants room to see the end
		_, err := b.ReadFrom(body)
		return b.Bytes(), err
	}
	b := bytes.NewBuffer(buf[:0])
	_, err := b.ReadFrom(body)
	return b.Bytes(), err
}

// PutConfig puts a sled config document.
func (c *Client) PutConfig(ctx context.Context, doc []byte) error {
	return c.do(ctx, http.MethodPut, "/omicron-config", doc, nil)
}

// Inventory fetches upstream's inventory (GET /inventory).
func (c *Client) Inventory(ctx context.Context) (*api.Inventory, error) {
	var inv api.Inventory
	return &inv, c.do(ctx, http.MethodGet, "/inventory", nil, &inv)
}

// InventoryRaw fetches upstream's inventory as the agent sent it, undecoded.
func (c *Client) InventoryRaw(ctx context.Context) (json.RawMessage, error) {
	return c.InventoryRawInto(ctx, nil)
}

// InventoryRawInto is InventoryRaw read into buf's storage when it has room
// (its contents are overwritten): a caller that asks again and again, as a
// benchmark does, then allocates nothing per answer, and its collector's
// work is not counted as the agent's.
func (c *Client) InventoryRawInto(ctx context.Context, buf []byte) (json.RawMessage, error) {
	raw := rawBody(buf)
	if err := c.do(ctx, http.MethodGet, "/inventory", nil, &raw); err != nil {
		return nil, err
	}
	return json.RawMessage(raw), nil
}

// AgentInventory fetches the agent's own view (GET /agent/inventory): ledger
// copies, every zone's state, VMMs, NAT, DDM, restore.
func (c *Client) AgentInventory(ctx context.Context) (*api.AgentInventory, error) {
	var inv api.AgentInventory
	return &inv, c.do(ctx, http.MethodGet, "/agent/inventory", nil, &inv)
}

// AgentInventoryRaw fetches the agent's own view as the agent sent it,
// undecoded.
func (c *Client) AgentInventoryRaw(ctx context.Context) (json.RawMessage, error) {
	var raw rawBody
	if err := c.do(ctx, http.MethodGet, "/agent/inventory", nil, &raw); err != nil {
		return nil, err
	}
	return json.RawMessage(raw), nil
}

// SledIdentifiers fetches the sled's identifiers (GET /sled-identifiers).
func (c *Client) SledIdentifiers(ctx context.Context) (*api.SledIdentifiers, error) {
	var ids api.SledIdentifiers
	return &ids, c.do(ctx, http.MethodGet, "/sled-identifiers", nil, &ids)
}

// Zones lists the running zones.
func (c *Client) Zones(ctx context.Context) ([]string, error) {
	var names []string
	return names, c.do(ctx, http.MethodGet, "/zones", nil, &names)
}

// Restore fetches what the agent found at start-up and did about it.
func (c *Client) Restore(ctx context.Context) (*reconciler.RestoreStatus, error) {
	var out reconciler.RestoreStatus
	return &out, c.do(ctx, http.MethodGet, "/agent/restore", nil, &out)
}

// ZoneStates fetches every zone's status.
func (c *Client) ZoneStates(ctx context.Context) ([]api.ZoneSummary, error) {
	var out []api.ZoneSummary
	return out, c.do(ctx, http.MethodGet, "/agent/zones", nil, &out)
}

// Zone fetches one zone's status and history, by name or id.
func (c *Client) Zone(ctx context.Context, nameOrID string) (*api.ZoneDetail, error) {
	var out api.ZoneDetail
	return &out, c.do(ctx, http.MethodGet, "/agent/zones/"+url.PathEscape(nameOrID), nil, &out)
}

// RemoveUnknownVMM tears down the zone of a VMM of which the agent has no
// readable record (POST /agent/vmms/{id}/remove-unknown).
func (c *Client) RemoveUnknownVMM(ctx context.Context, id string) (*vmm.Info, error) {
	var out vmm.Info
	return &out, c.do(ctx, http.MethodPost, "/agent/vmms/"+url.PathEscape(id)+"/remove-unknown", nil, &out)
}

// RegisterVMM registers VMM id with body, an InstanceEnsureBody (PUT
// /vmms/{id}).
func (c *Client) RegisterVMM(ctx context.Context, id string, body []byte) (*api.SledVmmState, error) {
	var out api.SledVmmState
	return &out, c.do(ctx, http.MethodPut, "/vmms/"+url.PathEscape(id), body, &out)
}

// VMMPage fetches one page of the VMMs (GET /agent/vmms): after the page
// whose next_page was token ("" for the first), at most limit (0: the
// agent's default).
func (c *Client) VMMPage(ctx context.Context, token string, limit int) (*api.VMMPage, error) {
	q := url.Values{}
	if token != "" {
		q.Set("page_token", token)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/agent/vmms"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.VMMPage
	return &out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// VMMs fetches every VMM, following next_page to the last page; each page
// has its own deadline.
func (c *Client) VMMs(ctx context.Context) ([]vmm.Info, error) {
	var all []vmm.Info
	token := ""
	for {
		p, err := c.VMMPage(ctx, token, api.MaxVMMPage)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Items...)
		if p.NextPage == nil || len(p.Items) == 0 {
			return all, nil
		}
		token = *p.NextPage
	}
}

// PutVMMState asks VMM id's guest to be running, stopped or to reboot (PUT
// /vmms/{id}/state).
func (c *Client) PutVMMState(ctx context.Context, id, state string) (*api.VmmPutStateResponse, error) {
	body, err := json.Marshal(map[string]any{"state": map[string]string{"type": state}})
	if err != nil {
		return nil, err
	}
	var out api.VmmPutStateResponse
	return &out, c.do(ctx, http.MethodPut, "/vmms/"+url.PathEscape(id)+"/state", body, &out)
}

// UnregisterVMM unregisters VMM id and tears its zone down (DELETE
// /vmms/{id}).
func (c *Client) UnregisterVMM(ctx context.Context, id string) (*api.VmmUnregisterResponse, error) {
	var out api.VmmUnregisterResponse
	return &out, c.do(ctx, http.MethodDelete, "/vmms/"+url.PathEscape(id), nil, &out)
}

// SetSimFaults replaces the sim runtime's fault map.
func (c *Client) SetSimFaults(ctx context.Context, doc []byte) error {
	return c.do(ctx, http.MethodPut, "/debug/sim/faults", doc, nil)
}

// IsStatus reports whether err is an API error with the given status.
func IsStatus(err error, status int) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == status
}
