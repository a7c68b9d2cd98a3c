package sledconfig

import (
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// A plan says how values of one Go type decode from nodes, as
// encoding/json decodes them: struct members by exact name, else by a name
// equal but for letter case; unknown members ignored; null leaving
// strings, numbers, booleans and structs as they are and setting pointers,
// slices and maps to nil; a value of the wrong JSON type leaving its target
// as it is (a pointer allocated) and the first such mismatch reported as a
// *json.UnmarshalTypeError naming the struct fields that lead to it.
// Decoding from nodes lets Parse read a document once.
type plan struct {
	t    reflect.Type
	kind reflect.Kind
	// raw: a json.RawMessage, which takes the value's canonical form.
	raw bool
	// elem is the element of a pointer, slice or map.
	elem *plan
	// fields are a struct's fields, by JSON name; sorted holds them too,
	// sorted by name (names: their names), for decoder.value's walk over
	// an object's members, which are sorted the same way.
	fields map[string]*fieldPlan
	sorted []*fieldPlan
	names  []string
}

type fieldPlan struct {
	name  string
	index int
	plan  *plan
}

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
	rawMapType          = reflect.TypeFor[map[string]json.RawMessage]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// plans caches planFor.
var plans sync.Map // reflect.Type → *plan

// planFor returns the plan of t, which must be made of what the config
// types are made of: structs without embedded fields, pointers, strings,
// booleans, unsigned integers, slices, maps keyed by string and
// json.RawMessage. Anything else panics (a type added to the config that
// this decoder does not know must not be decoded otherwise than
// encoding/json would).
func planFor(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	p := buildPlan(t, map[reflect.Type]*plan{})
	plans.Store(t, p)
	return p
}

func buildPlan(t reflect.Type, building map[reflect.Type]*plan) *plan {
	if p, ok := building[t]; ok {
		return p
	}
	p := &plan{t: t, kind: t.Kind()}
	building[t] = p
	if t == rawMessageType {
		p.raw = true
		return p
	}
	if t.Implements(jsonUnmarshalerType) || reflect.PointerTo(t).Implements(jsonUnmarshalerType) ||
		t.Implements(textUnmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType) {
		panic(fmt.Sprintf("sledconfig: cannot decode %v, which decodes itself", t))
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
	case reflect.Pointer, reflect.Slice:
		p.elem = buildPlan(t.Elem(), building)
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("sledconfig: cannot decode %v: keys are not strings", t))
		}
		p.elem = buildPlan(t.Elem(), building)
	case reflect.Struct:
		p.fields = make(map[string]*fieldPlan, t.NumField())
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				panic(fmt.Sprintf("sledconfig: cannot decode %v: embedded field %s", t, f.Name))
			}
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" && opts == "" {
				continue
			}
			if strings.Contains(opts, "string") {
				panic(fmt.Sprintf("sledconfig: cannot decode %v: field %s has the string option", t, f.Name))
			}
			if name == "" {
				name = f.Name
			}
			p.fields[name] = &fieldPlan{name: name, index: i, plan: buildPlan(f.Type, building)}
		}
		p.sorted = slices.SortedFunc(maps.Values(p.fields), func(a, b *fieldPlan) int { return strings.Compare(a.name, b.name) })
		for _, f := range p.sorted {
			p.names = append(p.names, f.name)
		}
	default:
		panic(fmt.Sprintf("sledconfig: cannot decode %v", t))
	}
	return p
}

// foldField finds a struct's field whose name equals key but for letter
// case, as encoding/json does when no name equals key exactly. (No two
// fields of the config types have names that are equal but for letter
// case, so which of several would match never arises.)
func (p *plan) foldField(key string) *fieldPlan {
	for _, f := range p.sorted {
		if strings.EqualFold(f.name, key) {
			return f
		}
	}
	return nil
}

// decoder decodes nodes into Go values (see plan).
type decoder struct {
	// t is the tree of the nodes, canonicalized.
	t *tree
	// err is the first type mismatch. Its Struct and Field are filled in
	// on the way back out of the structs that hold it (see inField): the
	// path is not kept while decoding, as it is needed only then.
	err *json.UnmarshalTypeError
	// unknown is set once a member's key is no field's name as written:
	// only then can a key differ from a field name in letter case alone.
	unknown bool
}

