package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// VMMs is the VMM manager (internal/vmm.Manager).
type VMMs interface {
	Register(id string, reg vmm.Registration) (vmm.Info, error)
	Get(id string) (vmm.Info, error)
	List() []vmm.Info
	Page(after string, limit int) ([]vmm.Info, bool)
	RequestState(ctx context.Context, id string, r vmm.Request) (vmm.Info, bool, error)
	Unregister(ctx context.Context, id string) (vmm.Info, error)
	RemoveUnknown(ctx context.Context, id string) (vmm.Info, error)
}

// MaxVMMBodyBytes bounds a VMM registration: upstream's largest are a
// cloud-init seed (user data up to 32 KiB, base64 in the spec) and the
// VPC's firewall rules (up to 1,024, a few hundred bytes each), well
// within a MiB.
const MaxVMMBodyBytes = 1 << 20

// VMM pages of GET /agent/vmms: how many VMMs one page holds by default
// and at most.
const (
	DefaultVMMPage = 20
	MaxVMMPage     = 100
)

// SledVmmState is upstream's: the sled's whole knowledge of a VMM's state.
// This agent does not migrate VMMs, so both migrations are always null.
type SledVmmState struct {
	VmmState     vmm.RuntimeState       `json:"vmm_state"`
	MigrationIn  *MigrationRuntimeState `json:"migration_in" doc:"Always null: this agent does not migrate VMMs."`
	MigrationOut *MigrationRuntimeState `json:"migration_out" doc:"Always null: this agent does not migrate VMMs."`
}

// MigrationRuntimeState is upstream's; never set by this agent.
type MigrationRuntimeState struct {
	Gen         uint64    `json:"gen"`
	MigrationID string    `json:"migration_id"`
	State       string    `json:"state"`
	TimeUpdated time.Time `json:"time_updated"`
}

// VmmPutStateResponse is upstream's.
type VmmPutStateResponse struct {
	UpdatedRuntime *SledVmmState `json:"updated_runtime" doc:"The VMM's state after the request; null when it changed nothing."`
}

// VmmUnregisterResponse is upstream's.
type VmmUnregisterResponse struct {
	UpdatedRuntime *SledVmmState `json:"updated_runtime" doc:"The VMM's state after it was unregistered."`
}

// InstanceEnsureBody is upstream's, as this agent reads it. The members it
// does not act on are required JSON objects, kept as sent (GET /agent/vmms);
// unknown members are accepted and kept too.
type InstanceEnsureBody struct {
	_            struct{}          `additionalProperties:"true"`
	InstanceID   *string           `json:"instance_id" format:"uuid" nullable:"false" doc:"The instance this VMM is created for."`
	MigrationID  *string           `json:"migration_id,omitempty" format:"uuid" nullable:"true" doc:"Not acted on: this agent does not migrate VMMs."`
	PropolisAddr *string           `json:"propolis_addr" nullable:"false" doc:"[ipv6]:port on the underlay at which the VMM serves its Propolis API."`
	VmmRuntime   *vmm.RuntimeState `json:"vmm_runtime" nullable:"false" doc:"The VMM's initial state."`
	LocalConfig  keptObject        `json:"local_config" doc:"Upstream's InstanceSledLocalConfig: its nics give each virtio NIC of the spec its MAC (by interface_id), its hostname names the instance; the rest is kept as sent."`
	Metadata     keptObject        `json:"metadata" doc:"Upstream's InstanceMetadata: its project_id and silo_id must be UUIDs, as upstream requires (they name the instance to its VMM service); the rest is kept as sent."`
	VmmSpec      keptObject        `json:"vmm_spec" doc:"Upstream's VmmSpec (propolis-server 6.0.0's InstanceSpec): the guest's board and components. A spec this sled cannot realise is refused (400), naming the component and why."`
}

// VmmPutStateBody is upstream's, as this agent reads it (unknown members
// are ignored).
type VmmPutStateBody struct {
	_     struct{}           `additionalProperties:"true"`
	State *VmmStateRequested `json:"state" nullable:"false"`
}

// VmmStateRequested is upstream's, without live migration.
type VmmStateRequested struct {
	_    struct{} `additionalProperties:"true"`
	Type string   `json:"type" enum:"running,stopped,reboot" doc:"Live migration (migration_target) is refused: this agent does not migrate VMMs."`
}

// keptObject is a JSON value this agent keeps as sent and does not
// interpret; parseRegistration checks that it is an object.
type keptObject json.RawMessage

func (k keptObject) MarshalJSON() ([]byte, error) { return json.RawMessage(k).MarshalJSON() }

func (k *keptObject) UnmarshalJSON(b []byte) error {
	*k = append((*k)[:0], b...)
	return nil
}

