// Package examples holds the documents of this folder for the programs that
// use them as they are: `sled-agent dev --runtime linux` puts
// sled-config-vdev.json.
package examples

import _ "embed"

// SledConfigVdev is sled-config-vdev.json: a sled config on the file-backed
// disks u2_a.vdev and u2_b.vdev, for the sled fd00:1122:3344:101::1.
//
//go:embed sled-config-vdev.json
var SledConfigVdev []byte
