package sledconfig

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// tree is a document read by parseTree: the whole document is read once
// into nodes, which Parse then encodes in canonical form and decodes into the
// typed fields, without reading the bytes again. No node holds a pointer:
// a node's strings are spans of the document (or, for a string that had
// escapes, of text) and its kids a range of nodes, so the collector never
// walks a tree, however large.
type tree struct {
	src string // the document
	// text holds the values of the strings that had escapes.
	text string
	// nodes are every value; a container's kids are consecutive, and the
	// root is last.
	nodes []node
	// canonical is the canonical form, once appendCanonical has written
	// it; the nodes' start and end are in it.
	canonical []byte
}

// node is one value of a tree.
type node struct {
	kind byte // 'n', 't', 'f', '"' (string), '0' (number), '{', '['
	// escape says that the canonical form of str (keyEscape: of key)
	// cannot be copied as written (it had escapes, or may hold U+2028 or
	// U+2029, which the canonical form escapes).
	escape, keyEscape bool
	// key is the member's name, for a member of an object.
	key span
	// str is a string's value, a number as written.
	str span
	// kids are an object's members (sorted by key) or an array's
	// elements: nodes[kid : kid+nkids].
	kid, nkids int32
	// start and end bound the value in the canonical form, once
	// appendCanonical has written it.
	start, end int32
}

// span is a string of a tree: src[off:off+n], or text's if inText.
type span struct {
	off, n int32
	inText bool
}

func (t *tree) span(s span) string {
	if s.inText {
		return t.text[s.off : s.off+s.n]
	}
	return t.src[s.off : s.off+s.n]
}

// root is the document's value.
func (t *tree) root() *node { return &t.nodes[len(t.nodes)-1] }

// key is n's name as a member of an object.
func (t *tree) key(n *node) string { return t.span(n.key) }

// str is a string's value, or a number as written.
func (t *tree) str(n *node) string { return t.span(n.str) }

// kids are a container's members or elements.
func (t *tree) kids(n *node) []node { return t.nodes[n.kid : n.kid+n.nkids : n.kid+n.nkids] }

// member returns the object's member named key, or nil.
func (t *tree) member(n *node, key string) *node {
	if n == nil || n.kind != '{' {
		return nil
	}
	kids := t.kids(n)
	if len(kids) <= 8 {
		for i := range kids {
			if t.key(&kids[i]) == key {
				return &kids[i]
			}
		}
		return nil
	}
	i, ok := slices.BinarySearchFunc(kids, key, func(m node, k string) int { return strings.Compare(t.key(&m), k) })
	if !ok {
		return nil
	}
	return &kids[i]
}

// kindName is how encoding/json names the JSON kind of a value in its type
// errors.
func (n *node) kindName() string {
	switch n.kind {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "bool"
	}
	return "null"
}

// parseTree reads one JSON value (and nothing after it but white space) into
// a tree, each object's members sorted by key. It reports false for anything
// decodeDocument refuses (malformed JSON, a duplicate key, nesting deeper
// than maxNesting), without saying why: decodeDocument, which reads token by
// token, says what and where. data must be valid UTF-8.
func parseTree(data []byte) (*tree, bool) {
	// About one value in every 30 bytes of a config.
	p := treeParser{src: string(data), stack: make([]node, 0, 64), nodes: make([]node, 0, len(data)/28+1)}
	if !p.value(0) {
		return nil, false
	}
	p.space()
	if p.i != len(p.src) {
		return nil, false
	}
	t := &tree{src: p.src, text: string(p.text), nodes: append(p.nodes, p.stack[0])}
	return t, true
}

type treeParser struct {
	src string
	i   int
	// stack holds the values read whose container is still being read.
	stack []node
	// nodes are the kids of the containers read, each container's
	// together.
	nodes []node
	// text is the tree's text: the strings that had escapes.
	text []byte
}

// srcSpan is the span of src from start to end.
func srcSpan(start, end int) span { return span{off: int32(start), n: int32(end - start)} }

// spanOf returns the string of a span being read.
func (p *treeParser) spanOf(s span) string {
	if s.inText {
		return string(p.text[s.off : s.off+s.n])
	}
	return p.src[s.off : s.off+s.n]
}

func (p *treeParser) space() {
	i, src := p.i, p.src
	for i < len(src) && (src[i] == ' ' || src[i] == '\n' || src[i] == '\t' || src[i] == '\r') {
		i++
	}
	p.i = i
}

