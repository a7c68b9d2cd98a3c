package sledconfig

import (
	"math/bits"
	"slices"
	"strings"
	"sync"
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
	// canonical is the canonical form, once canonicalize has written it;
	// the nodes' start and end are in it.
	canonical []byte
	// asWritten: the document is in canonical form already (see
	// treeParser.rewritten).
	asWritten bool
	// buffers are where nodes came from, for release.
	buffers *nodeBuffers
}

// nodeBuffers are the slices a treeParser builds nodes in. A large
// document has megabytes of nodes, needed only while it is decoded: the
// buffers of a tree released are kept in parseBuffers for the next.
type nodeBuffers struct{ nodes, stack []node }

var parseBuffers = sync.Pool{New: func() any { return new(nodeBuffers) }}

// release gives the tree's nodes back for another tree to use. Nothing may
// hold a node of the tree, or read one, after.
func (t *tree) release() {
	if t.buffers == nil {
		return
	}
	t.buffers.nodes = t.nodes[:0]
	parseBuffers.Put(t.buffers)
	// A use after release fails rather than reading another tree's nodes.
	t.nodes, t.buffers = nil, nil
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
	// canonicalize has written it; until then, in the document.
	start, end int32
}

// span is a string of a tree: src[off:off+n] if off ≥ 0; for a string that
// had escapes, whose value is in text, text[^off:^off+n]. (A flag would
// make every node 8 bytes larger, and a document has many.)
type span struct{ off, n int32 }

// textSpan is the span of text[off:off+n].
func textSpan(off, n int) span { return span{off: ^int32(off), n: int32(n)} }

