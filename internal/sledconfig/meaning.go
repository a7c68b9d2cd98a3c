package sledconfig

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
)

// SameMeaning reports whether two configs mean the same thing to upstream's
// decoder, which compares decoded values: members left out that upstream
// fills in (image_source, host_phase_2, lockstep_port, v4 transit_ips) equal
// their defaults, optional members left out equal null, measurements are a
// set (order and repeats do not count), and UUIDs, artifact hashes, MAC
// addresses, IP addresses, socket addresses and subnets are compared as the
// values they denote (letter case, IPv6 zero compression). Generated clients
// send documents that differ from the ledgered one only in such ways.
//
// Members upstream does not know are compared as written: upstream ignores
// them, but this agent keeps them (see Config), so a document that differs
// in them is not the document ledgered. A document that does not decode
// into a well-formed meaning (two map keys naming the same id) is the same
// only as the identical document.
func (c *Config) SameMeaning(o *Config) bool {
	if c.SameContent(o) {
		return true
	}
	a, ok := meaning(c.Canonical())
	if !ok {
		return false
	}
	b, ok := meaning(o.Canonical())
	return ok && bytes.Equal(a, b)
}

// meaning returns the canonical JSON of a document's meaning: the document
// with upstream's defaults filled in, null optional members dropped and
// typed strings rendered in one form.
func meaning(canonical []byte) ([]byte, bool) {
	doc, err := decodeDocument(canonical)
	if err != nil {
		return nil, false
	}
	v, ok := sledConfigShape.norm(doc)
	if !ok {
		return nil, false
	}
	b, err := encodeCanonical(v.(map[string]any))
	return b, err == nil
}

// A shape is what upstream decodes a JSON value into, as far as it decides
// which documents mean the same. norm returns the value in its one form, and
// false when it cannot mean anything definite. A value that is not of the
// shape (a number where an object belongs) is kept as written: validation,
// not comparison, refuses it.
type shape interface {
	norm(v any) (any, bool)
}

// verbatim is a value compared as written (numbers, booleans, free text).
type verbatim struct{}

func (verbatim) norm(v any) (any, bool) { return v, true }

// member is one member of an object shape.
type member struct {
	shape shape
	// optional: left out means null (upstream Option<T>).
	optional bool
	// def, if set, is the value upstream decodes when the member is left
	// out (serde default).
	def func() any
}

// object is a struct. Unknown members are kept as written.
type object map[string]member

func (o object) norm(v any) (any, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, true
	}
	out := make(map[string]any, len(m)+len(o))
	for k, x := range m {
		f, known := o[k]
		switch {
		case !known:
			out[k] = x
		case x == nil && f.optional:
			// null is what left out means.
		default:
			n, ok := f.shape.norm(x)
			if !ok {
				return nil, false
			}
			out[k] = n
		}
	}
	for k, f := range o {
		if _, present := m[k]; !present && f.def != nil {
			out[k] = f.def()
		}
	}
	return out, true
}

// tagged is an internally tagged enum: the member tag names the variant.
// An unknown variant is kept as written.
type tagged struct {
	tag      string
	variants map[string]object
}

func (t tagged) norm(v any) (any, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, true
	}
	name, _ := m[t.tag].(string)
	variant, ok := t.variants[name]
	if !ok {
		return v, true
	}
	return variant.norm(v)
}

// idMap is an object keyed by UUIDs.
type idMap struct{ elem shape }

func (s idMap) norm(v any) (any, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, true
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		key, _ := uuidText.norm(k)
		if _, dup := out[key.(string)]; dup {
			return nil, false // two keys, one id: upstream refuses the document
		}
		n, ok := s.elem.norm(x)
		if !ok {
			return nil, false
		}
		out[key.(string)] = n
	}
	return out, true
}

// list is an array whose order counts (Vec).
type list struct{ elem shape }

