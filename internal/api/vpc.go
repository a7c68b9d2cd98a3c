package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// VPC is the sled's record of what Nexus told it about guest networking
// (internal/vpc/told.Store).
type VPC interface {
	V2P() []told.V2P
	SetV2P(ctx context.Context, m told.V2P) error
	ClearV2P(ctx context.Context, m told.V2P) error
	Routes() []told.RouteState
	SetRoutes(ctx context.Context, sets []told.RouteSet) error
	SetEIPGateways(ctx context.Context, g told.EIPGateways) error
	SetFirewallRules(ctx context.Context, b told.FirewallRulesBody) error
	PutExternalIP(ctx context.Context, id string, b told.ExternalIPBody) error
	DeleteExternalIP(ctx context.Context, id string, b told.ExternalIPBody) error
	SetAttachedSubnets(ctx context.Context, id string, s told.AttachedSubnets) error
	ClearAttachedSubnets(ctx context.Context, id string) error
	AttachSubnet(ctx context.Context, id string, s told.AttachedSubnet) error
	DetachSubnet(ctx context.Context, id, subnet string) error
	SetProbes(ctx context.Context, s told.ProbeSet) error
	View() told.View
}

// SubnetAlreadyAttached is upstream's error_code of a POST of a subnet a
// VMM has attached already; Nexus takes it as success.
const SubnetAlreadyAttached = "SUBNET_ALREADY_ATTACHED"

// Body bounds of the VPC operations: a route set per RouterID of the sled
// (a few per VPC) of up to a few hundred routes; a VPC's firewall rules
// (up to 1,024, each naming its target NICs, some 300 bytes each); every
// probe of the sled.
var (
	vpcRoutesRoute = httpbound.Sized(1 << 20)
	firewallRoute  = httpbound.Sized(4 << 20)
	vpcSetRoute    = httpbound.Sized(1 << 20)
	vpcSmallRoute  = httpbound.Sized(16 << 10)
)

// vpcBodies document the raw bodies of the VPC operations with the types
// the handlers decode into.
var vpcBodies = []struct {
	method, path string
	t            reflect.Type
}{
	{http.MethodPut, "/v2p", reflect.TypeFor[told.V2P]()},
	{http.MethodDelete, "/v2p", reflect.TypeFor[told.V2P]()},
	{http.MethodPut, "/vpc-routes", reflect.TypeFor[[]told.RouteSet]()},
	{http.MethodPut, "/eip-gateways", reflect.TypeFor[told.EIPGateways]()},
	{http.MethodPut, "/vpc/{vpc_id}/firewall/rules", reflect.TypeFor[told.FirewallRulesBody]()},
	{http.MethodPut, "/vmms/{propolis_id}/external-ip", reflect.TypeFor[told.ExternalIPBody]()},
	{http.MethodDelete, "/vmms/{propolis_id}/external-ip", reflect.TypeFor[told.ExternalIPBody]()},
	{http.MethodPut, "/vmms/{propolis_id}/attached-subnets", reflect.TypeFor[told.AttachedSubnets]()},
	{http.MethodPost, "/vmms/{propolis_id}/attached-subnets", reflect.TypeFor[told.AttachedSubnet]()},
	{http.MethodPut, "/probes", reflect.TypeFor[told.ProbeSet]()},
}

