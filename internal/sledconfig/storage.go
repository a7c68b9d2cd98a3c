package sledconfig

import (
	"cmp"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// item is one member of an id-keyed map (disks, datasets), decoded, with
// what validation asks of its JSON beyond the decoded value. (It holds no
// node of the document's tree, which Parse lets go of once it has decoded
// the document.)
type item[T any] struct {
	// key is the member's key in the map.
	key string
	val T
	// object: the member is a JSON object; nothing else is known of one
	// that is not.
	object bool
	// present has bit i set if the object has the member at
	// askedOf[T]().paths[i], and it is not null (see has).
	present uint8
	// idKind is the kind of the object's id member (a node's kind; 0 if
	// it has none), and id its value if it is a string.
	idKind byte
	id     string
	// raw is the object's canonical JSON.
	raw []byte
	// err is the first member of the wrong JSON type (encoding/json decodes
	// the rest as best it can).
	err *json.UnmarshalTypeError
	// caseErr is the first key that differs from a field name only in
	// letter case: upstream ignores it as unknown, encoding/json would
	// decode it into the field.
	caseErr *caseError
}

// decodeItems decodes each object of an id-keyed map, m, a node of t
// (canonicalized), and returns them sorted by key (a slice, not a map:
// every reader walks them in key order).
func decodeItems[T any](t *tree, m *node) []item[T] {
	if m == nil || m.kind != '{' {
		return []item[T]{}
	}
	kids := t.kids(m)
	out := make([]item[T], len(kids))
	d := decoder{t: t}
	p := planFor(reflect.TypeFor[T]())
	for i := range kids {
		out[i].key = t.key(&kids[i]) // the members are sorted by key
		decodeItem(&d, &out[i], &kids[i], p)
	}
	return out
}

// askedOf returns the members of an item of T whose presence validation
// asks about (item.has).
func askedOf[T any]() *askedMembers {
	switch any((*T)(nil)).(type) {
	case *DiskConfig:
		return diskMembers
	case *DatasetConfig:
		return datasetMembers
	}
	return &askedMembers{}
}

// has reports whether the item has the member at path, one of
// askedOf[T]().paths, and it is not null.
func (it *item[T]) has(path string) bool {
	i := slices.Index(askedOf[T]().paths, path)
	if i < 0 {
		panic("sledconfig: validation asks of a member askedOf does not list: " + path)
	}
	return it.present&(1<<i) != 0
}

// askedMembers are members of an object, by dotted path ("identity.vendor"
// is the member vendor of the member identity), whose presence is asked.
type askedMembers struct {
	paths []string
	// names are the paths as a tree of names, for presence.
	names []askedName
}

// askedName is a member name asked of, with its bit in the set presence
// returns (0 if only the members below it are asked of) and the names
// asked of below it.
type askedName struct {
	name  string
	bit   uint8
	below []askedName
}

// newAskedMembers returns the members at paths (at most 8: an item's
// present has a bit for each).
func newAskedMembers(paths ...string) *askedMembers {
	if len(paths) > 8 {
		panic("sledconfig: more members asked of than an item has bits for")
	}
	a := &askedMembers{paths: paths}
	for i, path := range paths {
		names := &a.names
		for {
			name, rest, nested := strings.Cut(path, ".")
			j := slices.IndexFunc(*names, func(n askedName) bool { return n.name == name })
			if j < 0 {
				j = len(*names)
				*names = append(*names, askedName{name: name})
			}
			if !nested {
				(*names)[j].bit = 1 << i
				break
			}
			names, path = &(*names)[j].below, rest
		}
	}
	return a
}

// presence has the bit of each of names that the object n, a node of t,
// has, not null.
func presence(t *tree, n *node, names []askedName) (set uint8) {
	for i := range names {
		m := t.member(n, names[i].name) // nil if n is not an object
		if m == nil || m.kind == 'n' {
			continue
		}
		set |= names[i].bit
		if len(names[i].below) > 0 {
			set |= presence(t, m, names[i].below)
		}
	}
	return set
}

// decodeRawItems decodes the items of a config built in code, sorted by
// key.
func decodeRawItems[T any](raw map[string]json.RawMessage) []item[T] {
	keys := sortedKeys(raw)
	out := make([]item[T], len(keys))
	p := planFor(reflect.TypeFor[T]())
	for i, key := range keys {
		out[i].key = key
		r := raw[key]
		if !utf8.Valid(r) {
			continue
		}
		t, ok := parseTree(r)
		if !ok {
			continue
		}
		t.canonicalize()
		d := decoder{t: t}
		decodeItem(&d, &out[i], t.root(), p)
		t.release()
	}
	return out
}

// decodeItem decodes one item, n, a node of d's tree, of plan p (T's), into
// it. The item is decoded in place: decoding through a pointer to a local
// would move each one to the heap.
func decodeItem[T any](d *decoder, it *item[T], n *node, p *plan) {
	if n.kind != '{' {
		return
	}
	t := d.t
	it.object = true
	it.raw = t.canonical[n.start:n.end:n.end]
	if id := t.member(n, "id"); id != nil {
		it.idKind = id.kind
		if id.kind == '"' {
			it.id = t.str(id)
		}
	}
	it.present = presence(t, n, askedOf[T]().names)
	if err := d.decode(n, reflect.ValueOf(&it.val).Elem(), p); err != nil {
		it.err = err
	}
	if d.unknown {
		// Only a member that named no field can be a field's name in
		// another letter case: the walk that finds it (and its path)
		// is needed then alone.
		it.caseErr = checkCase(d.t, n, p)
	}
}

func (c *Config) diskItems() []item[DiskConfig] {
	if c.disks != nil || c.canonical != nil {
		return c.disks
	}
	return decodeRawItems[DiskConfig](c.Disks) // built in code
}

func (c *Config) datasetItems() []item[DatasetConfig] {
	if c.datasets != nil || c.canonical != nil {
		return c.datasets
	}
	return decodeRawItems[DatasetConfig](c.Datasets)
}

// DiskConfigs returns the typed view of Disks, keyed as Disks is: every
// disk that is a JSON object, decoded as far as it decodes (Validate says
// what is wrong with the others).
func (c *Config) DiskConfigs() map[string]DiskConfig {
	return values(c.diskItems())
}

// DatasetConfigs returns the typed view of Datasets, keyed as Datasets is,
// as DiskConfigs does.
func (c *Config) DatasetConfigs() map[string]DatasetConfig {
	return values(c.datasetItems())
}

func values[T any](items []item[T]) map[string]T {
	out := make(map[string]T, len(items))
	for i := range items {
		if it := &items[i]; it.object {
			out[it.key] = it.val
		}
	}
	return out
}

// StorageDisks returns the configured disks in the storage reconciler's
// vocabulary, sorted by id; ids are lowercase. For a config that passed
// Validate, that is every disk; otherwise the disks that decode.
func (c *Config) StorageDisks() []storage.DiskConfig {
	items := c.diskItems()
	out := make([]storage.DiskConfig, 0, len(items))
	for i := range items {
		it := &items[i]
		d := &it.val
		if !it.object || it.err != nil || !isUUID(d.ID) || !isUUID(d.PoolID) {
			continue
		}
		out = append(out, storage.DiskConfig{
			ID: strings.ToLower(d.ID),
			Identity: storage.DiskIdentity{
				Vendor: d.Identity.Vendor,
				Model:  d.Identity.Model,
				Serial: d.Identity.Serial,
			},
			PoolID: strings.ToLower(d.PoolID),
		})
	}
	// In key order, which is the ids' in a config that passes validation.
	if len(out) == 0 {
		return nil
	}
	byID := func(a, b storage.DiskConfig) int { return cmp.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(out, byID) {
		slices.SortFunc(out, byID)
	}
	return out
}

// StorageDatasets returns the configured datasets in the storage
// reconciler's vocabulary, sorted by id; ids are lowercase. For a config
// that passed Validate, that is every dataset; otherwise the datasets that
// decode, are on an external pool and have a kind this agent knows (the
// kind becomes part of a path on the sled, so no other is ever passed on).
func (c *Config) StorageDatasets() []storage.DatasetConfig {
	items := c.datasetItems()
	out := make([]storage.DatasetConfig, 0, len(items))
	for i := range items {
		it := &items[i]
		d := &it.val
		if !it.object || it.err != nil || !isUUID(d.ID) {
			continue
		}
		pool, ok := externalPoolID(d.Name.PoolName)
		if !ok || checkDatasetKind(d.Name.Kind) != "" {
			continue
		}
		sd := storage.DatasetConfig{
			ID:          strings.ToLower(d.ID),
			PoolID:      pool,
			Kind:        d.Name.Kind,
			Quota:       copyPtr(d.Quota),
			Reservation: copyPtr(d.Reservation),
			Compression: storage.Compression{Type: d.Compression.Type},
		}
		if d.Compression.Level != nil {
			sd.Compression.Level = int(*d.Compression.Level)
		}
		out = append(out, sd)
	}
	if len(out) == 0 {
		return nil
	}
	byID := func(a, b storage.DatasetConfig) int { return cmp.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(out, byID) {
		slices.SortFunc(out, byID)
	}
	return out
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// externalPoolID is the id in an external pool's name, "oxp_<id>", if the
// name is one Validate accepts.
func externalPoolID(name string) (string, bool) {
	if !isZpoolName(name) {
		return "", false
	}
	return storage.PoolIDFromName(name)
}

// String is the dataset's full name, as upstream names it:
// "oxp_<pool>/crypt/<kind>", or "oxp_<pool>/<kind>" for the kinds that are
// not encrypted (storage.DatasetName).
func (n DatasetName) String() string {
	// storage.DatasetName knows which kinds are encrypted; put this name's
	// pool (external or not) in front of what it puts after the pool.
	within := strings.TrimPrefix(storage.DatasetName("", n.Kind), storage.PoolName(""))
	return n.PoolName + within
}

// durableKinds maps each zone type with a durable dataset to that dataset's
// kind (upstream OmicronZoneType::durable_dataset).
var durableKinds = map[string]string{
	"clickhouse":        "clickhouse",
	"clickhouse_keeper": "clickhouse_keeper",
	"clickhouse_server": "clickhouse_server",
	"cockroach_db":      "cockroachdb",
	"crucible":          "crucible",
	"external_dns":      "external_dns",
	"internal_dns":      "internal_dns",
}

// RootDataset is the name of the zone's transient root dataset: kind
// "zone/<zone name>" on its filesystem_pool. ok is false for a zone without a
// filesystem_pool (upstream's reconciler fails such a zone: "zone config is
// missing a filesystem pool").
func (z Zone) RootDataset() (DatasetName, bool) {
	if z.FilesystemPool == nil {
		return DatasetName{}, false
	}
	return DatasetName{PoolName: *z.FilesystemPool, Kind: "zone/" + z.Name()}, true
}

// DurableDataset is the name of the zone's durable dataset: the durable kind
// of its zone type on zone_type.dataset.pool_name. ok is false for a zone type
// without one.
func (z Zone) DurableDataset() (DatasetName, bool) {
	kind, ok := durableKinds[z.ZoneType.Type]
	if !ok || z.ZoneType.Dataset == nil {
		return DatasetName{}, false
	}
	return DatasetName{PoolName: z.ZoneType.Dataset.PoolName, Kind: kind}, true
}

// MissingZoneDatasets lists the datasets zone z needs (its transient root,
// its durable dataset if its type has one) that c does not configure, in
// that order. Validate accepts a config that lacks them, as upstream's sled
// agent does: upstream ledgers such a config and fails the zone when it
// reconciles it ("zone's transient root dataset is not available"), and so
// should the agent.
func (c *Config) MissingZoneDatasets(z Zone) []DatasetName {
	names := make(map[DatasetName]bool)
	items := c.datasetItems()
	for i := range items {
		if it := &items[i]; it.object {
			names[it.val.Name] = true
		}
	}
	var missing []DatasetName
	if n, ok := z.RootDataset(); ok && !names[n] {
		missing = append(missing, n)
	}
	if n, ok := z.DurableDataset(); ok && !names[n] {
		missing = append(missing, n)
	}
	return missing
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
