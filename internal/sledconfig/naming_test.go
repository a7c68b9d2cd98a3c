package sledconfig

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestZoneName(t *testing.T) {
	const id = "0ccf27c0-e32d-4b52-a2c5-6db0c64a26f9"
	for _, tc := range []struct{ typ, want string }{
		{"boundary_ntp", "oxz_ntp_" + id},
		{"internal_ntp", "oxz_ntp_" + id},
		{"clickhouse", "oxz_clickhouse_" + id},
		{"clickhouse_keeper", "oxz_clickhouse_keeper_" + id},
		{"clickhouse_server", "oxz_clickhouse_server_" + id},
		{"cockroach_db", "oxz_cockroachdb_" + id},
		{"crucible", "oxz_crucible_" + id},
		{"crucible_pantry", "oxz_crucible_pantry_" + id},
		{"external_dns", "oxz_external_dns_" + id},
		{"internal_dns", "oxz_internal_dns_" + id},
		{"nexus", "oxz_nexus_" + id},
		{"oximeter", "oxz_oximeter_" + id},
	} {
		z := Zone{ID: id, ZoneType: ZoneType{Type: tc.typ}}
		if got := z.Name(); got != tc.want {
			t.Errorf("%s: Name() = %q, want %q", tc.typ, got, tc.want)
		}
		upper := Zone{ID: strings.ToUpper(id), ZoneType: ZoneType{Type: tc.typ}}
		if got := upper.Name(); got != tc.want {
			t.Errorf("%s with an upper-case id: Name() = %q, want %q", tc.typ, got, tc.want)
		}
	}
}

func TestZoneNamesOfExample(t *testing.T) {
	cfg, err := Parse(exampleBytes(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{nexusID, "oxz_nexus_" + nexusID},
		{internalNTPID, "oxz_ntp_" + internalNTPID},
		{externalDNSID, "oxz_external_dns_" + externalDNSID},
		{crucibleID, "oxz_crucible_" + crucibleID},
	} {
		z := cfg.Zones[tc.id]
		if got := z.Name(); got != tc.want {
			t.Errorf("Name() = %q, want %q", got, tc.want)
		}
	}
}

func TestKnownZoneType(t *testing.T) {
	for _, typ := range []string{"", "ntp", "cockroachdb", "Nexus", "propolis-server"} {
		if KnownZoneType(typ) {
			t.Errorf("KnownZoneType(%q) = true", typ)
		}
	}
	// Validate's table of variants covers exactly the known types.
	known := slices.Sorted(maps.Keys(zoneKinds))
	if diff := cmp.Diff(known, slices.Sorted(maps.Keys(zoneVariants))); diff != "" {
		t.Errorf("zoneVariants and zoneKinds disagree (-kinds +variants):\n%s", diff)
	}
	for _, typ := range known {
		if !KnownZoneType(typ) {
			t.Errorf("KnownZoneType(%q) = false", typ)
		}
	}
}

func TestUnderlayAddrs(t *testing.T) {
	cfg, err := Parse(encode(t, fullDoc(t)))
	if err != nil {
		t.Fatal(err)
	}
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		id   string
		want []netip.Addr
	}{
		{crucibleID, addrs("fd00:1122:3344:103::5")},
		{nexusID, addrs("fd00:1122:3344:103::47")},
		// dns_address 172.20.26.2 is external.
		{externalDNSID, addrs("fd00:1122:3344:103::46")},
		// dns and http share one address; gz_address is the global zone's.
		{internalDNSID, addrs("fd00:1122:3344:1::1")},
		{boundaryNTPID, addrs("fd00:1122:3344:103::101")},
	} {
		z := cfg.Zones[tc.id]
		if diff := cmp.Diff(tc.want, z.UnderlayAddrs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("zone %s: UnderlayAddrs (-want +got):\n%s", tc.id, diff)
		}
	}

	// An external DNS server on an external IPv6 address does not hold that
	// address on the underlay.
	z := cfg.Zones[externalDNSID]
	z.ZoneType.DNSAddress = "[2001:db8::53]:53"
	if got := z.UnderlayAddrs(); len(got) != 1 || got[0] != netip.MustParseAddr("fd00:1122:3344:103::46") {
		t.Errorf("external_dns with an IPv6 dns_address: UnderlayAddrs = %v", got)
	}
}

func TestServiceAddr(t *testing.T) {
	cfg, err := Parse(encode(t, fullDoc(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{crucibleID, "[fd00:1122:3344:103::5]:32345"},
		{nexusID, "[fd00:1122:3344:103::47]:12221"},
		{externalDNSID, "[fd00:1122:3344:103::46]:5353"},
		{internalDNSID, "[fd00:1122:3344:1::1]:5353"},
	} {
		z := cfg.Zones[tc.id]
		got, ok := z.ServiceAddr()
		if !ok || got.String() != tc.want {
			t.Errorf("zone %s: ServiceAddr = %v, %v; want %s", tc.id, got, ok, tc.want)
		}
	}
}