// Schema documents a kept object: any members.
func (keptObject) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeObject, AdditionalProperties: true}
}

func sledVmmState(i vmm.Info) SledVmmState { return SledVmmState{VmmState: i.State} }

func (s *Server) registerVMMs() {
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID:      "vmm_register",
		Method:           http.MethodPut,
		Path:             "/vmms/{propolis_id}",
		Summary:          "Register a VMM and start bringing its zone up",
		Description:      "Answers at once with the VMM's state. The body is upstream's InstanceEnsureBody; fields this agent does not act on are kept and reported (GET /agent/vmms). Registering the same VMM again returns its state; with another propolis_addr or instance_id it is refused, and so is a VMM whose id is a zone's or whose propolis_addr is a zone's underlay address or gz_address or the sled's underlay address, and a VMM one of whose disks' files is another VMM's writable disk, or that would write a file another VMM reads (409, naming that VMM). A propolis_addr outside the sled's subnet (the /64 of its underlay address, where upstream allocates VMMs' addresses), or one of its first three addresses, is refused (400). A vmm_spec this sled cannot realise (a component it does not offer, more CPUs than its hardware threads, two devices on one PCI path, a boot entry or backend_id naming nothing, a file backend outside the sled's guest storage, reached through a symbolic link or a mount point, or with another hard link) or whose memory is more than what is left of the VMM reservoir is refused (400, naming the problem) and changes nothing.",
		SkipValidateBody: true,
		Errors:           []int{400, 409, 507},
	}, vmmRegisterRoute), s.vmmRegister)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "vmm_unregister",
		Method:      http.MethodDelete,
		Path:        "/vmms/{propolis_id}",
		Summary:     "Unregister a VMM and tear its zone down",
		Errors:      []int{404},
	}, httpbound.Small), s.vmmUnregister)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID:      "vmm_put_state",
		Method:           http.MethodPut,
		Path:             "/vmms/{propolis_id}/state",
		Summary:          "Ask a VMM's guest to run, stop or reboot",
		Description:      `Body {"state": {"type": "running" | "stopped" | "reboot"}}. Answers once the VMM's service took the request; updated_runtime is null when it changed nothing. Live migration ("migration_target") is not supported.`,
		SkipValidateBody: true,
		Errors:           []int{400, 404, 503},
	}, vmmStateRoute), s.vmmPutState)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "vmm_get_state",
		Method:      http.MethodGet,
		Path:        "/vmms/{propolis_id}/state",
		Summary:     "A VMM's state; vmm_state.gen increases with every change",
		Errors:      []int{404},
	}, httpbound.Small), s.vmmGetState)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_vmms",
		Method:      http.MethodGet,
		Path:        "/agent/vmms",
		Summary:     "The VMMs, a page at a time: state, what happened to each, its registration (blob contents withheld)",
		Description: "Also the VMMs of which the agent has no readable record (status unknown, detail says why): their zones are left running until removed with POST /agent/vmms/{propolis_id}/remove-unknown.",
	}, httpbound.Small), s.agentVMMs)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_vmm_remove_unknown",
		Method:      http.MethodPost,
		Path:        "/agent/vmms/{propolis_id}/remove-unknown",
		Summary:     "Tear down the zone of a VMM of which no record is readable, and what is left of its record",
		Description: "The agent never tears down a VMM zone it has no readable record of; this is the operator's decision. A VMM with a readable record is refused (409: unregister it with DELETE /vmms/{propolis_id}); one that is not unknown is 404.",
		Errors:      []int{400, 404, 409},
	}, httpbound.Small), s.vmmRemoveUnknown)
}

type vmmPath struct {
	PropolisID string `path:"propolis_id" maxLength:"36" doc:"The VMM's (propolis) UUID."`
}

type vmmRegisterInput struct {
	PropolisID string `path:"propolis_id" maxLength:"36" doc:"The VMM's (propolis) UUID."`
	RawBody    []byte `contentType:"application/json"`
}

type sledVmmStateOutput struct {
	Body SledVmmState
}

type vmmPutStateOutput struct {
	Body VmmPutStateResponse
}

type vmmUnregisterOutput struct {
	Body VmmUnregisterResponse
}

