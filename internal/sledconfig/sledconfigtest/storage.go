package sledconfigtest

import (
	"crypto/sha1"
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
func DiskFor(pool string) sledconfig.DiskConfig { return diskFor(pool, "") }

// diskFor returns the synthetic disk that carries pool, its name prefixed.
func diskFor(pool, prefix string) sledconfig.DiskConfig {
	id, _ := storage.PoolIDFromName(pool)
	return sledconfig.DiskConfig{
		ID: uuid.NewSHA1(namespace, []byte("disk "+pool)).String(),
		Identity: sledconfig.DiskIdentity{
			Vendor: "synthetic-vendor",
			Model:  "synthetic-model-U2",
			Serial: "synthetic-serial-" + prefix + VdevName(pool),
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

// ConfigOnVdevs returns a config as Config does, with its disks' names
// (and so their vdev files, u2_<name>.vdev) prefixed: a test on Linux
// prefixes them with its own tag, so that its agent, which looks only at
// vdevs whose name begins with its tag, finds them. VdevNames lists them.
func ConfigOnVdevs(gen uint64, prefix string, zones ...sledconfig.Zone) *sledconfig.Config {
	return build(gen, prefix, true, zones)
}

// VdevNames returns the names of the synthetic disks a config built by
// ConfigOnVdevs(gen, prefix, zones...) names.
func VdevNames(prefix string, zones ...sledconfig.Zone) []string {
	var out []string
	for _, pool := range Pools(zones...) {
		out = append(out, prefix+VdevName(pool))
	}
	return out
}

// addStorage fills c's disks and datasets for its zones.
func addStorage(c *sledconfig.Config, prefix string, zones []sledconfig.Zone) {
	for _, pool := range Pools(zones...) {
		d := diskFor(pool, prefix)
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

// OwnPools returns the zones with every pool they name replaced by one of
// its own for salt (a test's tag): tests on Linux that run at the same time
// never make two filesystems of the same id, which btrfs cannot tell apart.
// The same salt and pool always give the same pool.
func OwnPools(salt string, zones ...sledconfig.Zone) []sledconfig.Zone {
	own := func(pool string) string {
		if !strings.HasPrefix(pool, "oxp_") {
			return pool
		}
		// Version 4, as pool ids must be.
		return "oxp_" + uuid.NewHash(sha1.New(), namespace, []byte("pool "+salt+" "+pool), 4).String()
	}
	out := make([]sledconfig.Zone, len(zones))
	for i, z := range zones {
		if z.FilesystemPool != nil {
			p := own(*z.FilesystemPool)
			z.FilesystemPool = &p
		}
		if d := z.ZoneType.Dataset; d != nil {
			z.ZoneType.Dataset = &sledconfig.Dataset{PoolName: own(d.PoolName)}
		}
		out[i] = z
	}
	return out
}
