package sledconfig

import _ "embed"

//go:embed testdata/example-sled-config-v14.json
var example []byte

// Example returns a real sled config from a rack (generation 351, 13 zones:
// crucible, nexus, external DNS and internal NTP), for the development mode
// and tests. Its underlay addresses are in fd00:1122:3344:103::/64.
func Example() []byte {
	return append([]byte(nil), example...)
}
