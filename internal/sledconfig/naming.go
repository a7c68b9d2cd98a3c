package sledconfig

import (
	"net/netip"
	"slices"
	"strings"
)

// zoneKinds maps each known zone type to the prefix of its zone name.
var zoneKinds = map[string]string{
	"boundary_ntp":      "ntp",
	"internal_ntp":      "ntp",
	"clickhouse":        "clickhouse",
	"clickhouse_keeper": "clickhouse_keeper",
	"clickhouse_server": "clickhouse_server",
	"cockroach_db":      "cockroachdb",
	"crucible":          "crucible",
	"crucible_pantry":   "crucible_pantry",
	"external_dns":      "external_dns",
	"internal_dns":      "internal_dns",
	"nexus":             "nexus",
	"oximeter":          "oximeter",
}

// ZoneNamePrefix is the prefix of every zone name this agent creates.
const ZoneNamePrefix = "oxz_"

// KnownZoneType reports whether t is a zone type this agent knows.
func KnownZoneType(t string) bool {
	_, ok := zoneKinds[t]
	return ok
}

// Name is the zone's name, oxz_<kind prefix>_<zone id>, as upstream names it.
func (z Zone) Name() string {
	return ZoneNamePrefix + zoneKinds[z.ZoneType.Type] + "_" + strings.ToLower(z.ID)
}

// ServiceAddr is the zone's main service address on the underlay: the address a
// health check of the zone's service goes to. ok is false if the zone has none
// that parses.
func (z Zone) ServiceAddr() (netip.AddrPort, bool) {
	t := &z.ZoneType
	s := t.Address
	switch t.Type {
	case "nexus":
		s = t.InternalAddress
	case "external_dns", "internal_dns":
		s = t.HTTPAddress
	}
	ap, err := netip.ParseAddrPort(s)
	return ap, err == nil
}

// UnderlayAddrs lists the distinct underlay IPv6 addresses the zone itself
// holds (not the global-zone address of an internal DNS zone, and not external
// addresses). Unparseable addresses are skipped; Validate reports them.
func (z Zone) UnderlayAddrs() []netip.Addr {
	return appendUnderlayAddrs(nil, &z.ZoneType)
}

// appendUnderlayAddrs appends the UnderlayAddrs of a zone of type t to dst.
func appendUnderlayAddrs(dst []netip.Addr, t *ZoneType) []netip.Addr {
	start := len(dst)
	add := func(s string) {
		if s == "" {
			return // not set (and parsing "" would allocate its error)
		}
		ap, err := netip.ParseAddrPort(s)
		if err != nil || !ap.Addr().Is6() || ap.Addr().Is4In6() {
			return
		}
		if slices.Contains(dst[start:], ap.Addr()) {
			return
		}
		dst = append(dst, ap.Addr())
	}
	add(t.Address)
	add(t.InternalAddress)
	add(t.HTTPAddress)
	if t.Type != "external_dns" {
		// internal_dns serves DNS on the underlay; external_dns's dns_address
		// is its external address.
		add(t.DNSAddress)
	}
	return dst
}
