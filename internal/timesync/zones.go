package timesync

// NeedsTimeSync reports whether a zone of this kind (its zone_type "type"
// in the sled config) must wait for synchronized time before it starts:
// every kind except the NTP zones themselves and internal DNS, which the
// NTP zones need to find their servers (so a cold boot cannot deadlock).
// Kinds it does not know need time too. This is upstream's
// OmicronZoneType::requires_timesync (sled-agent/types, impls/inventory.rs),
// which keeps the list of exceptions small on purpose.
func NeedsTimeSync(zoneType string) bool {
	switch zoneType {
	case "boundary_ntp", "internal_ntp", "internal_dns":
		return false
	default:
		return true
	}
}
