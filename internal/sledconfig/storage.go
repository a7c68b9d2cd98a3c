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

// item is one member of an id-keyed map (disks, datasets), decoded.
type item[T any] struct {
	val T
	// members is the object, a node of t (canonicalized); nil if the
	// member is not a JSON object.
	members *node
	t       *tree
	// err is the first member of the wrong JSON type (encoding/json decodes
	// the rest as best it can).
	err error
	// caseErr is the first key that differs from a field name only in
	// letter case: upstream ignores it as unknown, encoding/json would
	// decode it into the field.
	caseErr *caseError
}

// decodeItems decodes each object of an id-keyed map, m, a node of t
// (canonicalized), and returns them with their keys, sorted.
func decodeItems[T any](t *tree, m *node) (map[string]item[T], []string) {
	if m == nil || m.kind != '{' {
		return map[string]item[T]{}, []string{}
	}
	kids := t.kids(m)
	out := make(map[string]item[T], len(kids))
	keys := make([]string, len(kids))
	p := planFor(reflect.TypeFor[T]())
	for i := range kids {
		n := &kids[i]
		keys[i] = t.key(n) // members are sorted by key
		out[keys[i]] = decodeItem[T](t, n, p)
	}
	return out, keys
}

// decodeRawItems decodes the items of a config built in code.
func decodeRawItems[T any](raw map[string]json.RawMessage) map[string]item[T] {
	out := make(map[string]item[T], len(raw))
	for key, r := range raw {
		if !utf8.Valid(r) {
			out[key] = item[T]{}
			continue
		}
		t, ok := parseTree(r)
		if !ok {
			out[key] = item[T]{}
			continue
		}
		t.canonicalize()
		out[key] = decodeItem[T](t, t.root(), planFor(reflect.TypeFor[T]()))
	}
	return out
}

// decodeItem decodes one item, n, a node of t, of plan p (T's).
func decodeItem[T any](t *tree, n *node, p *plan) item[T] {
	if n.kind != '{' {
		return item[T]{}
	}
	it := item[T]{members: n, t: t}
	d := decoder{t: t}
	d.value(n, reflect.ValueOf(&it.val).Elem(), p)
	if d.err != nil {
		it.err = d.err
	}
	if d.unknown {
		// Only a member that named no field can be a field's name in
		// another letter case: the walk that finds it (and its path)
		// is needed then alone.
		it.caseErr = checkCase(t, n, p)
	}
	return it
}

func (c *Config) diskItems() map[string]item[DiskConfig] {
	if c.disks != nil || c.canonical != nil {
		return c.disks
	}
	return decodeRawItems[DiskConfig](c.Disks) // built in code
}

// diskItemKeys and datasetItemKeys are the keys of diskItems and
// datasetItems, sorted.
func (c *Config) diskItemKeys() []string {
	if c.diskKeys != nil {
		return c.diskKeys
	}
	return sortedKeys(c.diskItems())
}

func (c *Config) datasetItemKeys() []string {
	if c.datasetKeys != nil {
		return c.datasetKeys
	}
	return sortedKeys(c.datasetItems())
}

func (c *Config) datasetItems() map[string]item[DatasetConfig] {
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

func values[T any](items map[string]item[T]) map[string]T {
	out := make(map[string]T, len(items))
	for k, it := range items {
		if it.members != nil {
			out[k] = it.val
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
	for _, key := range c.diskItemKeys() {
		it := items[key]
		d := it.val
		if it.members == nil || it.err != nil || !isUUID(d.ID) || !isUUID(d.PoolID) {
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
	for _, key := range c.datasetItemKeys() {
		it := items[key]
		d := it.val
		if it.members == nil || it.err != nil || !isUUID(d.ID) {
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
	for _, it := range c.datasetItems() {
		if it.members != nil {
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
