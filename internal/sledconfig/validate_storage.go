package sledconfig

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// The rules for disks and datasets are upstream's (sled-agent API 48.0.0,
// omicron-common's DatasetKind, the sled-agent types' CompressionAlgorithm
// and ByteCount), what upstream's decoder refuses counting as malformed;
// and, as unrealisable, what no sled can carry out: two disks with one
// identity or one pool, two datasets with one name (so at most one durable
// dataset of a kind per pool), a reservation above the quota, a gzip level
// outside 1 to 9.
//
// What upstream's sled agent accepts and then fails at reconciliation is
// accepted here too, and left to the reconcilers to report:
//   - a zone whose transient root (zone/<zone name> on its filesystem_pool)
//     or durable dataset is not in the config (upstream ledgers it and
//     fails the zone: "zone's transient root dataset is not available");
//     MissingZoneDatasets names them. Refusing them would refuse configs
//     upstream takes (and Nexus does send the datasets with the zones);
//   - a dataset on a pool that is not one of the config's disks' pools
//     (upstream: "configured dataset on zpool we're not managing", err);
//   - a zone/<zone name> dataset without a zone dataset on its pool.
//
// Where this agent is stricter than upstream's decoder, the comment at the
// check says why.

// maxByteCount is the largest quota or reservation upstream takes: its
// ByteCount is kept in a signed 64-bit database column.
const maxByteCount = math.MaxInt64

// datasetKinds are upstream's DatasetKinds other than zone/<zone name>, as
// it writes them, and whether each is a zone's durable dataset (upstream
// DatasetKind::zoned: delegated to the zone, destroyed when orphaned).
var datasetKinds = map[string]bool{
	"cockroachdb":               true,
	"crucible":                  true,
	"clickhouse":                true,
	"clickhouse_keeper":         true,
	"clickhouse_server":         true,
	"external_dns":              true,
	"internal_dns":              true,
	"zone":                      false,
	"debug":                     false,
	"local_storage":             false,
	"local_storage_unencrypted": false,
}

// zoneNamePrefixes are the kind prefixes of zone names (Zone.Name).
var zoneNamePrefixes = func() map[string]bool {
	m := make(map[string]bool, len(zoneKinds))
	for _, p := range zoneKinds {
		m[p] = true
	}
	return m
}()

// isZoneName reports whether name is one this agent gives (Zone.Name):
// oxz_<kind prefix>_<lowercase zone id>.
func isZoneName(name string) bool {
	rest, ok := strings.CutPrefix(name, ZoneNamePrefix)
	const idLen = 36
	if !ok || len(rest) < idLen+2 || rest[len(rest)-idLen-1] != '_' {
		return false
	}
	return zoneNamePrefixes[rest[:len(rest)-idLen-1]] && isLowerUUID(rest[len(rest)-idLen:], false)
}

// checkDatasetKind says what is wrong with a dataset kind, or returns "".
func checkDatasetKind(kind string) string {
	if _, ok := datasetKinds[kind]; ok {
		return ""
	}
	name, ok := strings.CutPrefix(kind, "zone/")
	if !ok {
		return fmt.Sprintf("%q is not a dataset kind (want one of %s, or zone/<zone name>)",
			kind, strings.Join(sortedKeys(datasetKinds), ", "))
	}
	// Upstream takes any name after "zone/". The name becomes a path on the
	// sled, and names the agent puts on the sled come only from validated
	// UUIDs: so only the names of zones, as upstream and this agent name
	// them, are taken.
	if !isZoneName(name) {
		return fmt.Sprintf("%q: the name after zone/ must be a zone name, oxz_<zone kind>_<lowercase zone id>", kind)
	}
	return ""
}

// compressionTypes are upstream's CompressionAlgorithm variants.
var compressionTypes = []string{"on", "off", "gzip", "gzip_n", "lz4", "lzjb", "zle"}

// where is the path of an item of an id-keyed map (disks["<id>"]), or of a
// value within it (inner: ".zone_type.nic"), written out only when a problem
// is reported there: building the path of everything checked would cost
// more than the checks.
type where struct{ field, key, inner string }

// at is the path of sub (".pool_id", "" for the value itself) in the value.
func (w where) at(sub string) string { return keyPath(w.field, w.key) + w.inner + sub }

// in is the path of sub in the value.
func (w where) in(sub string) where {
	w.inner += sub // no copy while inner is "", as it is for the values most checked
	return w
}

