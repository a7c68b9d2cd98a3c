package sledconfig

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
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
	// fields are a struct's fields, by JSON name.
	fields map[string]*fieldPlan
}

type fieldPlan struct {
	name  string
	index int
	plan  *plan
}

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
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
	default:
		panic(fmt.Sprintf("sledconfig: cannot decode %v", t))
	}
	return p
}

// field finds a struct's field for a member name as encoding/json does:
// the exact name, else one equal but for letter case (exact is false).
func (p *plan) field(key string) (f *fieldPlan, exact bool) {
	if f, ok := p.fields[key]; ok {
		return f, true
	}
	for name, f := range p.fields {
		if strings.EqualFold(name, key) {
			return f, false
		}
	}
	return nil, false
}

// decoder decodes nodes into Go values (see plan).
type decoder struct {
	// t is the tree of the nodes, canonicalized.
	t *tree
	// err is the first type mismatch.
	err *json.UnmarshalTypeError
	// fields are the names of the struct fields leading to the value
	// being decoded, and structType the struct holding the innermost one.
	fields     []string
	structType reflect.Type
	// unknown is set once a member's key is no field's name as written:
	// only then can a key differ from a field name in letter case alone.
	unknown bool
}

// decode decodes n, a node of t (canonicalized), into *ptr and returns the
// first type mismatch, or nil.
func decode[T any](t *tree, n *node, ptr *T) error {
	d := decoder{t: t}
	d.value(n, reflect.ValueOf(ptr).Elem(), planFor(reflect.TypeFor[T]()))
	if d.err != nil {
		return d.err
	}
	return nil
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
	e := &json.UnmarshalTypeError{Value: value, Type: t, Offset: int64(n.start)}
	if d.structType != nil || len(d.fields) > 0 {
		e.Struct = d.structType.Name()
		e.Field = strings.Join(d.fields, ".")
	}
	d.err = e
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
		outer, depth := d.structType, len(d.fields)
		kids := d.t.kids(n)
		for i := range kids {
			m := &kids[i]
			f, exact := p.field(d.t.key(m))
			d.unknown = d.unknown || !exact
			if f == nil {
				continue
			}
			d.structType = p.t
			d.fields = append(d.fields[:depth], f.name)
			d.value(m, v.Field(f.index), f.plan)
		}
		d.structType, d.fields = outer, d.fields[:depth]
	}
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