func (t *tree) span(s span) string {
	if s.off < 0 {
		return t.text[^s.off : ^s.off+s.n]
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
//
// The tree's nodes may be another tree's, released: a caller done with the
// tree releases it in turn (one that does not leaves its nodes to the
// collector).
func parseTree(data []byte) (*tree, bool) {
	buffers := parseBuffers.Get().(*nodeBuffers)
	// About one value in every 30 bytes of a config.
	if n := len(data)/28 + 1; cap(buffers.nodes) < n {
		buffers.nodes = make([]node, 0, n)
	}
	p := treeParser{src: string(data), stack: buffers.stack[:0], nodes: buffers.nodes[:0]}
	ok := p.value(0)
	if ok {
		p.space()
		ok = p.i == len(p.src)
	}
	// The slices may have grown.
	buffers.nodes, buffers.stack = p.nodes, p.stack
	if !ok {
		buffers.nodes = buffers.nodes[:0]
		parseBuffers.Put(buffers)
		return nil, false
	}
	t := &tree{src: p.src, text: string(p.text), nodes: append(p.nodes, p.stack[0]), asWritten: !p.rewritten, buffers: buffers}
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
	// rewritten is set once the document is found not to be in canonical
	// form: white space between tokens, an object's members out of
	// order, a string whose canonical form is not as written. A document
	// in canonical form (such as a ledgered one) is its own canonical
	// form, which canonicalize then copies rather than writes.
	rewritten bool
}

// srcSpan is the span of src from start to end.
func srcSpan(start, end int) span { return span{off: int32(start), n: int32(end - start)} }

// spanOf returns the string of a span being read.
func (p *treeParser) spanOf(s span) string {
	if s.off < 0 {
		return string(p.text[^s.off : ^s.off+s.n])
	}
	return p.src[s.off : s.off+s.n]
}

func (p *treeParser) space() {
	i, src := p.i, p.src
	for i < len(src) && (src[i] == ' ' || src[i] == '\n' || src[i] == '\t' || src[i] == '\r') {
		i++
	}
	if i != p.i {
		p.rewritten = true
	}
	p.i = i
}

// value reads a value and pushes it on the stack, its start and end
// those of its text in the document.
func (p *treeParser) value(depth int) bool {
	p.space()
	if p.i >= len(p.src) {
		return false
	}
	start := int32(p.i)
	var ok bool
	switch c := p.src[p.i]; {
	case c == '{':
		ok = depth < maxNesting && p.object(depth)
	case c == '[':
		ok = depth < maxNesting && p.array(depth)
	case c == '"':
		s, esc, sok := p.string()
		p.stack = append(p.stack, node{kind: '"', str: s, escape: esc})
		ok = sok
	case c == '-' || '0' <= c && c <= '9':
		s, nok := p.number()
		p.stack = append(p.stack, node{kind: '0', str: s})
		ok = nok
	default:
		lit := ""
		switch c {
		case 'n':
			lit = "null"
		case 't':
			lit = "true"
		case 'f':
			lit = "false"
		}
		if lit == "" || !strings.HasPrefix(p.src[p.i:], lit) {
			return false
		}
		p.stack = append(p.stack, node{kind: c})
		p.i += len(lit)
		ok = true
	}
	if ok {
		n := &p.stack[len(p.stack)-1]
		n.start, n.end = start, int32(p.i)
	}
	return ok
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
	if !p.sortMembers(p.stack[mark:]) {
		return false // decodeDocument names the first duplicate
	}
	kid, n := p.keep(p.stack[mark:])
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
// keys of a map: byte by byte. It reports false if two keys are equal.
func (p *treeParser) sortMembers(m []node) bool {
	// Most often the members are in order already.
	i := 1
	for i < len(m) && before(p.spanOf(m[i-1].key), p.spanOf(m[i].key)) {
		i++
	}
	if i >= len(m) {
		return true
	}
	p.rewritten = true
	if len(m) <= 12 {
		// An insertion sort: each member moves back past the keys after
		// its own.
		for ; i < len(m); i++ {
			x, key := m[i], p.spanOf(m[i].key)
			j := i
			for j > 0 && before(key, p.spanOf(m[j-1].key)) {
				j--
			}
			copy(m[j+1:i+1], m[j:i])
			m[j] = x
		}
	} else {
		slices.SortFunc(m, func(a, b node) int { return strings.Compare(p.spanOf(a.key), p.spanOf(b.key)) })
	}
	for i := 1; i < len(m); i++ {
		if p.spanOf(m[i].key) == p.spanOf(m[i-1].key) {
			return false
		}
	}
	return true
}

// before reports whether a < b, looking first at their first bytes, which
// tell most keys apart for less than a call of the runtime's comparison.
func before(a, b string) bool {
	if a != "" && b != "" && a[0] != b[0] {
		return a[0] < b[0]
	}
	return a < b
}

// string reads a string, returning its value and whether its canonical form
// differs from its bytes as written.
func (p *treeParser) string() (s span, escape, ok bool) {
	// The scan keeps its position in a local: the loop is the parser's
	// hottest, and p's fields would be loaded and stored at every byte.
	src := p.src
	start := p.i + 1 // after '"'
	for i := start; i < len(src); i++ {
		// Eight bytes at a time while none of them is one to look at.
		for i+8 <= len(src) {
			if w := stopBytes(load64(src[i : i+8])); w != 0 {
				i += bits.TrailingZeros64(w) / 8
				break
			}
			i += 8
		}
		if i >= len(src) {
			break
		}
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
			escape, p.rewritten = true, true
		}
	}
	p.i = len(src)
	return span{}, false, false
}

// load64 is the first 8 bytes of b, the first the lowest.
func load64(b string) uint64 {
	_ = b[7] // one bounds check, and the compiler makes the rest one load
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// stopBytes has the top bit set of each byte of w (8 bytes, load64) that
// may be a stringStops byte, and of no byte before the first that is: a
// test of eight bytes at once ("SWAR": subtracting 1 from a byte sets its
// top bit, borrowing, only if it was 0, so x^c-1 finds bytes equal to c;
// the borrow may mark bytes after the first one found, never before).
func stopBytes(w uint64) uint64 {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	quote := w ^ (ones * '"')
	backslash := w ^ (ones * '\\')
	e2 := w ^ (ones * 0xE2)
	return ((quote-ones)&^quote |
		(backslash-ones)&^backslash |
		(e2-ones)&^e2 |
		(w-ones*0x20)&^w) & tops // bytes below 0x20
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
	p.rewritten = true
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
			return textSpan(off, len(b)-off), true, true
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
	if t.asWritten {
		// The nodes' start and end are where they are in the document,
		// and so in its copy.
		t.canonical = []byte(t.src)
		return t.canonical
	}
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
