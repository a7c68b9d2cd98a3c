// Package nexus is how the sled speaks first to the control plane, over
// upstream's Nexus internal API 1.0.0 (omicron's nexus-internal): it finds
// Nexus in internal DNS, registers the sled and keeps that record current
// (Registrar, upstream's NexusNotifierTask in sled-agent/src/nexus.rs), and
// publishes every VMM state change (Publisher, upstream's
// publish_state_to_nexus in sled-agent/src/instance.rs).
//
// Nothing in the agent waits for Nexus: both run on their own goroutines,
// every request has a deadline, and a Nexus that is down, hangs or answers
// garbage costs only retries.
package nexus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/dropshot"
)

// APIVersion is the Nexus internal API version this client speaks; it is
// sent in the api-version header of every request, which Nexus requires.
const APIVersion = "1.0.0"

// Service is Nexus's internal API in internal DNS:
// SRV _nexus._tcp.control-plane.oxide.internal.
const Service = "nexus"

// DefaultTimeout bounds every request to one Nexus address whose
// Client.Timeout is zero. It is short: a VMM state waits for it before it
// is retried, and the next state's delivery must not wait long after a
// hung Nexus recovers.
const DefaultTimeout = 5 * time.Second

var (
	// ErrUnreachable is wrapped by every error where no Nexus gave a
	// complete answer: none found, connection refused, timeouts.
	ErrUnreachable = errors.New("nexus unreachable")
	// ErrNotFound matches (errors.Is) an APIError of status 404.
	ErrNotFound = errors.New("nexus: not found")
)

// APIError is a non-2xx answer from Nexus (see dropshot.APIError).
type APIError dropshot.APIError

func (e *APIError) Error() string { return "nexus " + (*dropshot.APIError)(e).Error() }

// Is makes a 404 match ErrNotFound.
func (e *APIError) Is(target error) bool {
	return target == ErrNotFound && e.StatusCode == http.StatusNotFound
}

// Permanent reports whether err is Nexus refusing the request itself (a
// 4xx): sending it again changes nothing. Everything else (no answer, a
// timeout, a 5xx, an answer that is not what the document says) is
// transient, as upstream treats it: Nexus flattens some transient failures
// into 500.
func Permanent(err error) bool {
	var e *APIError
	return errors.As(err, &e) && (*dropshot.APIError)(e).ClientError()
}

// Finder finds the addresses of Nexus's internal API.
type Finder interface {
	Find(ctx context.Context) ([]netip.AddrPort, error)
}

// Static is a fixed list of Nexus addresses (--nexus).
type Static []netip.AddrPort

// Find returns the list.
func (s Static) Find(context.Context) ([]netip.AddrPort, error) { return slices.Clone(s), nil }

// ServiceResolver looks a service's addresses up in internal DNS
// (*dns.Resolver).
type ServiceResolver interface {
	LookupService(ctx context.Context, service string) ([]netip.AddrPort, error)
}

// DNS finds Nexus through its SRV records, as upstream's agent does.
type DNS struct{ Resolver ServiceResolver }

// Find returns the targets of _nexus._tcp.
func (d DNS) Find(ctx context.Context) ([]netip.AddrPort, error) {
	return d.Resolver.LookupService(ctx, Service)
}

// Client sends requests to Nexus, wherever the Finder says it is: every
// address found is tried in turn, the one that last answered first. It is
// safe for concurrent use.
type Client struct {
	finder  Finder
	timeout time.Duration

	mu      sync.Mutex
	clients map[netip.AddrPort]*dropshot.Client
	last    netip.AddrPort // the address that last answered
}

// NewClient returns a client finding Nexus with f. timeout bounds each
// request to one address (0: DefaultTimeout).
func NewClient(f Finder, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Client{finder: f, timeout: timeout, clients: map[netip.AddrPort]*dropshot.Client{}}
}

// Last is the address that last answered (invalid when none has).
func (c *Client) Last() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// SledAgentInfo is upstream's: what a sled agent tells Nexus of itself.
type SledAgentInfo struct {
	SAAddress             string    `json:"sa_address"`
	RepoDepotPort         uint16    `json:"repo_depot_port"`
	Role                  string    `json:"role"`
	Baseboard             Baseboard `json:"baseboard"`
	CPUFamily             string    `json:"cpu_family"`
	UsableHardwareThreads uint32    `json:"usable_hardware_threads"`
	UsablePhysicalRAM     uint64    `json:"usable_physical_ram"`
	ReservoirSize         uint64    `json:"reservoir_size"`
	Generation            uint64    `json:"generation"`
	// Decommissioned is set only by Nexus; a sled agent sends false.
	Decommissioned bool `json:"decommissioned"`
}

