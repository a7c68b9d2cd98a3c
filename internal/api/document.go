package api

import (
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/httpbound"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Document returns the OpenAPI document of every route the agent serves,
// whatever its runtime: the VMM operations and PUT /debug/sim/faults (served
// only with the sim runtime, and documented as such) included. It is what
// openapi/sled-agent.json holds.
func Document() *huma.OpenAPI { return build(Deps{}, true).OpenAPI() }

// rawBodies are the operations whose handlers read the body raw (to keep
// it as sent and check it with their own messages), with the Go type that
// documents what they accept. The handlers decode into the same types, so
// the document cannot drift from what is checked.
var rawBodies = []struct {
	method, path string
	t            reflect.Type
}{
	{http.MethodPut, "/omicron-config", reflect.TypeFor[sledconfig.Config]()},
	{http.MethodPut, "/vmms/{propolis_id}", reflect.TypeFor[InstanceEnsureBody]()},
	{http.MethodPut, "/vmms/{propolis_id}/state", reflect.TypeFor[VmmPutStateBody]()},
}

// document finishes the OpenAPI document after registration: typed request
// bodies for the raw-body operations (whose handlers accept unknown members
// everywhere in the body, as upstream's serde types do: configs are kept
// losslessly, registrations as sent), null where a member can be null, and
// the routes huma does not serve.
func (s *Server) document() {
	doc := s.api.OpenAPI()
	reg := doc.Components.Schemas
	for _, b := range append(slices.Clone(rawBodies), vpcBodies...) {
		item := doc.Paths[b.path]
		if item == nil {
			continue // not served by this server
		}
		op := map[string]*huma.Operation{http.MethodPut: item.Put, http.MethodPost: item.Post, http.MethodDelete: item.Delete}[b.method]
		if op == nil || op.RequestBody == nil {
			continue
		}
		op.RequestBody.Required = true
		schema := reg.Schema(b.t, true, "")
		op.RequestBody.Content = map[string]*huma.MediaType{"application/json": {Schema: schema}}
		openObjects(reg, schema, map[string]bool{})
	}
	nullablePointers(reg)
	if item := doc.Paths["/metrics"]; item == nil {
		op := s.bounded(huma.Operation{
			OperationID: "metrics",
			Method:      http.MethodGet,
			Path:        "/metrics",
			Summary:     "Prometheus metrics of the reconciler and the API",
			Responses: map[string]*huma.Response{"200": {
				Description: "The Prometheus text exposition format.",
				Content:     map[string]*huma.MediaType{"text/plain": {Schema: &huma.Schema{Type: huma.TypeString}}},
			}},
		}, httpbound.Small)
		doc.AddOperation(&op)
	}
}

// openObjects lets every object schema reachable from s have members it
// does not declare.
func openObjects(reg huma.Registry, s *huma.Schema, seen map[string]bool) {
	if s == nil {
		return
	}
	if s.Ref != "" {
		if seen[s.Ref] {
			return
		}
		seen[s.Ref] = true
		openObjects(reg, reg.SchemaFromRef(s.Ref), seen)
		return
	}
	if s.Type == huma.TypeObject && s.AdditionalProperties == false {
		s.AdditionalProperties = true
	}
	for _, p := range s.Properties {
		openObjects(reg, p, seen)
	}
	if ap, ok := s.AdditionalProperties.(*huma.Schema); ok {
		openObjects(reg, ap, seen)
	}
	openObjects(reg, s.Items, seen)
	for _, l := range [][]*huma.Schema{s.OneOf, s.AnyOf, s.AllOf} {
		for _, x := range l {
			openObjects(reg, x, seen)
		}
	}
}

// nullablePointers says null where a struct member is a pointer to a
// struct without omitempty: encoding/json sends a nil one as null, which a
// bare reference to the struct's schema forbids (huma marks only scalar
// pointers nullable). A member tagged nullable:"false" is a pointer only to
// tell a missing member from a present one.
func nullablePointers(reg huma.Registry) {
	const prefix = "#/components/schemas/"
	for name, s := range reg.Map() {
		t := reg.TypeFromRef(prefix + name)
		if t == nil || t.Kind() != reflect.Struct {
			continue
		}
		for f := range structFields(t) {
			tag := f.Tag.Get("json")
			jname, opts, _ := strings.Cut(tag, ",")
			if p := s.Properties[jname]; p != nil && f.Tag.Get("null") == "true" {
				// A member that may be null or absent (null:"true"), as
				// upstream's Option members are when sent to us.
				if p.Ref != "" {
					s.Properties[jname] = &huma.Schema{Description: p.Description, AnyOf: []*huma.Schema{{Ref: p.Ref}, {Type: "null"}}}
				} else {
					p.Nullable = true
				}
				continue
			}
			if jname == "" || jname == "-" || strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero") || f.Tag.Get("nullable") == "false" {
				continue
			}
			if f.Type.Kind() != reflect.Pointer || f.Type.Elem().Kind() != reflect.Struct {
				continue
			}
			p := s.Properties[jname]
			if p == nil || p.Ref == "" {
				continue
			}
			s.Properties[jname] = &huma.Schema{
				Description: p.Description,
				AnyOf:       []*huma.Schema{{Ref: p.Ref}, {Type: "null"}},
			}
		}
	}
}

// structFields yields t's fields, those of embedded structs included.
func structFields(t reflect.Type) func(func(reflect.StructField) bool) {
	return func(yield func(reflect.StructField) bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.Tag.Get("json") == "" {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					for g := range structFields(ft) {
						if !yield(g) {
							return
						}
					}
					continue
				}
			}
			if !yield(f) {
				return
			}
		}
	}
}

func init() {
	// A nil slice is sent as [] by our types where upstream's answer has an
	// array: say so, rather than huma's default of nullable arrays.
	huma.DefaultArrayNullable = false
}