func (s list) norm(v any) (any, bool) {
	arr, ok := v.([]any)
	if !ok {
		return v, true
	}
	out := make([]any, len(arr))
	for i, x := range arr {
		n, ok := s.elem.norm(x)
		if !ok {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// set is an array whose order and repeats do not count (BTreeSet).
type set struct{ elem shape }

func (s set) norm(v any) (any, bool) {
	n, ok := list(s).norm(v)
	arr, isArr := n.([]any)
	if !ok || !isArr {
		return n, ok
	}
	type item struct {
		key string
		v   any
	}
	items := make([]item, 0, len(arr))
	for _, x := range arr {
		b, err := json.Marshal(x)
		if err != nil {
			return nil, false
		}
		items = append(items, item{string(b), x})
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.key, b.key) })
	items = slices.CompactFunc(items, func(a, b item) bool { return a.key == b.key })
	out := make([]any, len(items))
	for i, it := range items {
		out[i] = it.v
	}
	return out, true
}

// text is a string upstream parses into a value; norm renders the value in
// one form. A string that does not parse is kept as written.
type text func(s string) (string, bool)

func (t text) norm(v any) (any, bool) {
	s, ok := v.(string)
	if !ok {
		return v, true
	}
	if n, ok := t(s); ok {
		return n, true
	}
	return s, true
}

var (
	// uuidText: upstream parses UUIDs in either letter case.
	uuidText = text(func(s string) (string, bool) {
		if !isUUID(s) {
			return "", false
		}
		return strings.ToLower(s), true
	})
	// hashText: artifact hashes are hex, in either letter case.
	hashText = text(func(s string) (string, bool) {
		if !isArtifactHash(s) {
			return "", false
		}
		return strings.ToLower(s), true
	})
	macText = text(func(s string) (string, bool) {
		hw, ok := parseMAC(s)
		if !ok {
			return "", false
		}
		return hw.String(), true
	})
	ipText = text(func(s string) (string, bool) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return "", false
		}
		return a.String(), true
	})
	addrPortText = text(func(s string) (string, bool) {
		ap, err := netip.ParseAddrPort(s)
		if err != nil || ap.Addr().Zone() != "" {
			return "", false
		}
		return ap.String(), true
	})
	// subnetText: upstream's Ipv4Net and Ipv6Net keep the address as given
	// (host bits are not masked), as netip.Prefix does.
	subnetText = text(func(s string) (string, bool) {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return "", false
		}
		return p.String(), true
	})
)

