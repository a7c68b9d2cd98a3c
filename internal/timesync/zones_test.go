package timesync

import "testing"

func TestNeedsTimeSyncEveryKindButNTPAndInternalDNS(t *testing.T) {
	for kind, want := range map[string]bool{
		"boundary_ntp":      false,
		"internal_ntp":      false,
		"internal_dns":      false,
		"clickhouse":        true,
		"clickhouse_keeper": true,
		"clickhouse_server": true,
		"cockroach_db":      true,
		"crucible":          true,
		"crucible_pantry":   true,
		"external_dns":      true,
		"nexus":             true,
		"oximeter":          true,
		"a_kind_from_later": true, // unknown kinds wait, as upstream's default arm
	} {
		if got := NeedsTimeSync(kind); got != want {
			t.Errorf("NeedsTimeSync(%q) = %v, want %v", kind, got, want)
		}
	}
}