// parseRegistration checks a registration body and returns what the
// manager needs; an error names the problem. The propolis_addr must be in
// the subnet of sled, the sled's underlay address (if valid): upstream's
// Nexus allocates it there, and the runtime routes it into the VMM's zone,
// so an address elsewhere would take this sled's traffic to it.
func parseRegistration(raw []byte, sled netip.Addr) (vmm.Registration, error) {
	var b InstanceEnsureBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return vmm.Registration{}, fmt.Errorf("body is not an InstanceEnsureBody: %v", err)
	}
	var missing []string
	for name, present := range map[string]bool{
		"instance_id": b.InstanceID != nil, "propolis_addr": b.PropolisAddr != nil, "vmm_runtime": b.VmmRuntime != nil,
		"local_config": b.LocalConfig != nil, "metadata": b.Metadata != nil, "vmm_spec": b.VmmSpec != nil,
	} {
		if !present {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return vmm.Registration{}, fmt.Errorf("missing field(s): %s", strings.Join(slices.Sorted(slices.Values(missing)), ", "))
	}
	for _, o := range []struct {
		name, upstream string
		v              keptObject
	}{{"local_config", "InstanceSledLocalConfig", b.LocalConfig}, {"metadata", "InstanceMetadata", b.Metadata}, {"vmm_spec", "VmmSpec", b.VmmSpec}} {
		if o.v[0] != '{' {
			return vmm.Registration{}, fmt.Errorf("%s: want a JSON object (upstream's %s), not %.40s", o.name, o.upstream, o.v)
		}
	}
	id, err := uuid.Parse(*b.InstanceID)
	if err != nil || len(*b.InstanceID) != 36 {
		return vmm.Registration{}, fmt.Errorf("instance_id %q is not a UUID", *b.InstanceID)
	}
	addr, err := netip.ParseAddrPort(*b.PropolisAddr)
	if err != nil || !addr.Addr().Is6() || addr.Addr().Is4In6() || addr.Addr().Zone() != "" || !addr.Addr().IsGlobalUnicast() || addr.Port() == 0 {
		return vmm.Registration{}, fmt.Errorf("propolis_addr %q: want [ipv6]:port on the underlay", *b.PropolisAddr)
	}
	if st := b.VmmRuntime.State; !slices.Contains(vmmStates, st) {
		return vmm.Registration{}, fmt.Errorf("vmm_runtime.state %q: want one of %s", st, strings.Join(vmmStates, ", "))
	}
	if g := b.VmmRuntime.Gen; g > vmm.MaxGen {
		// Upstream's Generation refuses it the same way.
		return vmm.Registration{}, fmt.Errorf("vmm_runtime.gen %d: want an integer between 0 and %d", g, uint64(vmm.MaxGen))
	}
	g, err := vmm.ParseGuest(raw)
	if err != nil {
		return vmm.Registration{}, err
	}
	// Last: a body that is wrong in itself says so whatever sled it is
	// sent to.
	if sled.IsValid() {
		if msg := sledconfig.SledAddrProblem(sled, addr.Addr()); msg != "" {
			return vmm.Registration{}, fmt.Errorf("propolis_addr %q: %s", *b.PropolisAddr, msg)
		}
	}
	// A copy: the server reuses the buffer raw lies in.
	return vmm.Registration{InstanceID: id.String(), PropolisAddr: addr, Initial: *b.VmmRuntime, Body: json.RawMessage(bytes.Clone(raw)), Guest: g}, nil
}

// vmmStates are upstream's VmmState values (vmm.RuntimeState's enum).
var vmmStates = strings.Split(reflect.TypeFor[vmm.RuntimeState]().Field(1).Tag.Get("enum"), ",")

// propolisID checks the path's id: it names the VMM's zone.
func propolisID(ctx context.Context, s string) (string, error) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return "", apiError(ctx, http.StatusBadRequest, fmt.Sprintf("propolis_id %q is not a UUID", s))
	}
	return u.String(), nil
}

// NoSuchInstance is the error_code of a VMM operation on a VMM this sled
// does not have.
const NoSuchInstance = "NO_SUCH_INSTANCE"

func (s *Server) vmmError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, vmm.ErrNotFound):
		// Upstream's code for a VMM the sled does not have (omicron
		// sled-agent/src/sled_agent.rs): Nexus's instance watcher takes
		// only a 404 with this code as "the VMM is gone" and marks it
		// failed; any other 404 it reads as a fault of the sled.
		e := apiError(ctx, http.StatusNotFound, err.Error())
		e.ErrorCode = NoSuchInstance
		return e
	case errors.Is(err, vmm.ErrConflict), errors.Is(err, vmm.ErrCollision), errors.Is(err, vmm.ErrFileHeld), errors.Is(err, vmm.ErrKnown), errors.Is(err, vmm.ErrNotKnown):
		return apiError(ctx, http.StatusConflict, err.Error())
	case errors.Is(err, vmm.ErrInvalid):
		return apiError(ctx, http.StatusBadRequest, err.Error())
	case errors.Is(err, vmm.ErrCapacity):
		// Upstream's Error::InsufficientCapacity.
		e := apiError(ctx, http.StatusInsufficientStorage, err.Error())
		e.ErrorCode = "InsufficientCapacity"
		return e
	case errors.Is(err, propolisapi.ErrUnreachable):
		return apiError(ctx, http.StatusServiceUnavailable, err.Error())
	default:
		return apiError(ctx, http.StatusInternalServerError, err.Error())
	}
}