// decode decodes n into v, of plan p, and returns the first type mismatch,
// or nil. One decoder decodes many values in turn.
func (d *decoder) decode(n *node, v reflect.Value, p *plan) *json.UnmarshalTypeError {
	d.err, d.unknown = nil, false
	d.value(n, v, p)
	return d.err
}

// mismatch records that n does not decode into a t (value: how
// encoding/json names n in its message, n's kind when "").
func (d *decoder) mismatch(n *node, t reflect.Type, value string) {
	if d.err != nil {
		return
	}
	if value == "" {
		value = n.kindName()
	}
	d.err = &json.UnmarshalTypeError{Value: value, Type: t, Offset: int64(n.start)}
}

// inField is called on the way out of the field named name of a struct of
// type st when the first mismatch was found in it: encoding/json names the
// innermost struct, and the path of field names from the outermost.
func (d *decoder) inField(st reflect.Type, name string) {
	if d.err.Field == "" { // the innermost
		d.err.Struct, d.err.Field = st.Name(), name
		return
	}
	d.err.Field = name + "." + d.err.Field
}

func (d *decoder) value(n *node, v reflect.Value, p *plan) {
	if p.raw {
		v.SetBytes(d.t.canonical[n.start:n.end:n.end])
		return
	}
	if n.kind == 'n' {
		switch p.kind {
		case reflect.Pointer, reflect.Slice, reflect.Map:
			v.SetZero()
		}
		return
	}
	switch p.kind {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(p.t.Elem()))
		}
		d.value(n, v.Elem(), p.elem)
	case reflect.String:
		if n.kind != '"' {
			d.mismatch(n, p.t, "")
			return
		}
		v.SetString(d.t.str(n))
	case reflect.Bool:
		if n.kind != 't' && n.kind != 'f' {
			d.mismatch(n, p.t, "")
			return
		}
		v.SetBool(n.kind == 't')
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		if n.kind != '0' {
			d.mismatch(n, p.t, "")
			return
		}
		u, err := strconv.ParseUint(d.t.str(n), 10, 64)
		if err != nil || v.OverflowUint(u) {
			d.mismatch(n, p.t, "number "+d.t.str(n))
			return
		}
		v.SetUint(u)
	case reflect.Slice:
		if n.kind != '[' {
			d.mismatch(n, p.t, "")
			return
		}
		kids := d.t.kids(n)
		s := reflect.MakeSlice(p.t, len(kids), len(kids))
		for i := range kids {
			d.value(&kids[i], s.Index(i), p.elem)
		}
		v.Set(s)
	case reflect.Map:
		if n.kind != '{' {
			d.mismatch(n, p.t, "")
			return
		}
		kids := d.t.kids(n)
		if v.IsNil() {
			v.Set(reflect.MakeMapWithSize(p.t, len(kids)))
		}
		if p.t == rawMapType {
			// What the loop below does, without a reflect.Value for
			// each key and value (the disks and datasets are many).
			raw := v.Interface().(map[string]json.RawMessage)
			for i := range kids {
				m := &kids[i]
				raw[d.t.key(m)] = d.t.canonical[m.start:m.end:m.end]
			}
			return
		}
		elem := reflect.New(p.t.Elem()).Elem()
		for i := range kids {
			m := &kids[i]
			elem.SetZero()
			d.value(m, elem, p.elem)
			v.SetMapIndex(reflect.ValueOf(d.t.key(m)).Convert(p.t.Key()), elem)
		}
	case reflect.Struct:
		if n.kind != '{' {
			d.mismatch(n, p.t, "")
			return
		}
		kids := d.t.kids(n)
		// The members and p.sorted are both sorted by name: the field
		// named as a member is found by walking both together.
		next := 0
		for i := range kids {
			m := &kids[i]
			key := d.t.key(m)
			// Most often the member is the next field; else it is
			// looked for among the fields after it.
			var f *fieldPlan
			if next < len(p.names) && p.names[next] == key {
				f = p.sorted[next]
				next++
			} else if j, found := slices.BinarySearch(p.names[next:], key); found {
				f = p.sorted[next+j]
				next += j + 1
			} else {
				next += j
				d.unknown = true
				if f = p.foldField(key); f == nil {
					continue
				}
			}
			if f.plan.kind == reflect.String && m.kind == '"' {
				// What d.value does, without the call: most fields
				// are strings.
				v.Field(f.index).SetString(d.t.str(m))
				continue
			}
			failed := d.err != nil
			d.value(m, v.Field(f.index), f.plan)
			if !failed && d.err != nil {
				d.inField(p.t, f.name)
			}
		}
	}
}

