package sledconfig

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxDocumentBytes bounds the size of a config document this package decodes.
const MaxDocumentBytes = 16 << 20

// maxNesting bounds how deeply arrays and objects may nest in a document. It is
// serde_json's default recursion limit, so nothing upstream accepts is refused.
const maxNesting = 128

// errNotObject: the document is JSON, but not an object.
var errNotObject = errors.New("config must be a JSON object")

// Parse decodes a sled config document and remembers its canonical form, so the
// returned Config marshals back to the same document. It checks only that the
// document decodes; Validate checks what it means.
//
// Parse is stricter than encoding/json where upstream (serde) is: it refuses
// invalid UTF-8, duplicate object keys, data after the document, and keys that
// differ from a known field name only in letter case (encoding/json would
// silently decode "NIC" into the nic field; upstream would not).
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxDocumentBytes {
		return nil, fmt.Errorf("config is %d bytes, more than the limit of %d", len(data), MaxDocumentBytes)
	}
	t, err := readTree(data)
	if err != nil {
		return nil, err
	}
	// Nothing Parse returns holds a node (items hold what validation
	// needs of their JSON): the nodes go to the next Parse.
	defer t.release()
	root := t.root()
	canonical := t.canonicalize()
	cfg, zones, unknown, err := decodeTop(t, root)
	if err == nil {
		cfg.canonical = canonical
		var zonesUnknown bool
		zonesUnknown, err = decodeZones(cfg, t, zones)
		unknown = unknown || zonesUnknown
	}
	// A key that differs from a field's name only in letter case is
	// reported before any other problem. Only a key that is no field's
	// name as written can be one: if decoding met none (and went through
	// the whole document), there is none to look for.
	if err != nil || unknown {
		if err := checkCase(t, root, planFor(reflect.TypeFor[Config]())); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	cfg.disks = decodeItems[DiskConfig](t, t.member(root, "disks"))
	cfg.datasets = decodeItems[DatasetConfig](t, t.member(root, "datasets"))
	for _, f := range []string{"datasets", "disks", "generation", "measurements", "zones"} {
		if m := t.member(root, f); m == nil || m.kind == 'n' {
			cfg.missing = append(cfg.missing, f)
		}
	}
	return cfg, nil
}

// decodeZones decodes the zones, members of the zones object of t, into
// cfg.Zones, each with the hash of its canonical form. It reports whether
// a member of a zone had a key that is no field's name as written.
func decodeZones(cfg *Config, t *tree, zones []node) (unknown bool, err error) {
	cfg.Zones = make(map[string]Zone, len(zones))
	cfg.zoneKeys = make([]string, len(zones))
	// The zones' hashes are written into one buffer, rather than each
	// allocated on its own.
	hashes := make([]byte, 0, len(zones)*2*sha256.Size)
	for i := range zones {
		m := &zones[i]
		sum := sha256.Sum256(t.canonical[m.start:m.end])
		hashes = hex.AppendEncode(hashes, sum[:])
	}
	all := string(hashes)
	// Each zone is decoded into z, then copied into the map.
	z := new(Zone)
	v := reflect.ValueOf(z).Elem()
	d := decoder{t: t}
	p := planFor(reflect.TypeFor[Zone]())
	for i := range zones {
		m := &zones[i]
		*z = Zone{}
		if err := d.decode(m, v, p); err != nil {
			return unknown || d.unknown, describeJSONError(err, fmt.Sprintf("zones[%q]", t.key(m)))
		}
		unknown = unknown || d.unknown
		z.hash = all[i*2*sha256.Size : (i+1)*2*sha256.Size]
		if d.unknown {
			// Members this agent does not know are kept in the ledger as
			// given but, as upstream ignores them, they are not part of
			// what the zone is realised from: a member appearing (a newer
			// control plane) restarts nothing. A zone without such
			// members keeps the hash of its canonical form, which zones
			// running before this rule were marked with.
			sum := sha256.Sum256(t.appendKnown(nil, m, p))
			z.hash = hex.EncodeToString(sum[:])
		}
		key := t.key(m)
		cfg.Zones[key] = *z
		cfg.zoneKeys[i] = key // the members are sorted by key
	}
	return unknown, nil
}

// readTree reads a document that must be one JSON object.
func readTree(data []byte) (*tree, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("config is not valid UTF-8")
	}
	t, ok := parseTree(data)
	if !ok {
		// decodeDocument refuses what parseTree refuses, and says why.
		if _, err := decodeDocument(data); err != nil {
			return nil, err
		}
		return nil, errors.New("malformed JSON")
	}
	if t.root().kind != '{' {
		t.release()
		return nil, errNotObject
	}
	return t, nil
}