// itemStart checks what every member of an id-keyed map must be: a JSON
// object, its id its key and a UUID, its members of the right JSON types.
// It reports false when the object is not one (nothing more can be said),
// and returns the field (dotted, within the object) whose value has the
// wrong type, so the caller says nothing more about it.
func itemStart[T any](v *validator, w where, key string, it *item[T]) (bad string, ok bool) {
	if !it.object {
		v.add(w.at(""), "is not a JSON object")
		return "", false
	}
	if it.caseErr != nil {
		v.add(w.at("."+it.caseErr.path), "%s", it.caseErr.message())
	}
	switch {
	case it.idKind == 0 || it.idKind == 'n': // not present
		v.add(w.at(".id"), "is required")
	case it.idKind != '"':
		v.add(w.at(".id"), "%s is not a string", literalAt(it.raw, "id"))
	case !isUUID(it.id):
		v.add(w.at(".id"), "%q is not a UUID (want the 36-character hyphenated form)", it.id)
	case it.id != key:
		v.add(w.at(".id"), "%q does not match its key %q", it.id, key)
	}
	if it.err == nil {
		return "", true
	}
	bad = it.err.Field
	if bad != "id" { // said above
		v.add(w.at("."+bad), "%s is not %s", literalAt(it.raw, bad), describeType(it.err.Type))
	}
	return bad, true
}

// literalAt is the JSON at a dotted path of member names in raw, the
// canonical JSON of an object. (Read again, as it is needed only for a
// problem.)
func literalAt(raw []byte, path string) string {
	t, ok := parseTree(raw)
	if !ok {
		return "the value" // not so: raw is JSON
	}
	defer t.release()
	t.canonicalize()
	return literalIn(t, t.root(), path)
}

// literalIn is the JSON at a dotted path of member names below members,
// an object of t (canonicalized).
func literalIn(t *tree, members *node, path string) string {
	first, rest, nested := strings.Cut(path, ".")
	m := t.member(members, first)
	switch {
	case m == nil:
		return "the value"
	case !nested || m.kind != '{' && m.kind != 'n':
		return string(t.canonical[m.start:m.end])
	}
	return literalIn(t, m, rest)
}

// under reports whether field is bad or inside it.
func under(field, bad string) bool {
	return bad != "" && (field == bad || strings.HasPrefix(field, bad+"."))
}

// diskMembers and datasetMembers are the members of disks and datasets,
// by dotted path, whose presence validation asks about: Parse notes which
// an item has (item.has).
var (
	diskMembers    = newAskedMembers("identity", "identity.vendor", "identity.model", "identity.serial", "pool_id")
	datasetMembers = newAskedMembers("name", "name.pool_name", "name.kind", "compression")
)

// idCaseDuplicates reports keys of the id-keyed map field (items) that
// differ only in letter case: upstream parses both into one id, so the
// document names the thing (what) twice.
func idCaseDuplicates[T any](v *validator, field, what string, items []item[T]) {
	v.caseDuplicates(field, len(items), func(i int) string { return items[i].key }, func(prev, _ string) string {
		return fmt.Sprintf("%s id differs from %s %q only in letter case", what, what, prev)
	})
}