// value reads a value and pushes it on the stack.
func (p *treeParser) value(depth int) bool {
	p.space()
	if p.i >= len(p.src) {
		return false
	}
	switch c := p.src[p.i]; {
	case c == '{':
		if depth >= maxNesting {
			return false
		}
		return p.object(depth)
	case c == '[':
		if depth >= maxNesting {
			return false
		}
		return p.array(depth)
	case c == '"':
		s, esc, ok := p.string()
		p.stack = append(p.stack, node{kind: '"', str: s, escape: esc})
		return ok
	case c == '-' || '0' <= c && c <= '9':
		s, ok := p.number()
		p.stack = append(p.stack, node{kind: '0', str: s})
		return ok
	default:
		for _, lit := range []string{"null", "true", "false"} {
			if strings.HasPrefix(p.src[p.i:], lit) {
				p.stack = append(p.stack, node{kind: lit[0]})
				p.i += len(lit)
				return true
			}
		}
		return false
	}
}

func (p *treeParser) object(depth int) bool {
	p.i++ // '{'
	mark := len(p.stack)
	p.space()
	if p.i < len(p.src) && p.src[p.i] == '}' {
		p.i++
		p.stack = append(p.stack, node{kind: '{'})
		return true
	}
	for {
		p.space()
		if p.i >= len(p.src) || p.src[p.i] != '"' {
			return false
		}
		key, esc, ok := p.string()
		if !ok {
			return false
		}
		p.space()
		if p.i >= len(p.src) || p.src[p.i] != ':' {
			return false
		}
		p.i++
		if !p.value(depth + 1) {
			return false
		}
		m := &p.stack[len(p.stack)-1]
		m.key, m.keyEscape = key, esc
		p.space()
		if p.i >= len(p.src) {
			return false
		}
		c := p.src[p.i]
		p.i++
		if c == '}' {
			break
		}
		if c != ',' {
			return false
		}
	}
	members := p.stack[mark:]
	p.sortMembers(members)
	for i := 1; i < len(members); i++ {
		if p.spanOf(members[i].key) == p.spanOf(members[i-1].key) {
			return false // decodeDocument names the first duplicate
		}
	}
	kid, n := p.keep(members)
	p.stack = append(p.stack[:mark], node{kind: '{', kid: kid, nkids: n})
	return true
}

func (p *treeParser) array(depth int) bool {
	p.i++ // '['
	mark := len(p.stack)
	p.space()
	if p.i < len(p.src) && p.src[p.i] == ']' {
		p.i++
		p.stack = append(p.stack, node{kind: '['})
		return true
	}
	for {
		if !p.value(depth + 1) {
			return false
		}
		p.space()
		if p.i >= len(p.src) {
			return false
		}
		c := p.src[p.i]
		p.i++
		if c == ']' {
			break
		}
		if c != ',' {
			return false
		}
	}
	kid, n := p.keep(p.stack[mark:])
	p.stack = append(p.stack[:mark], node{kind: '[', kid: kid, nkids: n})
	return true
}

// keep copies the kids of a container to where they stay, and returns
// where that is.
func (p *treeParser) keep(kids []node) (kid, n int32) {
	kid = int32(len(p.nodes))
	p.nodes = append(p.nodes, kids...)
	return kid, int32(len(kids))
}

// sortMembers sorts an object's members by key, as encoding/json sorts the
// keys of a map: byte by byte.
func (p *treeParser) sortMembers(m []node) {
	if len(m) <= 12 {
		for i := 1; i < len(m); i++ {
			for j := i; j > 0 && p.spanOf(m[j].key) < p.spanOf(m[j-1].key); j-- {
				m[j], m[j-1] = m[j-1], m[j]
			}
		}
		return
	}
	slices.SortFunc(m, func(a, b node) int { return strings.Compare(p.spanOf(a.key), p.spanOf(b.key)) })
}

// string reads a string, returning its value and whether its canonical form
// differs from its bytes as written.
func (p *treeParser) string() (s span, escape, ok bool) {
	// The scan keeps its position in a local: the loop is the parser's
	// hottest, and p's fields would be loaded and stored at every byte.
	src := p.src
	start := p.i + 1 // after '"'
	for i := start; i < len(src); i++ {
		c := src[i]
		if !stringStops[c] {
			continue
		}
		switch {
		case c == '"':
			p.i = i + 1
			return srcSpan(start, i), escape, true
		case c == '\\':
			p.i = i
			return p.escapedString(start)
		case c < 0x20:
			p.i = i
			return span{}, false, false
		case c == 0xE2: // the first byte of U+2028 and U+2029
			escape = true
		}
	}
	p.i = len(src)
	return span{}, false, false
}