func (s *Server) registerVPC() {
	const kept = " What the sled is told is kept durably (a checksummed copy in each ledger directory) before it is answered, and survives a restart of the agent."
	reg := func(op huma.Operation, rt httpbound.Route, h any) {
		op.Description = joinSentences(op.Description, kept)
		if op.Method != http.MethodGet && op.DefaultStatus == 0 {
			op.DefaultStatus = http.StatusNoContent
		}
		op.Errors = append(op.Errors, 400, 500, 503)
		op = s.bounded(op, rt)
		switch h := h.(type) {
		case func(context.Context, *vpcRawInput) (*struct{}, error):
			huma.Register(s.api, op, h)
		case func(context.Context, *vmmRawInput) (*struct{}, error):
			huma.Register(s.api, op, h)
		case func(context.Context, *vmmSubnetInput) (*struct{}, error):
			huma.Register(s.api, op, h)
		case func(context.Context, *vmmPath) (*struct{}, error):
			huma.Register(s.api, op, h)
		case func(context.Context, *vpcFirewallInput) (*struct{}, error):
			huma.Register(s.api, op, h)
		default:
			panic(fmt.Sprintf("registerVPC: handler %T", h))
		}
	}
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "list_v2p",
		Method:      http.MethodGet,
		Path:        "/v2p",
		Summary:     "List v2p mappings present on sled",
		Description: "Every mapping put and not deleted, whatever the sled's ports (the table is global to the sled, as OPTE's).",
	}, httpbound.Small), s.listV2P)
	reg(huma.Operation{OperationID: "set_v2p", Method: http.MethodPut, Path: "/v2p",
		Summary:          "Create a mapping from a virtual NIC to a physical host",
		Description:      "Keyed by (vni, virtual_ip): a mapping of the same replaces it; the same again changes nothing.",
		SkipValidateBody: true}, vpcSmallRoute, s.setV2P)
	reg(huma.Operation{OperationID: "del_v2p", Method: http.MethodDelete, Path: "/v2p",
		Summary:          "Delete a mapping from a virtual NIC to a physical host",
		Description:      "Removes the mapping of (vni, virtual_ip), whatever its MAC and host; one that is not there is a 204 all the same.",
		SkipValidateBody: true}, vpcSmallRoute, s.delV2P)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "list_vpc_routes",
		Method:      http.MethodGet,
		Path:        "/vpc-routes",
		Summary:     "Get the current versions of VPC routing rules.",
		Description: "One entry per RouterId the sled's ports need: {vni, system} for each VNI with a port, {vni, custom(subnet)} for each port's subnet (v4 and v6); version is that of the set last applied, null when none was. Nexus sends routes for these only. The ports are each active VMM's NICs (from registration until it is stopped, failed or destroyed), each nexus, external_dns and boundary_ntp zone's NIC, and each probe's.",
	}, httpbound.Small), s.listVPCRoutes)
	reg(huma.Operation{OperationID: "set_vpc_routes", Method: http.MethodPut, Path: "/vpc-routes",
		Summary:          "Update VPC routing rules.",
		Description:      "As upstream: a set whose RouterId no port of the sled needs is ignored; one whose version has the router_id of the applied set's and a version not above it is skipped; any other replaces the applied set.",
		SkipValidateBody: true}, vpcRoutesRoute, s.setVPCRoutes)
	reg(huma.Operation{OperationID: "set_eip_gateways", Method: http.MethodPut, Path: "/eip-gateways",
		Summary:          "Update per-NIC IP address <-> internet gateway mappings.",
		Description:      "Replaces the whole map; if it changed, each instance's primary port gets its external IPs again with their gateways.",
		SkipValidateBody: true}, vpcSetRoute, s.setEIPGateways)
	reg(huma.Operation{OperationID: "vpc_firewall_rules_put", Method: http.MethodPut, Path: "/vpc/{vpc_id}/firewall/rules",
		Description:      "Replaces the firewall rules of every port of the sled in the VNI, and keeps them as the VNI's latest while a port is in it; a port made later gets them. vpc_id is not used (as upstream); no port in the VNI is a 204 all the same.",
		SkipValidateBody: true}, firewallRoute, s.putFirewallRules)
	const vmmDoc = " The VMM's primary NIC's port; an unknown VMM is a 404 NO_SUCH_INSTANCE, a VMM without a port now (stopped, failed or destroyed) a 500."
	reg(huma.Operation{OperationID: "vmm_put_external_ip", Method: http.MethodPut, Path: "/vmms/{propolis_id}/external-ip",
		Description:      "Attaches an external IP, as upstream: the same ephemeral IP again is a 204 that changes nothing, another ephemeral IP while one is attached a 500 (detach it first), a floating IP joins the set; the registration's external_ips are where it starts." + vmmDoc,
		SkipValidateBody: true, Errors: []int{404}}, vpcSmallRoute, vmmBody(s, told.ExternalIPBody.Check, VPC.PutExternalIP))
	reg(huma.Operation{OperationID: "vmm_delete_external_ip", Method: http.MethodDelete, Path: "/vmms/{propolis_id}/external-ip",
		Description:      "Detaches it if it is the one attached; otherwise a 204 that changes nothing." + vmmDoc,
		SkipValidateBody: true, Errors: []int{404}}, vpcSmallRoute, vmmBody(s, told.ExternalIPBody.Check, VPC.DeleteExternalIP))
	reg(huma.Operation{OperationID: "vmm_put_attached_subnets", Method: http.MethodPut, Path: "/vmms/{propolis_id}/attached-subnets",
		Summary:          "Update the subnets attached to an instance.",
		Description:      "Makes them exactly these: those no longer given are detached, then each given one attached." + vmmDoc,
		SkipValidateBody: true, Errors: []int{404}}, vpcSetRoute, vmmBody(s, told.AttachedSubnets.Check, VPC.SetAttachedSubnets))
	reg(huma.Operation{OperationID: "vmm_post_attached_subnet", Method: http.MethodPost, Path: "/vmms/{propolis_id}/attached-subnets",
		Summary:          "Attach a subnet to an instance.",
		Description:      "A subnet attached already is a 409 SUBNET_ALREADY_ATTACHED, and changes nothing." + vmmDoc,
		SkipValidateBody: true, Errors: []int{404, 409}}, vpcSmallRoute, vmmBody(s, func(a told.AttachedSubnet) (told.AttachedSubnet, error) { return a.Check("") }, VPC.AttachSubnet))
	reg(huma.Operation{OperationID: "vmm_delete_attached_subnets", Method: http.MethodDelete, Path: "/vmms/{propolis_id}/attached-subnets",
		Summary: "Delete all subnets attached to an instance.", Description: vmmDoc[1:], Errors: []int{404}}, httpbound.Small, s.deleteAttachedSubnets)
	reg(huma.Operation{OperationID: "vmm_delete_attached_subnet", Method: http.MethodDelete, Path: "/vmms/{propolis_id}/attached-subnets/{subnet}",
		Summary:     "Detach a subnet from an instance.",
		Description: "subnet is an IP network, its / escaped (10.0.0.0%2F24). One not attached is a 204 all the same." + vmmDoc,
		Errors:      []int{404}}, httpbound.Small, s.deleteAttachedSubnet)
	reg(huma.Operation{OperationID: "probes_put", Method: http.MethodPut, Path: "/probes",
		Summary:          "Update the entire set of probe zones on this sled.",
		Description:      "Replaces the set; each probe has a port (its interface) made with upstream's one firewall rule, allow all inbound at priority 100.",
		SkipValidateBody: true}, vpcSetRoute, s.putProbes)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_vpc",
		Method:      http.MethodGet,
		Path:        "/agent/vpc",
		Summary:     "What the sled was told about guest networking, and the ports it applies to",
		Description: "The record behind /v2p, /vpc-routes, /eip-gateways, the firewall rules, the VMMs' external IPs and attached subnets and /probes, with its copies' state.",
	}, httpbound.Small), s.agentVPC)
}