// The shapes of upstream's OmicronSledConfig (sled-agent API 48.0.0, its
// OmicronSledConfig of version 14), from the spec's required members, its
// nullable members and its defaults, which are serde's.
var (
	anyValue = verbatim{}

	artifactOrCurrent = tagged{tag: "type", variants: map[string]object{
		"current_contents": {"type": {shape: anyValue}},
		"artifact":         {"type": {shape: anyValue}, "hash": {shape: hashText}},
	}}

	zoneDataset = object{"pool_name": {shape: anyValue}}

	privateIPv4 = object{
		"ip":          {shape: ipText},
		"subnet":      {shape: subnetText},
		"transit_ips": {shape: list{subnetText}, def: func() any { return []any{} }},
	}
	privateIPv6 = object{
		"ip":          {shape: ipText},
		"subnet":      {shape: subnetText},
		"transit_ips": {shape: list{subnetText}},
	}

	nic = object{
		"id": {shape: uuidText},
		"kind": {shape: tagged{tag: "type", variants: map[string]object{
			"instance": {"type": {shape: anyValue}, "id": {shape: uuidText}},
			"service":  {"type": {shape: anyValue}, "id": {shape: uuidText}},
			"probe":    {"type": {shape: anyValue}, "id": {shape: uuidText}},
		}}},
		"name": {shape: anyValue},
		"ip_config": {shape: tagged{tag: "type", variants: map[string]object{
			"v4":         {"type": {shape: anyValue}, "value": {shape: privateIPv4}},
			"v6":         {"type": {shape: anyValue}, "value": {shape: privateIPv6}},
			"dual_stack": {"type": {shape: anyValue}, "value": {shape: object{"v4": {shape: privateIPv4}, "v6": {shape: privateIPv6}}}},
		}}},
		"mac":     {shape: macText},
		"vni":     {shape: anyValue},
		"primary": {shape: anyValue},
		"slot":    {shape: anyValue},
	}

	// zoneMembers are the members of every zone type; each variant takes
	// its own (a member of another variant is unknown to it).
	zoneMembers = map[string]member{
		"type":                 {shape: anyValue},
		"address":              {shape: addrPortText},
		"dataset":              {shape: zoneDataset},
		"dns_servers":          {shape: list{ipText}},
		"domain":               {shape: anyValue, optional: true},
		"ntp_servers":          {shape: list{anyValue}},
		"snat_cfg":             {shape: object{"ip": {shape: ipText}, "first_port": {shape: anyValue}, "last_port": {shape: anyValue}}},
		"nic":                  {shape: nic},
		"dns_address":          {shape: addrPortText},
		"http_address":         {shape: addrPortText},
		"gz_address":           {shape: ipText},
		"gz_address_index":     {shape: anyValue},
		"internal_address":     {shape: addrPortText},
		"lockstep_port":        {shape: anyValue, def: func() any { return json.Number("12232") }},
		"external_ip":          {shape: ipText},
		"external_tls":         {shape: anyValue},
		"external_dns_servers": {shape: list{ipText}},
	}

	zoneType = tagged{tag: "type", variants: map[string]object{
		"boundary_ntp":      zoneShape("address", "dns_servers", "domain", "nic", "ntp_servers", "snat_cfg"),
		"clickhouse":        zoneShape("address", "dataset"),
		"clickhouse_keeper": zoneShape("address", "dataset"),
		"clickhouse_server": zoneShape("address", "dataset"),
		"cockroach_db":      zoneShape("address", "dataset"),
		"crucible":          zoneShape("address", "dataset"),
		"crucible_pantry":   zoneShape("address"),
		"external_dns":      zoneShape("dataset", "dns_address", "http_address", "nic"),
		"internal_dns":      zoneShape("dataset", "dns_address", "gz_address", "gz_address_index", "http_address"),
		"internal_ntp":      zoneShape("address"),
		"nexus":             zoneShape("external_dns_servers", "external_ip", "external_tls", "internal_address", "lockstep_port", "nic"),
		"oximeter":          zoneShape("address"),
	}}

	zoneConfig = object{
		"id":              {shape: uuidText},
		"filesystem_pool": {shape: anyValue, optional: true},
		"zone_type":       {shape: zoneType},
		"image_source": {
			shape: tagged{tag: "type", variants: map[string]object{
				"install_dataset": {"type": {shape: anyValue}},
				"artifact":        {"type": {shape: anyValue}, "hash": {shape: hashText}},
			}},
			def: func() any { return map[string]any{"type": "install_dataset"} },
		},
	}

	// diskConfig is OmicronPhysicalDiskConfig. Its identity is free text.
	diskConfig = object{
		"id": {shape: uuidText},
		"identity": {shape: object{
			"vendor": {shape: anyValue},
			"model":  {shape: anyValue},
			"serial": {shape: anyValue},
		}},
		"pool_id": {shape: uuidText},
	}

	// datasetConfig is DatasetConfig. Its pool name is compared as written,
	// as a zone's filesystem_pool is (Validate takes only the lowercase
	// form), and so is its kind (upstream writes DatasetKind back as it
	// parses it). A level on a compression type without one is a member
	// upstream does not know.
	datasetConfig = object{
		"id": {shape: uuidText},
		"name": {shape: object{
			"pool_name": {shape: anyValue},
			"kind":      {shape: anyValue},
		}},
		"compression": {shape: tagged{tag: "type", variants: map[string]object{
			"on":     {"type": {shape: anyValue}},
			"off":    {"type": {shape: anyValue}},
			"gzip":   {"type": {shape: anyValue}},
			"gzip_n": {"type": {shape: anyValue}, "level": {shape: anyValue}},
			"lz4":    {"type": {shape: anyValue}},
			"lzjb":   {"type": {shape: anyValue}},
			"zle":    {"type": {shape: anyValue}},
		}}},
		"quota":       {shape: anyValue, optional: true},
		"reservation": {shape: anyValue, optional: true},
	}

	sledConfigShape = object{
		"generation":              {shape: anyValue},
		"disks":                   {shape: idMap{diskConfig}},
		"datasets":                {shape: idMap{datasetConfig}},
		"zones":                   {shape: idMap{zoneConfig}},
		"remove_mupdate_override": {shape: uuidText, optional: true},
		"host_phase_2": {
			shape: object{"slot_a": {shape: artifactOrCurrent}, "slot_b": {shape: artifactOrCurrent}},
			def: func() any {
				return map[string]any{
					"slot_a": map[string]any{"type": "current_contents"},
					"slot_b": map[string]any{"type": "current_contents"},
				}
			},
		},
		// Required, with no serde default upstream: left out, the document
		// is refused, so it is never compared.
		"measurements": {shape: set{object{"hash": {shape: hashText}}}},
	}
)

// zoneShape is the object shape of one zone type, with the named members.
func zoneShape(names ...string) object {
	o := object{"type": zoneMembers["type"]}
	for _, n := range names {
		o[n] = zoneMembers[n]
	}
	return o
}
