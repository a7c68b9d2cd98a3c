package linux

import "testing"

func TestZoneShaped(t *testing.T) {
	const id = "4f1a7d4e-6a53-4d0c-9d57-5d6e4f1b2c01"
	for name, want := range map[string]bool{
		"oxz_crucible_" + id:                             true,
		"oxz_ntp_" + id:                                  true,
		"oxz_crucible_pantry_" + id:                      true,
		"oxz_propolis-server_" + id:                      true, // a VMM's
		"oxz__" + id:                                     false,
		"oxz_Nexus_" + id:                                false,
		"oxz_nexus_" + id + ".guest":                     false,
		"oxz_nexus_4F1A7D4E-6a53-4d0c-9d57-5d6e4f1b2c01": false,
		"oxz_ne*us_" + id:                                false,
		"oxz_nexus/_" + id:                               false,
		"oxz_nexus_" + id[:35]:                           false,
		"zone_nexus_" + id:                               false,
	} {
		if got := zoneShaped(name); got != want {
			t.Errorf("zoneShaped(%q) = %v, want %v", name, got, want)
		}
	}
}
