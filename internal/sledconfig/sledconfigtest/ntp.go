package sledconfigtest

import (
	"fmt"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// InternalNTP returns internal NTP zone number i (the id of Crucible(200+i):
// do not use both in one config), at fd00:1122:3344:101::<i+0x1d0> port
// 123, on pool 200+i.
func InternalNTP(i int) sledconfig.Zone {
	z := Crucible(200 + i)
	z.ZoneType = sledconfig.ZoneType{
		Type:    "internal_ntp",
		Address: fmt.Sprintf("[fd00:1122:3344:101::%x]:123", i+0x1d0),
	}
	return z
}
