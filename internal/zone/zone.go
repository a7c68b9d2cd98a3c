// Package zone holds what the reconciler and the zone runtimes say to each other:
// the spec of a zone to create, what a runtime observes, and the errors that
// drive the reconciler's decisions.
package zone

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Spec is everything a runtime needs to create and start one zone.
type Spec struct {
	// Name is the zone's name, oxz_<kind>_<id>; the runtime names every OS object
	// of the zone from it (or from ID), never from anything else in a request.
	Name string
	// ID is the zone's UUID.
	ID string
	// Hash identifies Config; a runtime records it so a later listing can tell
	// whether a zone that exists is the one wanted.
	Hash string
	// Config is the zone's config as ledgered.
	Config sledconfig.Zone
	// Storage is where the zone's datasets are, when the agent manages
	// storage; set for each start, not part of Hash.
	Storage Storage
}

// Storage is where a zone's datasets are mounted.
type Storage struct {
	// Root is the zone's transient root dataset (zone/<zone name>).
	Root string
	// Data is its durable dataset, "" when the zone has none.
	Data string
}

// VMM zones (oxz_propolis-server_<propolis id>) belong to the VMM manager,
// not to the sled config: the zone reconciler leaves them alone, and no sled
// config can name one (VMMZoneType is not a config zone type).
const (
	VMMNamePrefix = "oxz_propolis-server_"
	VMMZoneType   = "propolis_server"
)

// IsVMM reports whether name is a VMM zone's.
func IsVMM(name string) bool { return strings.HasPrefix(name, VMMNamePrefix) }

// SpecFor builds the spec of a config's zone.
func SpecFor(z *sledconfig.Zone) Spec {
	return Spec{Name: z.Name(), ID: z.ID, Hash: z.Hash(), Config: *z}
}

// Observed is one zone as a runtime sees it.
type Observed struct {
	Name string
	ID   string
	// Hash is the config hash recorded when the zone was created.
	Hash string
	// Running is false for a zone that exists but whose service is not up
	// (crashed, half-created, being torn down).
	Running bool
	// Detail says, for a zone that is not running, what is wrong with it.
	Detail string
}

// ErrGone means the zone that an operation was acting on no longer exists:
// somebody deleted it. Retrying the same operation cannot succeed; the zone has
// to be cleaned up and created again.
var ErrGone = errors.New("zone gone")

// GoneError is an ErrGone that says which zone and what was missing.
type GoneError struct {
	Name   string
	Reason string
}

func (e *GoneError) Error() string {
	return fmt.Sprintf("zone %s gone: %s", e.Name, e.Reason)
}

// Is makes errors.Is(err, ErrGone) true for a GoneError.
func (e *GoneError) Is(target error) bool { return target == ErrGone }