func (s *Server) vmmRegister(ctx context.Context, in *vmmRegisterInput) (*sledVmmStateOutput, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	reg, err := parseRegistration(in.RawBody, s.deps.SledUnderlay)
	if err != nil {
		return nil, apiError(ctx, http.StatusBadRequest, err.Error())
	}
	info, err := s.deps.VMMs.Register(id, reg)
	if err != nil {
		return nil, s.vmmError(ctx, err)
	}
	return &sledVmmStateOutput{Body: sledVmmState(info)}, nil
}

func (s *Server) vmmUnregister(ctx context.Context, in *vmmPath) (*vmmUnregisterOutput, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	info, err := s.deps.VMMs.Unregister(ctx, id)
	if err != nil {
		return nil, s.vmmError(ctx, err)
	}
	st := sledVmmState(info)
	return &vmmUnregisterOutput{Body: VmmUnregisterResponse{UpdatedRuntime: &st}}, nil
}

type vmmPutStateInput struct {
	PropolisID string `path:"propolis_id" maxLength:"36" doc:"The VMM's (propolis) UUID."`
	RawBody    []byte `contentType:"application/json"`
}

func (s *Server) vmmPutState(ctx context.Context, in *vmmPutStateInput) (*vmmPutStateOutput, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	var b VmmPutStateBody
	if err := json.Unmarshal(in.RawBody, &b); err != nil || b.State == nil {
		return nil, apiError(ctx, http.StatusBadRequest, `body must be {"state": {"type": "running" | "stopped" | "reboot"}}`)
	}
	var r vmm.Request
	switch b.State.Type {
	case "running":
		r = vmm.RequestRunning
	case "stopped":
		r = vmm.RequestStopped
	case "reboot":
		r = vmm.RequestReboot
	case "migration_target":
		return nil, apiError(ctx, http.StatusBadRequest, "live migration (migration_target) is not supported by this agent")
	default:
		return nil, apiError(ctx, http.StatusBadRequest, fmt.Sprintf("state type %q: want running, stopped or reboot", b.State.Type))
	}
	info, changed, err := s.deps.VMMs.RequestState(ctx, id, r)
	if err != nil {
		return nil, s.vmmError(ctx, err)
	}
	out := &vmmPutStateOutput{}
	if changed {
		st := sledVmmState(info)
		out.Body.UpdatedRuntime = &st
	}
	return out, nil
}

func (s *Server) vmmGetState(ctx context.Context, in *vmmPath) (*sledVmmStateOutput, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	info, err := s.deps.VMMs.Get(id)
	if err != nil {
		return nil, s.vmmError(ctx, err)
	}
	return &sledVmmStateOutput{Body: sledVmmState(info)}, nil
}

type agentVMMOutput struct {
	Body vmm.Info
}

func (s *Server) vmmRemoveUnknown(ctx context.Context, in *vmmPath) (*agentVMMOutput, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	info, err := s.deps.VMMs.RemoveUnknown(ctx, id)
	if err != nil {
		return nil, s.vmmError(ctx, err)
	}
	return &agentVMMOutput{Body: info}, nil
}

// VMMPage is one page of our view of the VMMs, in the shape of dropshot's
// ResultsPage.
type VMMPage struct {
	Items    []vmm.Info `json:"items" doc:"The VMMs of this page, by id; a blob backend's contents are withheld (its size and SHA-256 shown)."`
	NextPage *string    `json:"next_page" doc:"The page_token of the next page; null on the last."`
}

type agentVMMsInput struct {
	Limit     int    `query:"limit" minimum:"1" maximum:"100" doc:"How many VMMs at most (20 unless given)."`
	PageToken string `query:"page_token" maxLength:"36" doc:"next_page of the page before."`
}

type agentVMMsOutput struct {
	Body VMMPage
}

func (s *Server) agentVMMs(ctx context.Context, in *agentVMMsInput) (*agentVMMsOutput, error) {
	limit := in.Limit
	if limit == 0 {
		limit = DefaultVMMPage
	}
	after := ""
	if in.PageToken != "" {
		id, err := uuid.Parse(in.PageToken)
		if err != nil || len(in.PageToken) != 36 {
			return nil, apiError(ctx, http.StatusBadRequest, fmt.Sprintf("page_token %q is not a next_page this API gave", in.PageToken))
		}
		after = id.String()
	}
	items, more := s.deps.VMMs.Page(after, limit)
	out := &agentVMMsOutput{Body: VMMPage{Items: items}}
	if more && len(items) > 0 {
		next := items[len(items)-1].ID
		out.Body.NextPage = &next
	}
	return out, nil
}
