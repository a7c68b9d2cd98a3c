package api_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
)

// TestDocumentMatchesUpstream keeps our document from drifting from
// upstream's silently: every operation of ours whose path and method are
// upstream's has the same path parameters, a request body exactly where
// upstream has one, the same success statuses, and request and response
// schemas compatible with upstream's (what we declare, upstream declares;
// what upstream requires of an answer, we send; what we require of a
// request, upstream sends).
func TestDocumentMatchesUpstream(t *testing.T) {
	b, err := json.Marshal(api.Document())
	if err != nil {
		t.Fatal(err)
	}
	ours := decodeDoc(t, b)
	up, err := os.ReadFile(openapitest.UpstreamPath(t, openapitest.SledAgent))
	if err != nil {
		t.Fatal(err)
	}
	upstream := decodeDoc(t, up)
	var compared []string
	for _, path := range slices.Sorted(maps.Keys(ours.paths())) {
		for _, method := range []string{"get", "put", "post", "delete", "patch"} {
			o := ours.op(path, method)
			u := upstream.op(path, method)
			if o == nil || u == nil {
				continue
			}
			name := strings.ToUpper(method) + " " + path
			compared = append(compared, name)
			problems := compareOps(ours, upstream, o, u)
			if why, ok := knownDrift[name]; ok {
				if len(problems) == 0 {
					t.Errorf("%s now matches upstream's: remove it from knownDrift", name)
				}
				t.Logf("%s differs from upstream's (%s): %s", name, why, strings.Join(problems, "; "))
				continue
			}
			for _, p := range problems {
				t.Errorf("%s: %s", name, p)
			}
		}
	}
	for _, want := range []string{"PUT /omicron-config", "GET /inventory", "GET /zones", "PUT /vmms/{propolis_id}",
		"DELETE /vmms/{propolis_id}", "PUT /vmms/{propolis_id}/state", "GET /vmms/{propolis_id}/state",
		"POST /local-storage", "DELETE /local-storage",
		"GET /v2p", "PUT /v2p", "DELETE /v2p", "GET /vpc-routes", "PUT /vpc-routes", "PUT /eip-gateways",
		"PUT /vpc/{vpc_id}/firewall/rules", "PUT /vmms/{propolis_id}/external-ip", "DELETE /vmms/{propolis_id}/external-ip",
		"PUT /vmms/{propolis_id}/attached-subnets", "POST /vmms/{propolis_id}/attached-subnets",
		"DELETE /vmms/{propolis_id}/attached-subnets", "DELETE /vmms/{propolis_id}/attached-subnets/{subnet}", "PUT /probes"} {
		if !slices.Contains(compared, want) {
			t.Errorf("%s was not compared with upstream's (compared: %v)", want, compared)
		}
	}
}

// knownDrift are the operations known to differ from upstream's, and why.
// An entry that no longer differs fails the test, so the list only shrinks.
var knownDrift = map[string]string{}