// Baseboard is upstream's (nexus-internal's Baseboard).
type Baseboard struct {
	Serial   string `json:"serial"`
	Part     string `json:"part"`
	Revision uint32 `json:"revision"`
}

// sledAgentInfoRequired are SledAgentInfo's required members.
var sledAgentInfoRequired = []string{"baseboard", "cpu_family", "decommissioned", "generation", "repo_depot_port", "reservoir_size", "role", "sa_address", "usable_hardware_threads", "usable_physical_ram"}

// SledVmmState is upstream's: the sled's whole knowledge of a VMM's state.
// This agent does not migrate VMMs, so both migrations are always null.
type SledVmmState struct {
	VmmState     VmmRuntimeState `json:"vmm_state"`
	MigrationIn  *struct{}       `json:"migration_in"`
	MigrationOut *struct{}       `json:"migration_out"`
}

// VmmRuntimeState is upstream's.
type VmmRuntimeState struct {
	Gen         uint64    `json:"gen"`
	State       string    `json:"state"`
	TimeUpdated time.Time `json:"time_updated"`
}

// GetSled is sled_agent_get: the record Nexus holds of the sled. An error
// matching ErrNotFound means Nexus holds none. An answer that is not a
// whole SledAgentInfo is an error: it is never trusted.
func (c *Client) GetSled(ctx context.Context, sledID string) (SledAgentInfo, error) {
	var raw json.RawMessage
	path := "/sled-agents/" + sledID
	if err := c.do(ctx, http.MethodGet, path, nil, &raw); err != nil {
		return SledAgentInfo{}, err
	}
	var members map[string]json.RawMessage
	var info SledAgentInfo
	if err := json.Unmarshal(raw, &members); err != nil {
		return SledAgentInfo{}, fmt.Errorf("nexus GET %s: answer is not a SledAgentInfo: %w", path, err)
	}
	for _, k := range sledAgentInfoRequired {
		if _, ok := members[k]; !ok {
			return SledAgentInfo{}, fmt.Errorf("nexus GET %s: answer is not a SledAgentInfo: no %s", path, k)
		}
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		return SledAgentInfo{}, fmt.Errorf("nexus GET %s: answer is not a SledAgentInfo: %w", path, err)
	}
	return info, nil
}

// PutSled is sled_agent_put: the sled's record, at info.Generation.
func (c *Client) PutSled(ctx context.Context, sledID string, info SledAgentInfo) error {
	return c.do(ctx, http.MethodPost, "/sled-agents/"+sledID, info, nil)
}

// PutVMM is cpapi_instances_put: a VMM's state.
func (c *Client) PutVMM(ctx context.Context, propolisID string, st SledVmmState) error {
	return c.do(ctx, http.MethodPut, "/vmms/"+propolisID, st, nil)
}

// do sends one request to the first address that answers. An answer (2xx
// or not) ends the search; an address that gives none is passed over.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	fctx, cancel := context.WithTimeout(ctx, c.timeout)
	addrs, err := c.finder.Find(fctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: finding Nexus: %w", ErrUnreachable, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%w: no Nexus found (internal DNS names none, and no --nexus is given)", ErrUnreachable)
	}
	c.mu.Lock()
	last := c.last
	for a, api := range c.clients {
		if !slices.Contains(addrs, a) { // no longer Nexus
			api.CloseIdleConnections()
			delete(c.clients, a)
		}
	}
	c.mu.Unlock()
	if i := slices.Index(addrs, last); i > 0 {
		addrs[0], addrs[i] = addrs[i], addrs[0]
	}
	var errs []error
	for _, a := range addrs {
		api, err := c.client(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = api.Do(ctx, c.timeout, method, path, nil, in, out)
		var ae *dropshot.APIError
		if err == nil || errors.As(err, &ae) {
			c.mu.Lock()
			c.last = a
			c.mu.Unlock()
			if ae != nil {
				return (*APIError)(ae)
			}
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return fmt.Errorf("%w: no Nexus answered: %w", ErrUnreachable, errors.Join(errs...))
}

// client is the HTTP client of one address, made once.
func (c *Client) client(a netip.AddrPort) (*dropshot.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if api, ok := c.clients[a]; ok {
		return api, nil
	}
	api, err := dropshot.NewClient("http://"+a.String(), dropshot.Config{Name: "nexus", APIVersion: APIVersion, Unreachable: ErrUnreachable})
	if err != nil {
		return nil, err
	}
	c.clients[a] = api
	return api, nil
}
