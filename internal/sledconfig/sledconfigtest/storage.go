package sledconfigtest

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// The storage a config built here carries: for every pool a zone names, a
// disk that carries it; for every zone, its transient root dataset and its
// durable dataset, if its type has one, and on every pool the "zone"
// dataset those roots live under. Every disk is a synthetic one, as
// upstream names them (vendor synthetic-vendor, model synthetic-model-U2,
// serial synthetic-serial-<name>), so that the Linux backend finds it as
// the file u2_<name>.vdev in its vdev directory (VdevName).

// namespace makes the disks' and datasets' ids: stable for a pool or a
// dataset name, so that a config built twice is the same config.
var namespace = uuid.MustParse("6ba7b812-9dad-11d1-80b4-00c04fd430c8")

// DiskFor returns the synthetic disk that carries pool ("oxp_<uuid>").
func DiskFor(pool string) sledconfig.DiskConfig {
	id, _ := storage.PoolIDFromName(pool)
	return sledconfig.DiskConfig{
		ID: uuid.NewSHA1(namespace, []byte("disk "+pool)).String(),
		Identity: sledconfig.DiskIdentity{
			Vendor: "synthetic-vendor",
			Model:  "synthetic-model-U2",
			Serial: "synthetic-serial-" + VdevName(pool),
		},
		PoolID: id,
	}
}

// VdevName is the name of the synthetic disk that carries pool: the file
// u2_<name>.vdev in a vdev directory.
func VdevName(pool string) string {
	id, _ := storage.PoolIDFromName(pool)
	return id
}

// DatasetFor returns the dataset named name, without quota, reservation or
// compression.
func DatasetFor(name sledconfig.DatasetName) sledconfig.DatasetConfig {
	return sledconfig.DatasetConfig{
		ID:          uuid.NewSHA1(namespace, []byte("dataset "+name.String())).String(),
		Name:        name,
		Compression: sledconfig.CompressionAlgorithm{Type: "off"},
	}
}

// Pools returns the pools the zones name (filesystem pools and durable
// datasets' pools), sorted.
func Pools(zones ...sledconfig.Zone) []string {
	set := map[string]bool{}
	for _, z := range zones {
		if z.FilesystemPool != nil {
			set[*z.FilesystemPool] = true
		}
		if d, ok := z.DurableDataset(); ok {
			set[d.PoolName] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		if strings.HasPrefix(p, "oxp_") {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// addStorage fills c's disks and datasets for its zones.
func addStorage(c *sledconfig.Config, zones []sledconfig.Zone) {
	for _, pool := range Pools(zones...) {
		d := DiskFor(pool)
		c.Disks[d.ID] = mustJSON(d)
		ds := DatasetFor(sledconfig.DatasetName{PoolName: pool, Kind: "zone"})
		c.Datasets[ds.ID] = mustJSON(ds)
	}
	for _, z := range zones {
		for _, fn := range []func() (sledconfig.DatasetName, bool){z.RootDataset, z.DurableDataset} {
			if name, ok := fn(); ok {
				ds := DatasetFor(name)
				c.Datasets[ds.ID] = mustJSON(ds)
			}
		}
	}
}

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
