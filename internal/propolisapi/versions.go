package propolisapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// The versions served. As dropshot's versioned servers do, a request's
// api-version header picks the version whose shapes it is read and
// answered in: APIVersion, or Version5 for any version from 5.0.0 up to
// (not including) 6.0.0. A version newer than APIVersion, or older than
// the oldest served, is a 400; upstream serves older versions still, whose
// documents this server does not know.
//
// The documents differ in one schema only: 6.0.0's NvmeDisk has a required
// has_write_cache, which 5.0.0's (additionalProperties false) does not
// have. A 5.0.0 client's spec is read as 6.0.0's with has_write_cache true
// (upstream's conversion: an NVMe disk had a write cache before the member
// existed); a spec shown to a 5.0.0 client loses the member.
const Version5 = "5.0.0"

// version is an api-version served.
type version int

const (
	v5 version = 5
	v6 version = 6
)

type versionKey struct{}

func withVersion(ctx context.Context, v version) context.Context {
	return context.WithValue(ctx, versionKey{}, v)
}

// versionOf is the version a request is served in.
func versionOf(ctx context.Context) version {
	if v, ok := ctx.Value(versionKey{}).(version); ok {
		return v
	}
	return v6
}

const writeCacheMember = "has_write_cache"

// errSpecShape is a spec whose NVMe disks do not have the shape of the
// request's version.
var errSpecShape = errors.New("init.value.spec")

// specIn is a spec as sent by a client of version v, in 6.0.0's shape
// (compacted). Its NVMe disks must have the shape of v's NvmeDisk as far as
// has_write_cache goes; the rest of the spec is the backend's to judge.
func specIn(v version, raw json.RawMessage) (json.RawMessage, error) {
	return editNVMeDisks(raw, func(key string, disk map[string]json.RawMessage) (bool, error) {
		_, has := disk[writeCacheMember]
		switch {
		case v == v6 && !has:
			return false, fmt.Errorf("%w: components.%s.component: missing field `%s`", errSpecShape, key, writeCacheMember)
		case v == v5 && has:
			return false, fmt.Errorf("%w: components.%s.component: unknown field `%s` (API version %s has no such member; it came in %s)", errSpecShape, key, writeCacheMember, Version5, APIVersion)
		case v == v5:
			disk[writeCacheMember] = json.RawMessage("true")
			return true, nil
		}
		return false, nil
	})
}

// specOut is a stored (6.0.0) spec as shown to a client of version v.
func specOut(v version, raw json.RawMessage) json.RawMessage {
	if v != v5 {
		return raw
	}
	out, err := editNVMeDisks(raw, func(_ string, disk map[string]json.RawMessage) (bool, error) {
		_, has := disk[writeCacheMember]
		delete(disk, writeCacheMember)
		return has, nil
	})
	if err != nil {
		return raw // not a spec this server took; shown as it is
	}
	return out
}

// editNVMeDisks calls edit on the component of every nvme_disk of spec raw,
// in the order of their keys, and returns the spec with the components edit
// changed (it returns whether it did); with none changed, raw itself.
func editNVMeDisks(raw json.RawMessage, edit func(key string, disk map[string]json.RawMessage) (bool, error)) (json.RawMessage, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%w: %v", errSpecShape, err)
	}
	var comps map[string]map[string]json.RawMessage
	if c, ok := doc["components"]; ok {
		if err := json.Unmarshal(c, &comps); err != nil {
			return nil, fmt.Errorf("%w: components: %v", errSpecShape, err)
		}
	}
	changed := false
	for _, key := range slices.Sorted(maps.Keys(comps)) {
		var typ string
		var disk map[string]json.RawMessage
		if json.Unmarshal(comps[key]["type"], &typ) != nil || typ != "nvme_disk" ||
			json.Unmarshal(comps[key]["component"], &disk) != nil || disk == nil {
			continue // the backend judges the rest
		}
		ch, err := edit(key, disk)
		if err != nil {
			return nil, err
		}
		if ch {
			b, err := json.Marshal(disk)
			if err != nil {
				return nil, err
			}
			comps[key]["component"] = b
			changed = true
		}
	}
	if !changed {
		return raw, nil
	}
	var err error
	if doc["components"], err = json.Marshal(comps); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}