// stringStops are the bytes of a string that string looks at: its end, an
// escape, a control character, the first byte of U+2028 and U+2029.
var stringStops = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'], t[0xE2] = true, true, true
	return t
}()

// escapedString reads the rest of a string that has an escape, from start,
// into text.
func (p *treeParser) escapedString(start int) (span, bool, bool) {
	off := len(p.text)
	p.text = append(p.text, p.src[start:p.i]...)
	b := p.text
	fail := func() (span, bool, bool) {
		p.text = p.text[:off]
		return span{}, false, false
	}
	for p.i < len(p.src) {
		c := p.src[p.i]
		switch {
		case c == '"':
			p.i++
			p.text = b
			return span{off: int32(off), n: int32(len(b) - off), inText: true}, true, true
		case c < 0x20:
			return fail()
		case c != '\\':
			b = append(b, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.src) {
			return fail()
		}
		e := p.src[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return fail()
			}
			switch {
			case 0xD800 <= r && r < 0xDC00:
				// A high surrogate must be followed by a low one.
				if !strings.HasPrefix(p.src[p.i:], `\u`) {
					return fail()
				}
				p.i += 2
				lo, ok := p.hex4()
				if !ok || lo < 0xDC00 || lo >= 0xE000 {
					return fail()
				}
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
			case 0xDC00 <= r && r < 0xE000:
				return fail()
			}
			b = utf8.AppendRune(b, r)
		default:
			return fail()
		}
	}
	return fail()
}

func (p *treeParser) hex4() (rune, bool) {
	if p.i+4 > len(p.src) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(p.src[p.i : p.i+4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	p.i += 4
	return r, true
}

// number reads a number (RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?).
func (p *treeParser) number() (span, bool) {
	start := p.i
	digits := func() int {
		s := p.i
		for p.i < len(p.src) && '0' <= p.src[p.i] && p.src[p.i] <= '9' {
			p.i++
		}
		return p.i - s
	}
	if p.src[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.src) && p.src[p.i] == '0':
		p.i++
	case digits() == 0:
		return span{}, false
	}
	if p.i < len(p.src) && p.src[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return span{}, false
		}
	}
	if p.i < len(p.src) && (p.src[p.i] == 'e' || p.src[p.i] == 'E') {
		p.i++
		if p.i < len(p.src) && (p.src[p.i] == '+' || p.src[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return span{}, false
		}
	}
	// A digit right after the number ("01") is refused by the caller,
	// which expects a separator.
	return srcSpan(start, p.i), true
}

// canonicalize writes the canonical form of the document (canonical).
func (t *tree) canonicalize() []byte {
	t.canonical = t.appendCanonical(make([]byte, 0, len(t.src)), t.root())
	return t.canonical
}

// appendCanonical appends the canonical form of n (keys sorted, no
// insignificant white space, strings escaped as encoding/json escapes them
// without HTML escaping, numbers as written: what encodeCanonical writes)
// and records where each value of it is.
func (t *tree) appendCanonical(b []byte, n *node) []byte {
	n.start = int32(len(b))
	switch n.kind {
	case 'n':
		b = append(b, "null"...)
	case 't':
		b = append(b, "true"...)
	case 'f':
		b = append(b, "false"...)
	case '0':
		b = append(b, t.str(n)...)
	case '"':
		b = appendJSONString(b, t.str(n), n.escape)
	case '{':
		b = append(b, '{')
		kids := t.kids(n)
		for i := range kids {
			if i > 0 {
				b = append(b, ',')
			}
			m := &kids[i]
			b = appendJSONString(b, t.key(m), m.keyEscape)
			b = append(b, ':')
			b = t.appendCanonical(b, m)
		}
		b = append(b, '}')
	case '[':
		b = append(b, '[')
		kids := t.kids(n)
		for i := range kids {
			if i > 0 {
				b = append(b, ',')
			}
			b = t.appendCanonical(b, &kids[i])
		}
		b = append(b, ']')
	}
	n.end = int32(len(b))
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as encoding/json writes a string with HTML
// escaping off. Unless escape, s needs no escaping.
func appendJSONString(b []byte, s string, escape bool) []byte {
	b = append(b, '"')
	if !escape {
		b = append(b, s...)
		return append(b, '"')
	}
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