// topPlans are the plans of Config's members, as decodeTop decodes them.
var topPlans = sync.OnceValue(func() map[string]*plan {
	return map[string]*plan{
		"generation":              planFor(reflect.TypeFor[uint64]()),
		"disks":                   planFor(reflect.TypeFor[map[string]json.RawMessage]()),
		"datasets":                planFor(reflect.TypeFor[map[string]json.RawMessage]()),
		"zones":                   planFor(reflect.TypeFor[map[string]json.RawMessage]()),
		"measurements":            planFor(reflect.TypeFor[[]json.RawMessage]()),
		"remove_mupdate_override": planFor(reflect.TypeFor[*string]()),
		"host_phase_2":            planFor(reflect.TypeFor[json.RawMessage]()),
	}
})

// decodeTop decodes the members of the document root but the zones, and
// returns the zones' members to be decoded one by one, as encoding/json
// decodes a struct embedding Config with zones as raw JSON: the first type
// mismatch fails it.
//
// It reports too whether a member's key was no field's name as written.
func decodeTop(t *tree, root *node) (cfg *Config, zones []node, unknown bool, err error) {
	cfg = &Config{}
	d := decoder{t: t}
	plans := topPlans()
	kids := t.kids(root)
	for i := range kids {
		m := &kids[i]
		key := t.key(m)
		p, ok := plans[key]
		if !ok {
			unknown = true
			continue // kept in the canonical form; checkCase refuses other spellings
		}
		var v reflect.Value
		switch key {
		case "generation":
			v = reflect.ValueOf(&cfg.Generation)
		case "disks":
			v = reflect.ValueOf(&cfg.Disks)
		case "datasets":
			v = reflect.ValueOf(&cfg.Datasets)
		case "zones":
			// Decoded as raw JSON first: a zone whose value is of the
			// wrong type is reported after the other members. An object
			// decodes as raw JSON whatever its members, so only another
			// value is decoded (to report it).
			if m.kind == '{' {
				zones = t.kids(m)
				continue
			}
			var raw map[string]json.RawMessage
			v = reflect.ValueOf(&raw)
		case "measurements":
			v = reflect.ValueOf(&cfg.Measurements)
		case "remove_mupdate_override":
			v = reflect.ValueOf(&cfg.RemoveMupdateOverride)
		case "host_phase_2":
			v = reflect.ValueOf(&cfg.HostPhase2)
		}
		failed := d.err != nil
		d.value(m, v.Elem(), p)
		if !failed && d.err != nil {
			d.inField(reflect.TypeFor[Config](), key)
		}
	}
	if d.err != nil {
		return nil, nil, unknown, describeJSONError(d.err, "")
	}
	return cfg, zones, unknown, nil
}

// Canonicalize returns the canonical form of a JSON object: object keys
// sorted, no insignificant white space, numbers exactly as written. Two documents
// with the same meaning have the same canonical form.
func Canonicalize(data []byte) ([]byte, error) {
	t, err := readTree(data)
	if err != nil {
		return nil, err
	}
	defer t.release()
	return t.canonicalize(), nil
}

// decodeDocument decodes one JSON object (numbers as json.Number) and nothing
// after it.
func decodeDocument(data []byte) (map[string]any, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("config is not valid UTF-8")
	}
	// Duplicate names are found (and reported with their path) by value.
	d := docDecoder{dec: jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true))}
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	if _, err := d.dec.ReadToken(); err != io.EOF {
		return nil, errors.New("config has data after the JSON document")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errNotObject
	}
	return obj, nil
}

// docDecoder decodes a JSON value token by token, which lets it refuse
// duplicate keys (encoding/json keeps the last; serde refuses them) and say
// where they are.
type docDecoder struct {
	dec  *jsontext.Decoder
	path []pathElem // keys and indexes leading to the value being decoded
}

// pathElem is an object key, or an array index when key is "" and index ≥ 0.
type pathElem struct {
	key   string
	index int
}

// where renders the path, for messages.
func (d *docDecoder) where() string {
	if len(d.path) == 0 {
		return "the top level"
	}
	var b strings.Builder
	for i, e := range d.path {
		switch {
		case e.index >= 0:
			b.WriteString("[" + strconv.Itoa(e.index) + "]")
		case i == 1 && slices.Contains([]string{"zones", "disks", "datasets"}, d.path[0].key), !fieldLike(e.key):
			// Keys of the id-keyed maps, and keys that are not field-like.
			b.WriteString("[" + strconv.Quote(e.key) + "]")
		default:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e.key)
		}
	}
	return b.String()
}

func fieldLike(key string) bool {
	for i, r := range key {
		if !(r == '_' || 'a' <= r && r <= 'z' || i > 0 && '0' <= r && r <= '9') {
			return false
		}
	}
	return key != ""
}

// token reads the next token, which must be there. The token is valid until
// the next read.
func (d *docDecoder) token() (jsontext.Token, error) {
	tok, err := d.dec.ReadToken()
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return tok, errors.New("malformed JSON: unexpected end of input")
	}
	if err != nil {
		var se *jsontext.SyntacticError
		if errors.As(err, &se) {
			return tok, fmt.Errorf("malformed JSON at byte %d (%s): %w", se.ByteOffset, d.where(), se.Err)
		}
		return tok, fmt.Errorf("malformed JSON: %w", err)
	}
	return tok, nil
}

