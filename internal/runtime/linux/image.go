package linux

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/zone"
)

// An Image is what runs in a zone of some kind, and how it shows that it is
// ready. Its command line's arguments may hold placeholders, filled in per
// zone:
//
//	{agent}   the agent's binary (as kept in the data dir)
//	{addr}    the zone's service IPv6 address, {port} its port,
//	{listen}  both as "[addr]:port"
//	{root}    the zone root directory
//	{data}    the zone's durable dataset's directory (spec.Storage.Data);
//	          an image that uses it in a zone without one does not start
//	{name} {id} {kind}  the zone's name, id and type
//	{tag}     the runtime's tag (Options.Tag): an NTP zone's command socket
//	          is in chrony.SocketDir({tag}, {id})
//
// Only whole values from the validated config and fixed paths are
// substituted, and the command is executed without a shell.
type Image struct {
	Command []string `json:"command"`
	// Ready says how the service shows that it is ready (ready.go); the
	// zero Ready is a TCP connect to the zone's service address.
	Ready Ready `json:"ready,omitzero"`
}

// DefaultImage is the small service built into the agent: it listens on the
// zone's service address and answers GET /health with its health report,
// which is what readiness waits for.
var DefaultImage = Image{
	Command: []string{"{agent}", "zone-service", "--listen", "{listen}", "--zone", "{name}", "--id", "{id}", "--kind", "{kind}"},
	Ready:   Ready{zoneService: true},
}

// VMMImage is what a VMM zone runs by default: the VMM service built into
// the agent, which plays propolis (internal/vmm/propolis) and answers the
// same health check.
var VMMImage = Image{
	Command: []string{"{agent}", "vmm-service", "--listen", "{listen}", "--id", "{id}"},
	Ready:   Ready{zoneService: true},
}

// NTPImage is what boundary_ntp and internal_ntp zones run by default:
// `sled-agent ntp-zone` (internal/timesync/ntpzone), chronyd configured
// from the zone's mark in its root, ntp-admin on the zone's address at port
// 10123, and the zone service's health on {listen}, which readiness waits
// for. With Options.NTPNoClock the runtime adds --no-clock: chronyd only
// tracks.
var NTPImage = Image{
	Command: []string{"{agent}", "ntp-zone", "--listen", "{listen}", "--root", "{root}", "--tag", "{tag}"},
	Ready:   Ready{zoneService: true},
}

// isNTP reports whether zones of kind t are NTP zones.
func isNTP(t string) bool { return t == "boundary_ntp" || t == "internal_ntp" }

// imageFor returns what runs in the zone: its kind's image from the
// options, else the default for its kind.
func (r *Runtime) imageFor(spec zone.Spec) Image {
	t := spec.Config.ZoneType.Type
	if img, ok := r.opts.Images[t]; ok {
		return img
	}
	switch {
	case t == zone.VMMZoneType:
		return VMMImage
	case isNTP(t):
		img := NTPImage
		if r.opts.NTPNoClock {
			img.Command = append(slices.Clip(img.Command), "--no-clock")
		}
		return img
	}
	return DefaultImage
}

// expand fills in the placeholders of img's command for one zone.
func (img Image) expand(spec zone.Spec, addr netip.AddrPort, agent, root, tag string) ([]string, error) {
	if len(img.Command) == 0 {
		return nil, fmt.Errorf("empty image for zone kind %s", spec.Config.ZoneType.Type)
	}
	return expander(spec, addr, agent, root, tag).expand(img.Command)
}

// placeholders fills in the placeholders of an image's argv (its command,
// or its readiness command).
type placeholders struct {
	r *strings.Replacer
	// noData names the zone when it has no durable dataset: {data}
	// cannot be filled in.
	noData string
}

// expander fills in the placeholders for one zone; {data} is its
// spec.Storage.Data.
func expander(spec zone.Spec, addr netip.AddrPort, agent, root, tag string) placeholders {
	var noData string
	if spec.Storage.Data == "" {
		noData = spec.Name
	}
	return placeholders{noData: noData, r: strings.NewReplacer(
		"{agent}", agent,
		"{addr}", addr.Addr().String(),
		"{port}", fmt.Sprint(addr.Port()),
		"{listen}", addr.String(),
		"{root}", root,
		"{data}", spec.Storage.Data,
		"{name}", spec.Name,
		"{id}", spec.ID,
		"{kind}", spec.Config.ZoneType.Type,
		"{tag}", tag,
	)}
}

func (p placeholders) expand(argv []string) ([]string, error) {
	out := make([]string, len(argv))
	for i, a := range argv {
		if p.noData != "" && strings.Contains(a, "{data}") {
			return nil, fmt.Errorf("zone %s has no durable dataset, and its image uses {data} (%q)", p.noData, a)
		}
		out[i] = p.r.Replace(a)
	}
	return out, nil
}
