package linux

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Owned is everything on the machine that carries this agent's marks and is
// of its sled, part of a whole zone or not: what a restarted agent must
// account for.
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
// agent's marks and is of this sled: of a zone whose root is ours, or one
// whose claim names our sled (see claim.go). Parts with our marks that are
// not proven ours are not in it.
func (r *Runtime) Owned(ctx context.Context) (Owned, error) {
	var o Owned
	var err error
	if o.Zones, err = r.List(ctx); err != nil {
		return o, err
	}
	claims, err := r.claims()
	if err != nil {
		return o, err
	}
	names, ids := map[string]bool{}, map[string]bool{}
	for _, z := range o.Zones {
		names[z.Name], ids[strings.ToLower(z.ID)] = true, true
	}
	for name, c := range claims {
		if c.Sled == r.opts.Sled {
			names[name], ids[idFromName(name)] = true, true
		}
	}
	nss, links, err := zonenet.List(r.opts.NetnsPrefix+sledconfig.ZoneNamePrefix, r.opts.Tag)
	if err != nil {
		return o, err
	}
	for _, ns := range nss {
		if names[strings.TrimPrefix(ns, r.opts.NetnsPrefix)] {
			o.Namespaces = append(o.Namespaces, ns)
		}
	}
	for _, l := range links {
		if ids[strings.ToLower(l.ZoneID)] {
			o.Links = append(o.Links, l)
		}
	}
	procs, err := supervise.ListMarked(r.serviceRoot())
	if err != nil {
		return o, err
	}
	for _, p := range procs {
		if names[filepath.Base(p.Dir)] {
			o.Processes = append(o.Processes, p)
		}
	}
	return o, nil
}