// more reports whether the object or array being read has another member.
func (d *docDecoder) more(end jsontext.Kind) (bool, error) {
	switch d.dec.PeekKind() {
	case end:
		return false, nil
	case 0: // an error, which reading says
		_, err := d.token()
		if err == nil {
			err = errors.New("malformed JSON")
		}
		return false, err
	}
	return true, nil
}

func (d *docDecoder) value(depth int) (any, error) {
	tok, err := d.token()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return tok.Bool(), nil
	case '"':
		return tok.String(), nil
	case '0':
		return json.Number(tok.String()), nil
	}
	if depth >= maxNesting {
		return nil, fmt.Errorf("config nests deeper than %d levels at %s", maxNesting, d.where())
	}
	switch tok.Kind() {
	case '{':
		obj := map[string]any{}
		for {
			more, err := d.more('}')
			if err != nil {
				return nil, err
			}
			if !more {
				break
			}
			tok, err := d.token()
			if err != nil {
				return nil, err
			}
			key := tok.String()
			if _, dup := obj[key]; dup {
				return nil, fmt.Errorf("duplicate key %q at %s", key, d.where())
			}
			d.path = append(d.path, pathElem{key: key, index: -1})
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.path = d.path[:len(d.path)-1]
			obj[key] = v
		}
		if _, err := d.token(); err != nil { // '}'
			return nil, err
		}
		return obj, nil
	default: // '['
		arr := []any{}
		for {
			more, err := d.more(']')
			if err != nil {
				return nil, err
			}
			if !more {
				break
			}
			d.path = append(d.path, pathElem{index: len(arr)})
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.path = d.path[:len(d.path)-1]
			arr = append(arr, v)
		}
		if _, err := d.token(); err != nil { // ']'
			return nil, err
		}
		return arr, nil
	}
}

func encodeCanonical(doc map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("canonicalizing config: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// checkCase (decode.go) refuses object keys that differ from a field name
// of the struct they decode into only in letter case: encoding/json
// matches field names case-insensitively, so it would decode them into the
// field, while upstream treats them as unknown fields.

// caseError is a key that differs from the field name want only in letter
// case.
type caseError struct{ path, want string }

func (e *caseError) Error() string {
	return fmt.Sprintf("field %s: %s", e.path, e.message())
}

func (e *caseError) message() string {
	return fmt.Sprintf("unknown field; field names are case-sensitive (did you mean %q?)", e.want)
}

// describeJSONError turns a decoding error into a message naming the field;
// prefix is the path of the value that was being decoded.
func describeJSONError(err error, prefix string) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := prefix
		if typeErr.Field != "" {
			// Parse decodes into a struct embedding Config, whose name
			// encoding/json puts in front of the field.
			f := strings.TrimPrefix(typeErr.Field, "Config.")
			field = strings.TrimPrefix(prefix+"."+f, ".")
		}
		if field == "" {
			return fmt.Errorf("expected %s, got JSON %s", describeType(typeErr.Type), typeErr.Value)
		}
		return fmt.Errorf("field %s: expected %s, got JSON %s", field, describeType(typeErr.Type), typeErr.Value)
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Errorf("malformed JSON at byte %d: %w", syntaxErr.Offset, err)
	}
	return fmt.Errorf("malformed config: %w", err)
}

// describeType names the JSON a Go type decodes from.
func describeType(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return fmt.Sprintf("an integer from 0 to %d", uint64(1)<<(t.Bits()-1)<<1-1)
	}
	return t.String()
}

// Canonical returns the canonical JSON of the document the config was parsed
// from, or of the typed fields for a config built in code.
func (c *Config) Canonical() []byte {
	b, err := c.MarshalJSON()
	if err != nil {
		return nil
	}
	return b
}

// MarshalJSON returns the document the config was parsed from (canonical form);
// a config built in code is marshalled from its typed fields, also in
// canonical form.
func (c *Config) MarshalJSON() ([]byte, error) {
	if c.canonical != nil {
		return c.canonical, nil
	}
	type plain Config
	b, err := json.Marshal((*plain)(c))
	if err != nil {
		return nil, err
	}
	return Canonicalize(b)
}

// SameContent reports whether two configs are the same document.
func (c *Config) SameContent(o *Config) bool {
	return bytes.Equal(c.Canonical(), o.Canonical())
}

// Hash identifies the zone's config: equal hashes mean equal configs. Zones from
// Parse hash their canonical JSON; zones built in code hash their typed fields.
func (z Zone) Hash() string {
	if z.hash != "" {
		return z.hash
	}
	b, err := json.Marshal(z)
	if err != nil {
		return ""
	}
	c, err := Canonicalize(b)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:])
}