// appendKnown appends the canonical form of n, which decodes into a value
// of plan p, without the members of its objects that are no field's name
// (at any depth): what the decoder reads of it. n must have decoded
// without a type mismatch.
func (t *tree) appendKnown(b []byte, n *node, p *plan) []byte {
	for p.kind == reflect.Pointer {
		p = p.elem
	}
	switch {
	case p.raw || n.kind != '{' && n.kind != '[':
		return append(b, t.canonical[n.start:n.end]...)
	case n.kind == '[' && p.kind == reflect.Slice:
		b = append(b, '[')
		for i, k := range t.kids(n) {
			if i > 0 {
				b = append(b, ',')
			}
			b = t.appendKnown(b, &k, p.elem)
		}
		return append(b, ']')
	case n.kind == '{' && (p.kind == reflect.Struct || p.kind == reflect.Map):
		b = append(b, '{')
		first := true
		for i := range t.kids(n) {
			m := &t.kids(n)[i]
			e := p.elem
			if p.kind == reflect.Struct {
				f := p.fields[t.key(m)]
				if f == nil {
					continue
				}
				e = f.plan
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendJSONString(b, t.key(m), m.keyEscape)
			b = append(b, ':')
			b = t.appendKnown(b, m, e)
		}
		return append(b, '}')
	}
	return append(b, t.canonical[n.start:n.end]...)
}

// checkCase is checkFieldNames over nodes, whose members are sorted: the
// first key (in key order, depth first) that differs from a field name of
// the struct it decodes into only in letter case, with its path. p is the
// plan of the Go type n, a node of t, decodes into.
func checkCase(t *tree, n *node, p *plan) *caseError {
	c := caseChecker{t: t}
	return c.check(n, p)
}

// caseChecker walks nodes for checkCase.
type caseChecker struct {
	t *tree
	// path leads to the node being checked.
	path []pathStep
}

// pathStep is one step of a path: a struct field (".key", or "key" first),
// a map key ("[\"key\"]") or an array index ("[i]").
type pathStep struct {
	key   string
	field bool
	index int // ≥ 0 for an array index
}

func (c *caseChecker) check(n *node, p *plan) *caseError {
	for p.kind == reflect.Pointer {
		p = p.elem
	}
	switch {
	case p.raw:
	case p.kind == reflect.Struct && n.kind == '{':
		kids := c.t.kids(n)
		for i := range kids {
			m := &kids[i]
			key := c.t.key(m)
			if f, ok := p.fields[key]; ok {
				if err := c.sub(m, f.plan, pathStep{key: key, field: true, index: -1}); err != nil {
					return err
				}
				continue
			}
			for name := range p.fields {
				if strings.EqualFold(name, key) {
					c.path = append(c.path, pathStep{key: key, field: true, index: -1})
					return &caseError{path: c.render(), want: name}
				}
			}
		}
	case p.kind == reflect.Map && n.kind == '{':
		kids := c.t.kids(n)
		for i := range kids {
			m := &kids[i]
			if err := c.sub(m, p.elem, pathStep{key: c.t.key(m), index: -1}); err != nil {
				return err
			}
		}
	case p.kind == reflect.Slice && n.kind == '[':
		kids := c.t.kids(n)
		for i := range kids {
			if err := c.sub(&kids[i], p.elem, pathStep{index: i}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *caseChecker) sub(n *node, p *plan, step pathStep) *caseError {
	if n.kind != '{' && n.kind != '[' {
		return nil // nothing below
	}
	c.path = append(c.path, step)
	err := c.check(n, p)
	c.path = c.path[:len(c.path)-1]
	return err
}

func (c *caseChecker) render() string {
	var b strings.Builder
	for i, s := range c.path {
		switch {
		case s.index >= 0:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case !s.field:
			b.WriteString("[" + strconv.Quote(s.key) + "]")
		default:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key)
		}
	}
	return b.String()
}
