package netio

import "github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"

// DisableOffloads is zonenet.DisableOffloads: the link's frames whole, as
// the data path reads them.
func DisableOffloads(nsPath, link string) error { return zonenet.DisableOffloads(nsPath, link) }
