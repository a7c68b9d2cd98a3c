package agent

import (
	"cmp"
	"context"

	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/vpc/told"
)

// probeZones are the probes' zones of a sled of cfg: namespaces named from
// its namespace prefix, links marked with its tag.
func probeZones(cfg Config) probes.Namespaces {
	return probes.Namespaces{Prefix: cfg.NetnsPrefix, Tag: cmp.Or(cfg.ZoneTag, DefaultZoneTag)}
}

// vpcWithProbes is the record as the API drives it, with the probes' zones
// following every set recorded (PUT /probes).
type vpcWithProbes struct {
	*told.Store
	probes *probes.Reconciler
}

func (v vpcWithProbes) SetProbes(ctx context.Context, s told.ProbeSet) error {
	if err := v.Store.SetProbes(ctx, s); err != nil {
		return err
	}
	v.probes.Set(v.Store.View().Probes)
	return nil
}
