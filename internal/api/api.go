// Package api serves the sled agent's HTTP API: upstream paths and JSON shapes
// (PUT /omicron-config, GET /inventory, GET /zones), our own status endpoints,
// Prometheus metrics, and the OpenAPI document generated from this code.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/hardware"
	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/nexus"
	"github.com/sled-agent/sled-agent/internal/prefix"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/timesync/servers"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// Version is the sled-agent API version whose paths and shapes this API
// serves. Requests asking for a newer version are refused.
const Version = "48.0.0"

// MaxConfigBytes bounds a PUT /omicron-config body: what the ledger stores.
const MaxConfigBytes = ledger.MaxDataBytes

// Configs is the config store the API puts to and reads from.
type Configs interface {
	Put(ctx context.Context, doc []byte) error
	Current() *sledconfig.Config
	LoadProblem() string
	CopyStatus() []ledger.CopyStatus
}

// Reconciler is what the API reads of the zone reconciler. None of these
// calls waits for reconciliation.
type Reconciler interface {
	Status() reconciler.Status
	Zones() []reconciler.ZoneStatus
	ZonesWhere(keep func(reconciler.ZoneStatus) bool) []reconciler.ZoneStatus
	Zone(nameOrID string) (reconciler.ZoneStatus, bool)
	// Removed is a zone removed from the config, as it last was.
	Removed(nameOrID string) (reconciler.ZoneStatus, bool)
	RunningZones() []string
	Restore() reconciler.RestoreStatus
}

// Prefixes reports the prefix reconciler's status.
type Prefixes interface {
	Status() prefix.Status
}

// NAT reports the NAT reconciler's status.
type NAT interface {
	Status() nat.Status
}

// FaultSetter replaces the sim runtime's fault map.
type FaultSetter interface {
	SetFaults(sim.Faults) error
}

// Identity is this sled's identity as reported in inventory.
type Identity struct {
	SledID  string
	Address string // sled_agent_address, "[ip]:port"
	Role    string // "gimlet" or "scrimlet"
	// RackID is the rack's id ("" when not known).
	RackID string
	// Hardware is what the sled is.
	Hardware hardware.Info
}

// Deps are what the API serves from.
type Deps struct {
	Identity   Identity
	Configs    Configs
	Reconciler Reconciler
	// Faults is set only when the runtime is sim; it enables
	// PUT /debug/sim/faults.
	Faults FaultSetter
	// Prefixes, if set, is the prefix reconciler, reported in inventory
	// with DDMURL, the routing daemon it talks to.
	Prefixes Prefixes
	DDMURL   string
	// NAT, if set, is the NAT reconciler, reported in inventory.
	NAT NAT
	// VMMs, if set, is the VMM manager, behind /vmms.
	VMMs VMMs
	// SledUnderlay is the sled's underlay address: a VMM's propolis_addr
	// must lie in its subnet (sledconfig.SledAddrProblem). Zero: not
	// checked.
	SledUnderlay netip.Addr
	// Reservoir, if set, is the VMM reservoir (inventory's reservoir_size);
	// Accel and AccelWhy how guests run, for people.
	Reservoir       Reservoir
	Accel, AccelWhy string
	// LocalStorage, if set, is the pools' local storage allocations,
	// behind /local-storage.
	LocalStorage LocalStorage
	// VPC, if set, is the record of what Nexus told the sled about guest
	// networking, behind /v2p, /vpc-routes, /eip-gateways,
	// /vpc/{vpc_id}/firewall/rules, /vmms/{id}/external-ip,
	// /vmms/{id}/attached-subnets, /probes and /agent/vpc.
	VPC VPC
	// Storage, if set, is the storage reconciler, reported in inventory;
	// nil: the agent manages no storage (no disks, pools or datasets).
	Storage Storage
	// TimeSync, if set, is the time-sync watcher, reported in inventory;
	// NTPServers, if set, the follower of the boundary NTP servers.
	TimeSync   TimeSync
	NTPServers NTPServers
	// Probes is the maker of the probes' zones, nil when there is none.
	Probes Probes
	// Nexus, if set, is the agent's link to Nexus, reported in inventory.
	Nexus Nexus
	Log   *slog.Logger
	// Registry receives API metrics and is served on /metrics (nil: a new one).
	Registry *prometheus.Registry
	// BodyReadTimeout, if set, replaces every operation's body read
	// deadline (tests use a short one).
	BodyReadTimeout time.Duration
}

// Server is the HTTP API.
type Server struct {
	deps Deps
	// every registers every route, whatever deps holds: for Document.
	every   bool
	api     huma.API
	handler http.Handler
	metrics *httpMetrics
	// inv holds the parts of /inventory encoded once.
	inv inventoryCache
	// bounds are the operations' body bounds, by mux pattern
	// ("PUT /omicron-config"); written only while building.
	bounds map[string]httpbound.Route
}