// The comparison catches what drifts: a schema that lost a required member,
// a member upstream does not have, another type, a missing body, another
// status and another path parameter.
func TestCompareOpsCatchesDrift(t *testing.T) {
	upstream := decodeDoc(t, []byte(`{"paths": {"/x/{id}": {"put": {
		"parameters": [{"in": "path", "name": "id"}],
		"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}},
		"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/R"}}}}}}}},
		"components": {"schemas": {
			"B": {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"}}, "required": ["a"]},
			"R": {"type": "object", "properties": {"s": {"oneOf": [{"type": "string", "enum": ["on"]}, {"type": "string", "enum": ["off"]}]}, "m": {"nullable": true, "allOf": [{"$ref": "#/components/schemas/B"}]}}, "required": ["s"]}}}}`))
	good := `{"paths": {"/x/{id}": {"put": {
		"parameters": [{"in": "path", "name": "id"}],
		"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}},
		"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/R"}}}}, "400": {}}}}},
		"components": {"schemas": {
			"B": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
			"R": {"type": "object", "properties": {"s": {"type": "string", "enum": ["on", "off"]}, "m": {"anyOf": [{"$ref": "#/components/schemas/B"}, {"type": "null"}]}}, "required": ["s", "m"]}}}}`
	check := func(doc string) []string {
		ours := decodeDoc(t, []byte(doc))
		return compareOps(ours, upstream, ours.op("/x/{id}", "put"), upstream.op("/x/{id}", "put"))
	}
	if p := check(good); len(p) > 0 {
		t.Fatalf("a compatible operation: %v", p)
	}
	for _, c := range []struct{ from, to, want string }{
		{`"required": ["s", "m"]`, `"required": ["m"]`, "lacks upstream's required member s"},
		{`"properties": {"a": {"type": "string"}}`, `"properties": {"a": {"type": "string"}, "z": {"type": "string"}}`, "member z is not upstream's"},
		{`"properties": {"a": {"type": "string"}}, "required": ["a"]`, `"properties": {"a": {"type": "string"}, "n": {"type": "integer"}}, "required": ["a", "n"]`, "requires n, which upstream does not"},
		{`{"a": {"type": "string"}}`, `{"a": {"type": "integer"}}`, "type integer, upstream's string"},
		{`"enum": ["on", "off"]`, `"enum": ["on", "dim"]`, "values [dim] are not upstream's"},
		{`{"$ref": "#/components/schemas/B"}, {"type": "null"}`, `{"$ref": "#/components/schemas/B"}`, ""},
		{`"requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}},`, ``, "no request body"},
		{`"200": {"content"`, `"201": {"content"`, "success statuses [201], upstream's [200]"},
		{`"name": "id"`, `"name": "key"`, "path parameters [key], upstream's [id]"},
	} {
		doc := strings.Replace(good, c.from, c.to, 1)
		if doc == good {
			t.Fatalf("%q is not in the document", c.from)
		}
		p := strings.Join(check(doc), "; ")
		if c.want == "" {
			if p != "" {
				t.Errorf("%s → %s: %s", c.from, c.to, p)
			}
			continue
		}
		if !strings.Contains(p, c.want) {
			t.Errorf("%s → %s: problems %q, want one saying %q", c.from, c.to, p, c.want)
		}
	}
	// Nullable where upstream is not, in an answer.
	ours := decodeDoc(t, []byte(strings.Replace(good, `"s": {"type": "string", "enum": ["on", "off"]}`, `"s": {"type": ["string", "null"], "enum": ["on", "off"]}`, 1)))
	if p := strings.Join(compareOps(ours, upstream, ours.op("/x/{id}", "put"), upstream.op("/x/{id}", "put")), "; "); !strings.Contains(p, "null") {
		t.Errorf("a nullable answer member: problems %q", p)
	}
}

type doc struct{ v map[string]any }

func decodeDoc(t *testing.T, b []byte) doc {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return doc{v}
}

func (d doc) paths() map[string]any { m, _ := d.v["paths"].(map[string]any); return m }

func (d doc) op(path, method string) map[string]any {
	item, _ := d.paths()[path].(map[string]any)
	op, _ := item[method].(map[string]any)
	return op
}

// resolve follows references and the wrappers both generators put around
// them (upstream's allOf of one with nullable, huma's anyOf with null) and
// says whether null is allowed.
func (d doc) resolve(s map[string]any) (out map[string]any, nullable bool) {
	for range 16 {
		if s == nil {
			return nil, nullable
		}
		if n, _ := s["nullable"].(bool); n {
			nullable = true
		}
		if ts, ok := s["type"].([]any); ok && slices.Contains(ts, any("null")) {
			nullable = true
		}
		if ref, ok := s["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/components/schemas/")
			comps, _ := d.v["components"].(map[string]any)
			schemas, _ := comps["schemas"].(map[string]any)
			s, _ = schemas[name].(map[string]any)
			continue
		}
		if all, ok := s["allOf"].([]any); ok && len(all) == 1 && s["properties"] == nil {
			s, _ = all[0].(map[string]any)
			continue
		}
		if alts, ok := s["anyOf"].([]any); ok && len(alts) == 2 {
			var rest []map[string]any
			for _, a := range alts {
				a, _ := a.(map[string]any)
				if a["type"] == "null" {
					nullable = true
					continue
				}
				rest = append(rest, a)
			}
			if len(rest) == 1 {
				s = rest[0]
				continue
			}
		}
		return s, nullable
	}
	return s, nullable
}