// mayFold reports whether key has an upper-case or a non-ASCII letter.
func mayFold(key string) bool {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(key); i += 8 {
		// Eight bytes at a time: a non-ASCII byte has its top bit set;
		// with none, adding 0x80-'A' to each byte sets the top bit of
		// those from 'A' up, and adding 0x80-'Z'-1 that of those after
		// 'Z', without carrying into the next byte.
		w := load64(key[i : i+8])
		if w&tops != 0 || (w+ones*(0x80-'A'))&^(w+ones*(0x80-'Z'-1))&tops != 0 {
			return true
		}
	}
	for ; i < len(key); i++ {
		if c := key[i]; 'A' <= c && c <= 'Z' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// disks checks the configured disks (items, sorted by key): an identity of
// three strings and a pool id, a UUID; no two with one identity or one pool.
func (v *validator) disks(items []item[DiskConfig]) {
	identities := make(map[DiskIdentity]string, len(items))
	pools := make(map[string]string, len(items))
	for i := range items {
		it := &items[i]
		key := it.key
		w := where{field: "disks", key: key}
		bad, ok := itemStart(v, w, key, it)
		if !ok {
			continue
		}
		d := &it.val
		idOK := true
		switch {
		case under("identity", bad):
			idOK = false
		case !it.has("identity"):
			v.add(w.at(".identity"), "is required")
			idOK = false
		default:
			for _, f := range []struct{ path, value string }{
				{"identity.vendor", d.Identity.Vendor}, {"identity.model", d.Identity.Model}, {"identity.serial", d.Identity.Serial},
			} {
				switch {
				case under(f.path, bad):
					idOK = false
				case !it.has(f.path):
					v.add(w.at("."+f.path), "is required")
					idOK = false
				case strings.TrimSpace(f.value) == "":
					// Upstream takes an empty string; no disk is found by one.
					v.unrealisable(w.at("."+f.path), "is empty; a disk is found by its vendor, model and serial")
					idOK = false
				}
			}
		}
		if idOK {
			if prev, dup := identities[d.Identity]; dup {
				v.unrealisable(w.at(".identity"), "%s/%s/%s is also the identity of disk %q",
					d.Identity.Vendor, d.Identity.Model, d.Identity.Serial, prev)
			} else {
				identities[d.Identity] = key
			}
		}
		switch {
		case under("pool_id", bad):
			continue
		case !it.has("pool_id"):
			v.add(w.at(".pool_id"), "is required")
			continue
		}
		if !isUUID(d.PoolID) {
			v.uuid(w, ".pool_id", d.PoolID)
		} else {
			pool := strings.ToLower(d.PoolID)
			if prev, dup := pools[pool]; dup {
				v.unrealisable(w.at(".pool_id"), "pool %s is also the pool of disk %q", pool, prev)
			} else {
				pools[pool] = key
			}
		}
	}
	idCaseDuplicates(v, "disks", "disk", items)
}

// datasets checks the configured datasets: a name of an external pool and
// a kind upstream knows, a compression algorithm, a quota and reservation
// upstream can hold, the reservation within the quota; no two with one name.
func (v *validator) datasets(items []item[DatasetConfig]) {
	names := make(map[DatasetName]string, len(items))
	for i := range items {
		it := &items[i]
		key := it.key
		w := where{field: "datasets", key: key}
		bad, ok := itemStart(v, w, key, it)
		if !ok {
			continue
		}
		d := &it.val
		if v.datasetName(w, it, bad) {
			n := d.Name
			switch prev, dup := names[n]; {
			case dup && datasetKinds[n.Kind]:
				v.unrealisable(w.at(".name"), "pool %s already has a %s dataset, %q: a pool holds at most one durable dataset of a kind",
					n.PoolName, n.Kind, prev)
			case dup:
				v.unrealisable(w.at(".name"), "%s is also the name of dataset %q", n, prev)
			default:
				names[n] = key
			}
		}
		v.compression(w, it, bad)
		for _, f := range []struct {
			name  string
			value *uint64
		}{{"quota", d.Quota}, {"reservation", d.Reservation}} {
			if f.value != nil && *f.value > maxByteCount && !under(f.name, bad) {
				v.add(w.at("."+f.name), "%d is larger than the largest byte count, %d (upstream keeps byte counts in a signed 64-bit integer)",
					*f.value, uint64(maxByteCount))
			}
		}
		if q, r := d.Quota, d.Reservation; q != nil && r != nil && *r > *q && *q <= maxByteCount {
			v.unrealisable(w.at(".reservation"), "%d is more than the quota, %d", *r, *q)
		}
	}
	idCaseDuplicates(v, "datasets", "dataset", items)
}

// datasetName checks a dataset's name and reports whether it is one.
func (v *validator) datasetName(w where, it *item[DatasetConfig], bad string) bool {
	if under("name", bad) {
		return false
	}
	if !it.has("name") {
		v.add(w.at(".name"), "is required")
		return false
	}
	n := &it.val.Name
	ok := true
	switch {
	case under("name.pool_name", bad):
		ok = false
	case !it.has("name.pool_name"):
		v.add(w.at(".name.pool_name"), "is required")
		ok = false
	case !isZpoolName(n.PoolName):
		v.add(w.at(".name.pool_name"), "%q is not a zpool name like oxp_<uuid> (lowercase version-4 UUID)", n.PoolName)
		ok = false
	case !strings.HasPrefix(n.PoolName, "oxp_"):
		// Upstream decodes it, and fails the dataset: it manages datasets
		// on the pools of the config's disks, which are external.
		v.unrealisable(w.at(".name.pool_name"), "%s is an internal pool; a sled config's datasets are on the external pools of its disks (oxp_<uuid>)", n.PoolName)
		ok = false
	}
	switch {
	case under("name.kind", bad):
		ok = false
	case !it.has("name.kind"):
		v.add(w.at(".name.kind"), "is required")
		ok = false
	default:
		if msg := checkDatasetKind(n.Kind); msg != "" {
			v.add(w.at(".name.kind"), "%s", msg)
			ok = false
		}
	}
	return ok
}

func (v *validator) compression(w where, it *item[DatasetConfig], bad string) {
	if under("compression", bad) {
		return
	}
	if !it.has("compression") {
		v.add(w.at(".compression"), "is required")
		return
	}
	c := &it.val.Compression
	switch {
	case under("compression.type", bad):
	case c.Type == "":
		v.add(w.at(".compression.type"), "is required")
	case !slices.Contains(compressionTypes, c.Type):
		v.add(w.at(".compression.type"), "unknown compression algorithm %q (want one of %s)", c.Type, strings.Join(compressionTypes, ", "))
	case c.Type == "gzip_n" && under("compression.level", bad):
	case c.Type == "gzip_n" && c.Level == nil:
		v.add(w.at(".compression.level"), "is required for compression type gzip_n")
	case c.Type == "gzip_n" && (*c.Level < 1 || *c.Level > 9):
		// Upstream decodes any u8, and cannot set it: gzip levels are 1 to 9.
		v.unrealisable(w.at(".compression.level"), "%d is not a gzip level, 1 to 9", *c.Level)
	}
	// A level on another type is a member upstream does not know: kept, as
	// unknown members are.
}