// New builds the API.
func New(deps Deps) *Server { return build(deps, false) }

func build(deps Deps, every bool) *Server {
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	mux := http.NewServeMux()
	cfg := huma.DefaultConfig("Sled Agent API", Version)
	cfg.Info.Description = "Accepts a sled's desired state durably, realises it asynchronously and reports what it sees. Paths and shapes follow the upstream sled-agent API " + Version + "."
	cfg.CreateHooks = nil // no $schema links in bodies: keep the upstream shapes
	cfg.DocsPath = ""
	cfg.Components.Schemas = huma.NewMapRegistry("#/components/schemas/", schemaName)
	api := humago.New(mux, cfg)
	s := &Server{deps: deps, every: every, api: api, metrics: newHTTPMetrics(deps.Registry), bounds: map[string]httpbound.Route{}}
	s.register()
	s.document()
	mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Registry, promhttp.HandlerOpts{}))
	s.handler = s.middleware(dropshotErrors(mux, s.route))
	return s
}

// Handler is the HTTP handler of the API.
func (s *Server) Handler() http.Handler { return s.handler }

// OpenAPI returns the API's OpenAPI document.
func (s *Server) OpenAPI() *huma.OpenAPI { return s.api.OpenAPI() }

func (s *Server) register() {
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID:      "omicron_config_put",
		Method:           http.MethodPut,
		Path:             "/omicron-config",
		Summary:          "Ledger a new sled config",
		Description:      "Validates the config, writes it durably to the ledger and answers 204 without waiting for any zone work. An older generation, or the same generation with a different meaning, is refused with 400; the same generation with the same meaning (absent optional members and upstream defaults count as equal) is a no-op 204.",
		DefaultStatus:    http.StatusNoContent,
		SkipValidateBody: true, // validated by sledconfig.Validate, which keeps unknown fields
		Errors:           []int{400, 413, 503},
	}, configRoute), s.putConfig) // the body is read raw (to keep it lossless); document() says its schema

	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "inventory",
		Method:      http.MethodGet,
		Path:        "/inventory",
		Summary:     "Fetch basic information about this sled",
		Description: "Exactly upstream's Inventory, served from published snapshots: never waits for reconciliation. Our own richer view is GET /agent/inventory.",
	}, httpbound.Small), s.inventory)
	// The body is encoded by hand from cached parts; document its schema.
	s.api.OpenAPI().Paths["/inventory"].Get.Responses["200"].Content = map[string]*huma.MediaType{"application/json": {
		Schema: s.api.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[Inventory](), true, ""),
	}}
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "sled_identifiers",
		Method:      http.MethodGet,
		Path:        "/sled-identifiers",
		Summary:     "Fetch sled identifiers",
		Description: "503 until the agent knows its rack id.",
		Errors:      []int{503},
	}, httpbound.Small), s.sledIdentifiers)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_inventory",
		Method:      http.MethodGet,
		Path:        "/agent/inventory",
		Summary:     "This agent's own view: ledger copies, every zone's state, VMMs, NAT, DDM, restore, and when the last reconciliation completed",
	}, httpbound.Small), s.agentInventory)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "zones_list",
		Method:      http.MethodGet,
		Path:        "/zones",
		Summary:     "List the zones that are currently running",
	}, httpbound.Small), s.zonesList)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_zones",
		Method:      http.MethodGet,
		Path:        "/agent/zones",
		Summary:     "Status of every zone the agent manages",
	}, httpbound.Small), s.agentZones)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_zone",
		Method:      http.MethodGet,
		Path:        "/agent/zones/{zone}",
		Summary:     "Status and history of one zone, by name or id",
		Errors:      []int{404},
	}, httpbound.Small), s.agentZone)
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "agent_restore",
		Method:      http.MethodGet,
		Path:        "/agent/restore",
		Summary:     "What the agent found at start-up and did about it: zones adopted, repaired, removed; leftovers swept",
	}, httpbound.Small), s.agentRestore)
	if s.deps.VMMs != nil || s.every {
		s.registerVMMs()
	}
	if s.deps.LocalStorage != nil || s.every {
		s.registerLocalStorage()
	}
	if s.deps.VPC != nil || s.every {
		s.registerVPC()
	}
	if s.deps.Faults != nil || s.every {
		s.registerFaults()
	}
	// Bad input is answered 400, as upstream does; never 422.
	for _, item := range s.api.OpenAPI().Paths {
		for _, op := range []*huma.Operation{item.Get, item.Put, item.Post, item.Delete} {
			if op != nil {
				delete(op.Responses, "422")
			}
		}
	}
}

