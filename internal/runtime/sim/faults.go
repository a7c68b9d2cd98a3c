package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Faults is the fault map, in its JSON form:
//
//	{"zones": {"<zone uuid>": {"start": "hang" | "fail" | "<Go duration>",
//	                           "stop": "hang" | "fail" | "<Go duration>",
//	                           "vanish_after": "<Go duration>",
//	                           "health": "fail" | "hang"}},
//	 "disks": {"<disk serial>": {"ensure": "hang" | "fail" | "<Go duration>",
//	                             "present": false}},
//	 "timesync": {"synced": false}}
//
// "hang" blocks until the call's context ends; "fail" fails every time; a
// duration delays and then succeeds; vanish_after makes a running zone
// disappear that long after it started; health makes a running zone's health
// checks fail at once ("fail") or not answer until their deadline ("hang"),
// as a service that is alive but stopped or deadlocked would. A disk's
// ensure applies to every call on it, its pool or its datasets (making,
// opening, closing the pool; listing, ensuring, destroying datasets), as a
// dying disk would; present false pulls the disk out of the machine (its
// pool and datasets come back with it); timesync synced false holds the
// NTP zones unsynchronized (timesync.go). Zones and disks not in the map
// behave normally.
// Every member is optional: a map with only disks, or only timesync, leaves
// every zone fault-free.
type Faults struct {
	Zones    map[string]ZoneFaults `json:"zones,omitempty" doc:"Faults of zones, by zone UUID."`
	Disks    map[string]DiskFaults `json:"disks,omitempty" doc:"Faults of disks, by serial."`
	TimeSync *TimeSyncFaults       `json:"timesync,omitempty" doc:"Faults of the NTP zones' time synchronization."`
}

// DiskFaults are the faults of one disk, by serial.
type DiskFaults struct {
	Ensure string `json:"ensure,omitempty" doc:"\"hang\", \"fail\" or a Go duration (delay, then succeed): every call on the disk, its pool and its datasets."`
	// Present false: the disk is not in the machine. Absent: it is.
	Present *bool `json:"present,omitempty" doc:"false: the disk is not in the machine until the fault is cleared."`
}

// ZoneFaults are the faults of one zone.
type ZoneFaults struct {
	Start       string `json:"start,omitempty" doc:"\"hang\" (until the call's deadline), \"fail\" or a Go duration (delay, then succeed)."`
	Stop        string `json:"stop,omitempty" doc:"\"hang\", \"fail\" or a Go duration, as start."`
	VanishAfter string `json:"vanish_after,omitempty" doc:"A Go duration: the running zone disappears that long after it started."`
	Health      string `json:"health,omitempty" enum:"fail,hang" doc:"The zone's health checks fail at once (\"fail\") or do not answer until their deadline (\"hang\")."`
}

// behavior is one parsed "hang" | "fail" | duration.
type behavior struct {
	hang, fail bool
	delay      time.Duration
}

type zoneFaults struct {
	start, stop behavior
	vanishAfter time.Duration
	health      behavior
}

type diskFaults struct {
	ensure behavior
	absent bool
}

// compiled is a checked fault map: zones by id, disks by serial.
type compiled struct {
	zones map[string]zoneFaults
	disks map[string]diskFaults
}

// ParseFaults decodes and checks a fault map. Errors name the zone and field.
func ParseFaults(data []byte) (Faults, error) {
	var f Faults
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Faults{}, fmt.Errorf("fault map: %w", err)
	}
	_, err := f.compile()
	return f, err
}

// LoadFaults reads a fault map from a file.
func LoadFaults(path string) (Faults, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Faults{}, fmt.Errorf("reading fault map: %w", err)
	}
	f, err := ParseFaults(data)
	if err != nil {
		return Faults{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

func (f Faults) compile() (compiled, error) {
	zones, zerr := f.compileZones()
	disks, derr := f.compileDisks()
	return compiled{zones: zones, disks: disks}, errors.Join(zerr, derr)
}

func (f Faults) compileDisks() (map[string]diskFaults, error) {
	out := make(map[string]diskFaults, len(f.Disks))
	var errs []error
	for _, serial := range slices.Sorted(maps.Keys(f.Disks)) {
		df := f.Disks[serial]
		if strings.TrimSpace(serial) == "" {
			errs = append(errs, fmt.Errorf("disks[%q]: not a disk serial", serial))
			continue
		}
		var c diskFaults
		var err error
		if c.ensure, err = parseBehavior(df.Ensure); err != nil {
			errs = append(errs, fmt.Errorf("disks[%q].ensure: %w", serial, err))
		}
		c.absent = df.Present != nil && !*df.Present
		out[serial] = c
	}
	return out, errors.Join(errs...)
}

func (f Faults) compileZones() (map[string]zoneFaults, error) {
	out := make(map[string]zoneFaults, len(f.Zones))
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(f.Zones)) {
		zf := f.Zones[id]
		u, err := uuid.Parse(id)
		if err != nil || len(id) != 36 {
			errs = append(errs, fmt.Errorf("zones[%q]: not a zone UUID", id))
			continue
		}
		var c zoneFaults
		if c.start, err = parseBehavior(zf.Start); err != nil {
			errs = append(errs, fmt.Errorf("zones[%q].start: %w", id, err))
		}
		if c.stop, err = parseBehavior(zf.Stop); err != nil {
			errs = append(errs, fmt.Errorf("zones[%q].stop: %w", id, err))
		}
		switch zf.Health {
		case "":
		case "fail", "hang":
			c.health, _ = parseBehavior(zf.Health)
		default:
			errs = append(errs, fmt.Errorf("zones[%q].health: %q is not \"fail\" or \"hang\"", id, zf.Health))
		}
		if zf.VanishAfter != "" {
			d, err := time.ParseDuration(zf.VanishAfter)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("zones[%q].vanish_after: %q is not a non-negative Go duration", id, zf.VanishAfter))
			}
			c.vanishAfter = d
		}
		out[u.String()] = c
	}
	return out, errors.Join(errs...)
}

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "":
		return behavior{}, nil
	case "hang":
		return behavior{hang: true}, nil
	case "fail":
		return behavior{fail: true}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return behavior{}, fmt.Errorf("%q is not \"hang\", \"fail\" or a non-negative Go duration", s)
	}
	return behavior{delay: d}, nil
}
