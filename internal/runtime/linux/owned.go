package linux

import (
	"context"
	"path/filepath"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Owned is everything on the machine that carries this agent's marks, part
// of a whole zone or not: what a restarted agent must account for.
type Owned struct {
	// Zones are the zones whose roots carry our mark (as List reports them).
	Zones []zone.Observed
	// Namespaces are the network namespaces with our zone-name prefix.
	Namespaces []string
	// Links are the host links whose alias carries our tag.
	Links []zonenet.Link
	// Processes carry the mark of a service directory under our run dir.
	Processes []supervise.MarkedProcess
}

// Owned lists every zone, namespace, link and process that carries this
// agent's marks.
func (r *Runtime) Owned(ctx context.Context) (Owned, error) {
	var o Owned
	var err error
	if o.Zones, err = r.List(ctx); err != nil {
		return o, err
	}
	if o.Namespaces, o.Links, err = zonenet.List(r.opts.NetnsPrefix+sledconfig.ZoneNamePrefix, r.opts.Tag); err != nil {
		return o, err
	}
	if o.Processes, err = supervise.ListMarked(filepath.Join(r.opts.RunDir, r.opts.Tag)); err != nil {
		return o, err
	}
	return o, nil
}