// shape is what is compared of a schema.
type shape struct {
	kind     string          // "any", "object", "array", "string", "integer", "number", "boolean"
	enum     []string        // string values, when restricted
	format   string          // string format
	props    map[string]any  // object members (a union's: every branch's)
	required map[string]bool // required members (a union's: of every branch)
	anyReq   map[string]bool // required members of some branch
	extra    map[string]any  // additionalProperties as a schema
	items    map[string]any  // array items
	open     bool            // an object that declares no member
}

func (d doc) shape(s map[string]any) shape {
	var sh shape
	branches := []map[string]any{s}
	for _, k := range []string{"oneOf", "anyOf"} {
		if l, ok := s[k].([]any); ok {
			branches = nil
			for _, b := range l {
				b, _ := b.(map[string]any)
				b, _ = d.resolve(b)
				branches = append(branches, b)
			}
		}
	}
	sh.props = map[string]any{}
	sh.anyReq = map[string]bool{}
	for i, b := range branches {
		kind := typeOf(b)
		if sh.kind == "" {
			sh.kind = kind
		} else if sh.kind != kind {
			sh.kind = "any" // a union of kinds: not compared
		}
		for _, e := range asSlice(b["enum"]) {
			if e, ok := e.(string); ok {
				sh.enum = append(sh.enum, e)
			}
		}
		sh.format, _ = b["format"].(string)
		props, _ := b["properties"].(map[string]any)
		for k, v := range props {
			// A member of several branches is any of its schemas.
			if prev, ok := sh.props[k].(map[string]any); ok {
				alts, _ := prev["oneOf"].([]any)
				if prev["x-merged"] != true {
					alts = []any{prev}
				}
				sh.props[k] = map[string]any{"oneOf": append(alts, v), "x-merged": true}
				continue
			}
			sh.props[k] = v
		}
		req := map[string]bool{}
		for _, r := range asSlice(b["required"]) {
			if r, ok := r.(string); ok {
				req[r] = true
				sh.anyReq[r] = true
			}
		}
		if i == 0 {
			sh.required = req
		} else {
			for r := range sh.required {
				if !req[r] {
					delete(sh.required, r)
				}
			}
		}
		if e, ok := b["additionalProperties"].(map[string]any); ok {
			sh.extra = e
		}
		if it, ok := b["items"].(map[string]any); ok {
			sh.items = it
		}
	}
	sh.open = sh.kind == "object" && len(sh.props) == 0 && sh.extra == nil
	return sh
}

func typeOf(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if x != "null" {
				return x.(string)
			}
		}
	}
	if s["properties"] != nil || s["additionalProperties"] != nil {
		return "object"
	}
	if s["enum"] != nil {
		return "string"
	}
	return "any"
}

func asSlice(v any) []any { l, _ := v.([]any); return l }

// compareOps lists what differs between operation o of ours and u of
// upstream's.
func compareOps(ours, upstream doc, o, u map[string]any) []string {
	var problems []string
	if op, up := pathParams(o), pathParams(u); !slices.Equal(op, up) {
		problems = append(problems, fmt.Sprintf("path parameters %v, upstream's %v", op, up))
	}
	ob, ub := bodySchema(o), bodySchema(u)
	switch {
	case ub != nil && ob == nil:
		problems = append(problems, "no request body; upstream has one")
	case ub == nil && ob != nil:
		problems = append(problems, "a request body; upstream has none")
	case ub != nil:
		c := &comparer{ours: ours, upstream: upstream, seen: map[string]bool{}}
		c.compare("request body", ob, ub, true)
		problems = append(problems, c.problems...)
	}
	os, us := successes(o), successes(u)
	if !slices.Equal(os, us) {
		problems = append(problems, fmt.Sprintf("success statuses %v, upstream's %v", os, us))
		return problems
	}
	for _, code := range os {
		or, ur := responseSchema(o, code), responseSchema(u, code)
		switch {
		case ur != nil && or == nil:
			problems = append(problems, fmt.Sprintf("answer %s has no body; upstream's has one", code))
		case ur == nil && or != nil:
			problems = append(problems, fmt.Sprintf("answer %s has a body; upstream's has none", code))
		case ur != nil:
			c := &comparer{ours: ours, upstream: upstream, seen: map[string]bool{}}
			c.compare("answer "+code, or, ur, false)
			problems = append(problems, c.problems...)
		}
	}
	return problems
}