type vpcRawInput struct {
	RawBody []byte `contentType:"application/json"`
}

type vmmRawInput struct {
	PropolisID string `path:"propolis_id" maxLength:"36" doc:"The VMM's (propolis) UUID."`
	RawBody    []byte `contentType:"application/json"`
}

type vmmSubnetInput struct {
	PropolisID string `path:"propolis_id" maxLength:"36" doc:"The VMM's (propolis) UUID."`
	Subnet     string `path:"subnet" maxLength:"64" doc:"An IP network."`
}

type vpcFirewallInput struct {
	VpcID   string `path:"vpc_id" format:"uuid" doc:"Not used: the body's vni says which ports."`
	RawBody []byte `contentType:"application/json"`
}

// decodeBody reads a raw body as T and checks it; either failing is a 400
// naming the problem.
func decodeBody[T any](ctx context.Context, raw []byte, check func(T) (T, error)) (T, error) {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, apiError(ctx, http.StatusBadRequest, fmt.Sprintf("body is not upstream's %s: %v", reflect.TypeFor[T]().Name(), err))
	}
	c, err := check(v)
	if err != nil {
		return v, apiError(ctx, http.StatusBadRequest, err.Error())
	}
	return c, nil
}

func (s *Server) vpcError(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, told.ErrInvalid):
		return apiError(ctx, http.StatusBadRequest, err.Error())
	case errors.Is(err, told.ErrNoSuchVMM):
		e := apiError(ctx, http.StatusNotFound, err.Error())
		e.ErrorCode = NoSuchInstance
		return e
	case errors.Is(err, told.ErrSubnetAttached):
		e := apiError(ctx, http.StatusConflict, err.Error())
		e.ErrorCode = SubnetAlreadyAttached
		return e
	case errors.Is(err, told.ErrDataPath):
		// After the record was written: upstream answers its port
		// manager's OPTE errors with a 500.
		s.deps.Log.Error("vpc data path", "err", err)
		return apiError(ctx, http.StatusInternalServerError, err.Error())
	case errors.Is(err, told.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		// The record not written, or an earlier change not done in
		// time: nothing changed, and the same request may be sent again.
		return apiError(ctx, http.StatusServiceUnavailable, err.Error())
	default:
		// Upstream answers its instance's and port manager's errors (an
		// ephemeral IP attached already, a missing port) with a 500.
		s.deps.Log.Error("vpc", "err", err)
		return apiError(ctx, http.StatusInternalServerError, err.Error())
	}
}

