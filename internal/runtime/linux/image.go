package linux

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sled-agent/sled-agent/internal/zone"
)

// An Image is what runs in a zone of some kind: a command line whose
// arguments may hold placeholders, filled in per zone:
//
//	{agent}   the agent's binary (as kept in the data dir)
//	{addr}    the zone's service IPv6 address, {port} its port,
//	{listen}  both as "[addr]:port"
//	{root}    the zone root directory
//	{name} {id} {kind}  the zone's name, id and type
//
// Only whole values from the validated config and fixed paths are
// substituted, and the command is executed without a shell.
type Image []string

// DefaultImage is the small service built into the agent: it listens on the
// zone's service address and answers a health check.
var DefaultImage = Image{"{agent}", "zone-service", "--listen", "{listen}", "--zone", "{name}", "--id", "{id}", "--kind", "{kind}"}

// VMMImage is what a VMM zone runs by default: the VMM service built into
// the agent, which plays propolis (internal/vmm/propolis).
var VMMImage = Image{"{agent}", "vmm-service", "--listen", "{listen}", "--id", "{id}"}

// expand fills in the placeholders of img for one zone.
func (img Image) expand(spec zone.Spec, addr netip.AddrPort, agent, root string) ([]string, error) {
	if len(img) == 0 {
		return nil, fmt.Errorf("empty image for zone kind %s", spec.Config.ZoneType.Type)
	}
	r := strings.NewReplacer(
		"{agent}", agent,
		"{addr}", addr.Addr().String(),
		"{port}", fmt.Sprint(addr.Port()),
		"{listen}", addr.String(),
		"{root}", root,
		"{name}", spec.Name,
		"{id}", spec.ID,
		"{kind}", spec.Config.ZoneType.Type,
	)
	out := make([]string, len(img))
	for i, a := range img {
		out[i] = r.Replace(a)
	}
	return out, nil
}