func (s *Server) registerFaults() {
	huma.Register(s.api, s.bounded(huma.Operation{
		OperationID: "debug_sim_faults_put",
		Method:      http.MethodPut,
		Path:        "/debug/sim/faults",
		Summary:     "Replace the sim runtime's fault map",
		Description: `Only served when the runtime is sim. Replaces the whole map; every member is optional, and what a member does not name behaves normally. ` +
			`Body: {"zones": {"<zone uuid>": {"start": "hang" | "fail" | "<Go duration>", "stop": "hang" | "fail" | "<Go duration>", "vanish_after": "<Go duration>", "health": "fail" | "hang"}}, ` +
			`"disks": {"<disk serial>": {"ensure": "hang" | "fail" | "<Go duration>", "present": false}}, ` +
			`"timesync": {"synced": false}}. ` +
			`An unknown member or a bad value is a 400 naming it, and changes nothing.`,
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{400},
	}, faultsRoute), s.putFaults)
}

// upstreamNames names our types after the upstream schemas they match.
var upstreamNames = map[reflect.Type]string{
	reflect.TypeFor[sledconfig.Config]():      "OmicronSledConfig",
	reflect.TypeFor[sledconfig.Zone]():        "OmicronZoneConfig",
	reflect.TypeFor[sledconfig.ZoneType]():    "OmicronZoneType",
	reflect.TypeFor[sledconfig.Dataset]():     "OmicronZoneDataset",
	reflect.TypeFor[sledconfig.ImageSource](): "OmicronZoneImageSource",
	reflect.TypeFor[sledconfig.NIC]():         "NetworkInterface",
	reflect.TypeFor[sledconfig.NICKind]():     "NetworkInterfaceKind",
	reflect.TypeFor[sledconfig.IPConfig]():    "PrivateIpConfig",
	reflect.TypeFor[sledconfig.SNAT]():        "SourceNatConfigGeneric",
	reflect.TypeFor[ReconcilerStatus]():       "ConfigReconcilerInventoryStatus",
	reflect.TypeFor[BaseboardID]():            "BaseboardId",
	reflect.TypeFor[ResultStatus]():           "ConfigReconcilerInventoryResult",
	reflect.TypeFor[vmm.RuntimeState]():       "VmmRuntimeState",
	reflect.TypeFor[timesync.Status]():        "TimeSyncStatus",
	reflect.TypeFor[servers.Status]():         "NTPServersStatus",
	reflect.TypeFor[servers.ZoneStatus]():     "NTPServersZoneStatus",
	reflect.TypeFor[told.V2P]():               "VirtualNetworkInterfaceHost",
	reflect.TypeFor[told.RouterID]():          "RouterId",
	reflect.TypeFor[told.RouterKind]():        "RouterKind",
	reflect.TypeFor[told.RouterVersion]():     "RouterVersion",
	reflect.TypeFor[told.RouteState]():        "ResolvedVpcRouteState",
	reflect.TypeFor[told.RouteSet]():          "ResolvedVpcRouteSet",
	reflect.TypeFor[told.Route]():             "ResolvedVpcRoute",
	reflect.TypeFor[told.RouterTarget]():      "RouterTarget",
	reflect.TypeFor[told.Gateway]():           "InternetGatewayRouterTarget",
	reflect.TypeFor[told.EIPGateways]():       "ExternalIpGatewayMap",
	reflect.TypeFor[told.FirewallRulesBody](): "VpcFirewallRulesEnsureBody",
	reflect.TypeFor[told.FirewallRule]():      "ResolvedVpcFirewallRule",
	reflect.TypeFor[told.HostIdentifier]():    "HostIdentifier",
	reflect.TypeFor[told.Protocol]():          "VpcFirewallRuleProtocol",
	reflect.TypeFor[told.IcmpFilter]():        "VpcFirewallIcmpFilter",
	reflect.TypeFor[told.ExternalIPBody]():    "InstanceExternalIpBody",
	reflect.TypeFor[told.AttachedSubnets]():   "AttachedSubnets",
	reflect.TypeFor[told.AttachedSubnet]():    "AttachedSubnet",
	reflect.TypeFor[told.ProbeSet]():          "ProbeSet",
	reflect.TypeFor[probes.Status]():          "ProbeZonesStatus",
	reflect.TypeFor[probes.ProbeStatus]():     "ProbeZoneStatus",
	reflect.TypeFor[told.Probe]():             "ProbeCreate",
	reflect.TypeFor[told.ProbeExternalIP]():   "ExternalIp",
}

var (
	storagePkg = reflect.TypeFor[storage.Status]().PkgPath()
	nexusPkg   = reflect.TypeFor[nexus.Status]().PkgPath()
	toldPkg    = reflect.TypeFor[told.View]().PkgPath()
)