type v2pListOutput struct{ Body []told.V2P }

type routesListOutput struct{ Body []told.RouteState }

type vpcViewOutput struct{ Body told.View }

func (s *Server) listV2P(context.Context, *struct{}) (*v2pListOutput, error) {
	return &v2pListOutput{Body: s.deps.VPC.V2P()}, nil
}

func (s *Server) setV2P(ctx context.Context, in *vpcRawInput) (*struct{}, error) {
	m, err := decodeBody(ctx, in.RawBody, told.V2P.Check)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.SetV2P(ctx, m))
}

func (s *Server) delV2P(ctx context.Context, in *vpcRawInput) (*struct{}, error) {
	m, err := decodeBody(ctx, in.RawBody, told.V2P.Check)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.ClearV2P(ctx, m))
}

func (s *Server) listVPCRoutes(context.Context, *struct{}) (*routesListOutput, error) {
	return &routesListOutput{Body: s.deps.VPC.Routes()}, nil
}

func (s *Server) setVPCRoutes(ctx context.Context, in *vpcRawInput) (*struct{}, error) {
	sets, err := decodeBody(ctx, in.RawBody, func(sets []told.RouteSet) ([]told.RouteSet, error) {
		if sets == nil {
			return nil, fmt.Errorf("%w: want an array of ResolvedVpcRouteSet", told.ErrInvalid)
		}
		out := make([]told.RouteSet, len(sets))
		for i, set := range sets {
			c, err := set.Check()
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = c
		}
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.SetRoutes(ctx, sets))
}

func (s *Server) setEIPGateways(ctx context.Context, in *vpcRawInput) (*struct{}, error) {
	g, err := decodeBody(ctx, in.RawBody, told.EIPGateways.Check)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.SetEIPGateways(ctx, g))
}

func (s *Server) putFirewallRules(ctx context.Context, in *vpcFirewallInput) (*struct{}, error) {
	b, err := decodeBody(ctx, in.RawBody, told.FirewallRulesBody.Check)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.SetFirewallRules(ctx, b))
}

// vmmBody is the shape of the per-VMM VPC operations: a propolis id in the
// path and a checked body, handed to apply; errors map through vpcError.
func vmmBody[T any](s *Server, check func(T) (T, error), apply func(VPC, context.Context, string, T) error) func(context.Context, *vmmRawInput) (*struct{}, error) {
	return func(ctx context.Context, in *vmmRawInput) (*struct{}, error) {
		id, err := propolisID(ctx, in.PropolisID)
		if err != nil {
			return nil, err
		}
		b, err := decodeBody(ctx, in.RawBody, check)
		if err != nil {
			return nil, err
		}
		return nil, s.vpcError(ctx, apply(s.deps.VPC, ctx, id, b))
	}
}

func (s *Server) deleteAttachedSubnets(ctx context.Context, in *vmmPath) (*struct{}, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.ClearAttachedSubnets(ctx, id))
}

func (s *Server) deleteAttachedSubnet(ctx context.Context, in *vmmSubnetInput) (*struct{}, error) {
	id, err := propolisID(ctx, in.PropolisID)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.DetachSubnet(ctx, id, in.Subnet))
}

func (s *Server) putProbes(ctx context.Context, in *vpcRawInput) (*struct{}, error) {
	b, err := decodeBody(ctx, in.RawBody, told.ProbeSet.Check)
	if err != nil {
		return nil, err
	}
	return nil, s.vpcError(ctx, s.deps.VPC.SetProbes(ctx, b))
}

func (s *Server) agentVPC(context.Context, *struct{}) (*vpcViewOutput, error) {
	return &vpcViewOutput{Body: s.deps.VPC.View()}, nil
}
