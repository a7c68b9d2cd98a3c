package storage

import (
	"fmt"
	"strings"
)

// The dataset kinds, as upstream's DatasetKind spells them, and what the
// reconciler does with one that the config no longer names (an orphan).

// durableKinds hold a zone's data. An orphaned one is destroyed: it belonged
// to a zone that was removed (expunged) from the sled.
var durableKinds = map[string]bool{
	"cockroachdb":       true,
	"crucible":          true,
	"clickhouse":        true,
	"clickhouse_keeper": true,
	"clickhouse_server": true,
	"external_dns":      true,
	"internal_dns":      true,
}

// perDiskKinds are expected on every managed disk. An orphaned one is never
// destroyed (upstream refuses to as well), only reported.
var perDiskKinds = map[string]bool{
	"zone":                      true,
	"debug":                     true,
	"local_storage":             true,
	"local_storage_unencrypted": true,
}

// zoneRootPrefix begins the kind of a zone's transient root, "zone/<zone>".
const zoneRootPrefix = "zone/"

// IsZoneRoot reports whether kind is a zone's transient root, "zone/<zone
// name>".
func IsZoneRoot(kind string) bool {
	name, ok := strings.CutPrefix(kind, zoneRootPrefix)
	return ok && name != "" && !strings.Contains(name, "/")
}

// knownKind reports whether kind is one this agent makes.
func knownKind(kind string) bool {
	return durableKinds[kind] || perDiskKinds[kind] || IsZoneRoot(kind)
}

// kindOf returns the kind of the dataset named name on the pool poolID, if
// name is exactly how one of our kinds is named there ("oxp_<id>/crucible",
// "oxp_<id>/crypt/debug", "oxp_<id>/crypt/zone/oxz_…"). Anything else (the
// pool itself, "oxp_<id>/crypt", something somebody else made) is not ours,
// and the reconciler never touches it.
func kindOf(poolID, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "oxp_")
	if ok {
		rest, ok = strings.CutPrefix(rest, poolID)
	}
	if ok {
		rest, ok = strings.CutPrefix(rest, "/")
	}
	if !ok {
		return "", false
	}
	kind, crypt := strings.CutPrefix(rest, "crypt/")
	// Crucible and local_storage_unencrypted datasets are named outside
	// crypt/, every other kind inside it (DatasetName).
	unencrypted := kind == "crucible" || kind == "local_storage_unencrypted"
	if !knownKind(kind) || crypt == unencrypted {
		return "", false
	}
	return kind, true
}

// orphanPolicy says whether an orphaned dataset of kind may be destroyed,
// and if not, why.
func orphanPolicy(kind string) (destroy bool, reason string) {
	switch {
	case durableKinds[kind]:
		return true, ""
	case perDiskKinds[kind]:
		return false, fmt.Sprintf("not destroyed: a dataset of kind %s is expected on every managed disk", kind)
	default:
		// A zone's transient root goes with its zone: the zone runtime
		// removes it when it removes the zone, and storage never pulls a
		// root out from under a zone that may still be running.
		return false, "not destroyed: a transient zone root is removed with its zone, never by the storage reconciler"
	}
}