func schemaName(t reflect.Type, hint string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n, ok := upstreamNames[t]; ok {
		return n
	}
	if t.PkgPath() == storagePkg && t.Name() != "" {
		// The storage reconciler's types share names with upstream's
		// (DiskIdentity, Dataset) and with other packages' (Status).
		return "Storage" + huma.DefaultSchemaNamer(t, hint)
	}
	if t.PkgPath() == toldPkg && t.Name() != "" {
		// Ours, beside upstream's (RecordCopy, View, Port…).
		return "Vpc" + huma.DefaultSchemaNamer(t, hint)
	}
	if t.PkgPath() == nexusPkg && t.Name() != "" {
		// So are the Nexus link's (Status, VmmRuntimeState).
		return "Nexus" + huma.DefaultSchemaNamer(t, hint)
	}
	return huma.DefaultSchemaNamer(t, hint)
}

type putConfigInput struct {
	RawBody []byte `contentType:"application/json"`
}

func (s *Server) putConfig(ctx context.Context, in *putConfigInput) (*struct{}, error) {
	err := s.deps.Configs.Put(ctx, in.RawBody)
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, configstore.ErrInvalid), errors.Is(err, configstore.ErrOldGeneration), errors.Is(err, configstore.ErrGenerationConflict):
		return nil, apiError(ctx, http.StatusBadRequest, err.Error())
	case errors.Is(err, configstore.ErrUnavailable):
		s.deps.Log.Error("ledgering config failed", "err", err)
		return nil, apiError(ctx, http.StatusServiceUnavailable, err.Error())
	default:
		return nil, apiError(ctx, http.StatusInternalServerError, err.Error())
	}
}

type faultsInput struct {
	Body sim.Faults
}

func (s *Server) putFaults(ctx context.Context, in *faultsInput) (*struct{}, error) {
	if err := s.deps.Faults.SetFaults(in.Body); err != nil {
		return nil, apiError(ctx, http.StatusBadRequest, "invalid fault map: "+err.Error())
	}
	return nil, nil
}

// Error is the upstream error body.
type Error struct {
	RequestID string `json:"request_id"`
	ErrorCode string `json:"error_code,omitempty"`
	Message   string `json:"message"`
	status    int
}

func (e *Error) Error() string  { return e.Message }
func (e *Error) GetStatus() int { return e.status }

type requestIDKey struct{}

func init() {
	huma.NewErrorWithContext = func(ctx huma.Context, status int, msg string, errs ...error) huma.StatusError {
		e := newError(status, msg, errs...)
		if ctx != nil {
			e.RequestID, _ = ctx.Context().Value(requestIDKey{}).(string)
		}
		return e
	}
	huma.NewError = func(status int, msg string, errs ...error) huma.StatusError {
		return newError(status, msg, errs...)
	}
}

// apiError is an error answer carrying the request's id.
func apiError(ctx context.Context, status int, msg string) *Error {
	e := newError(status, msg)
	e.RequestID, _ = ctx.Value(requestIDKey{}).(string)
	return e
}

func newError(status int, msg string, errs ...error) *Error {
	if status == http.StatusUnprocessableEntity {
		status = http.StatusBadRequest // upstream answers bad input with 400
	}
	var details []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		if st, m := httpbound.Status(err); st != 0 {
			// huma answers 500 for a body cut by its bounds
			// (httpbound.Route, applied by dropshotErrors).
			return &Error{Message: m, ErrorCode: errorCode(st), status: st}
		}
		var d *huma.ErrorDetail
		if errors.As(err, &d) && d.Location != "" {
			details = append(details, d.Location+": "+d.Message)
		} else {
			details = append(details, err.Error())
		}
	}
	if len(details) > 0 {
		msg = msg + ": " + strings.Join(details, "; ")
	}
	return &Error{Message: msg, ErrorCode: errorCode(status), status: status}
}

func errorCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "InvalidRequest"
	case http.StatusNotFound:
		return "ObjectNotFound"
	case http.StatusConflict:
		return "Conflict" // upstream's Error::Conflict
	case http.StatusRequestEntityTooLarge:
		return "PayloadTooLarge"
	case http.StatusServiceUnavailable:
		return "ServiceNotAvailable"
	default:
		if status >= 500 {
			return "Internal"
		}
		return ""
	}
}

// middleware gives every request an id, applies the api-version rules
// (version.go) and counts requests.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		id := uuid.NewString()
		w.Header().Set("x-request-id", id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		if err := checkVersionHeader(r.Header); err != nil {
			if hasBody(r) {
				httpbound.StopReading(rw) // answered without reading it
			}
			writeDropshotError(rw, r, http.StatusBadRequest, err.Error())
			s.metrics.observe(r, "version-check", rw.status, time.Since(t0))
			return
		}
		next.ServeHTTP(rw, r)
		s.metrics.observe(r, r.Pattern, rw.status, time.Since(t0))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