func pathParams(op map[string]any) []string {
	var out []string
	for _, p := range asSlice(op["parameters"]) {
		p, _ := p.(map[string]any)
		if p["in"] == "path" {
			out = append(out, p["name"].(string))
		}
	}
	sort.Strings(out)
	return out
}

func bodySchema(op map[string]any) map[string]any {
	rb, _ := op["requestBody"].(map[string]any)
	content, _ := rb["content"].(map[string]any)
	mt, _ := content["application/json"].(map[string]any)
	s, _ := mt["schema"].(map[string]any)
	return s
}

func successes(op map[string]any) []string {
	var out []string
	for code := range op["responses"].(map[string]any) {
		if strings.HasPrefix(code, "2") {
			out = append(out, code)
		}
	}
	sort.Strings(out)
	return out
}

func responseSchema(op map[string]any, code string) map[string]any {
	r, _ := op["responses"].(map[string]any)[code].(map[string]any)
	content, _ := r["content"].(map[string]any)
	mt, _ := content["application/json"].(map[string]any)
	s, _ := mt["schema"].(map[string]any)
	return s
}

type comparer struct {
	ours, upstream doc
	seen           map[string]bool
	problems       []string
}

func (c *comparer) add(where, format string, args ...any) {
	c.problems = append(c.problems, where+": "+fmt.Sprintf(format, args...))
}

// compare checks schema o of ours against upstream's u at where. In a
// request (ours accepts what upstream sends) we may not require more or
// refuse null where upstream allows it; in an answer (upstream's clients
// decode what we send) we must send every required member and no null
// where upstream has none.
func (c *comparer) compare(where string, o, u map[string]any, request bool) {
	key := fmt.Sprintf("%p %p %v", o, u, request)
	if c.seen[key] {
		return
	}
	c.seen[key] = true
	o, onull := c.ours.resolve(o)
	u, unull := c.upstream.resolve(u)
	if request && unull && !onull {
		c.add(where, "refuses null, which upstream may send")
	}
	if !request && onull && !unull {
		c.add(where, "may be null, which upstream's clients refuse")
	}
	os, us := c.ours.shape(o), c.upstream.shape(u)
	if us.kind == "any" || os.kind == "any" || (os.open && us.kind == "object") {
		return // not constrained, or kept as sent
	}
	if os.kind != us.kind && !(os.kind == "integer" && us.kind == "number") {
		c.add(where, "type %s, upstream's %s", os.kind, us.kind)
		return
	}
	if len(os.enum) > 0 && len(us.enum) > 0 {
		var extra []string
		for _, e := range os.enum {
			if !slices.Contains(us.enum, e) {
				extra = append(extra, e)
			}
		}
		if len(extra) > 0 {
			c.add(where, "values %v are not upstream's %v", extra, us.enum)
		}
	}
	if os.kind == "string" && os.format != "" && us.format != "" && os.format != us.format {
		c.add(where, "format %s, upstream's %s", os.format, us.format)
	}
	switch os.kind {
	case "array":
		if os.items != nil && us.items != nil {
			c.compare(where+"[]", os.items, us.items, request)
		}
	case "object":
		for _, name := range slices.Sorted(maps.Keys(os.props)) {
			up, ok := us.props[name]
			if !ok {
				c.add(where, "member %s is not upstream's", name)
				continue
			}
			op, _ := os.props[name].(map[string]any)
			upm, _ := up.(map[string]any)
			c.compare(where+"."+name, op, upm, request)
		}
		for _, name := range slices.Sorted(maps.Keys(us.required)) {
			if !request && !os.required[name] {
				c.add(where, "lacks upstream's required member %s", name)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(os.required)) {
			if request && !us.anyReq[name] {
				c.add(where, "requires %s, which upstream does not", name)
			}
		}
		if os.extra != nil && us.extra != nil {
			c.compare(where+"{}", os.extra, us.extra, request)
		}
	}
}
