package told

import "github.com/danielgtaylor/huma/v2"

// The OpenAPI schemas of the unions whose members differ in type by their
// tag, as upstream's document has them (the API's document is generated
// from these types).

func tagged(tag string, value *huma.Schema) *huma.Schema {
	s := &huma.Schema{Type: huma.TypeObject, Properties: map[string]*huma.Schema{
		"type": {Type: huma.TypeString, Enum: []any{tag}},
	}, Required: []string{"type"}}
	if value != nil {
		s.Properties["value"] = value
		s.Required = append(s.Required, "value")
	}
	return s
}

// Schema documents upstream's RouterTarget.
func (RouterTarget) Schema(huma.Registry) *huma.Schema {
	net := &huma.Schema{Type: huma.TypeString, Description: "An IP network."}
	gw := &huma.Schema{OneOf: []*huma.Schema{
		tagged("system", nil),
		tagged("instance", &huma.Schema{Type: huma.TypeString, Format: "uuid"}),
	}}
	return &huma.Schema{Description: "The target of a route.", OneOf: []*huma.Schema{
		tagged("drop", nil),
		tagged("internet_gateway", gw),
		tagged("ip", &huma.Schema{Type: huma.TypeString, Format: "ip"}),
		tagged("vpc_subnet", net),
	}}
}

// Schema documents upstream's HostIdentifier.
func (HostIdentifier) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Description: "An IP host or network, or a whole VPC by its VNI.", OneOf: []*huma.Schema{
		tagged("ip", &huma.Schema{Type: huma.TypeString, Description: "An IP network."}),
		tagged("vpc", &huma.Schema{Type: huma.TypeInteger, Format: "uint32", Minimum: ptr(0.0)}),
	}}
}

func ptr[T any](v T) *T { return &v }
