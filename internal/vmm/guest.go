package vmm

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/propolisapi"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// Guest is what a registration says of the guest: its instance spec (the
// body's vmm_spec), the MACs of its NICs (local_config.nics, by id), and
// what names it (local_config.hostname, metadata).
type Guest struct {
	Spec *spec.Spec
	NICs map[string]net.HardwareAddr
	// Zvols are local_config.delegated_zvols: the pools' local storage
	// allocations its file backends may name (spec.Zvol).
	Zvols     []spec.Zvol
	Hostname  string
	ProjectID string
	SiloID    string
}

// ParseGuest reads the guest of an InstanceEnsureBody. A vmm_spec it cannot
// read is a *spec.Error naming the components; other errors name the field.
func ParseGuest(body []byte) (*Guest, error) {
	var b struct {
		VmmSpec     json.RawMessage `json:"vmm_spec"`
		LocalConfig struct {
			Hostname string `json:"hostname"`
			NICs     []struct {
				ID  string `json:"id"`
				MAC string `json:"mac"`
			} `json:"nics"`
			DelegatedZvols []struct {
				Type      string `json:"type"`
				ZpoolID   string `json:"zpool_id"`
				DatasetID string `json:"dataset_id"`
			} `json:"delegated_zvols"`
		} `json:"local_config"`
		Metadata struct {
			ProjectID *string `json:"project_id"`
			SiloID    *string `json:"silo_id"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("local_config, metadata: %v", err)
	}
	// Upstream's InstanceMetadata requires both, as UUIDs; the VMM service
	// refuses instance properties without them, so a registration that
	// lacks them would only fail later, after taking reservoir memory.
	meta := map[string]string{}
	for _, m := range []struct {
		name string
		v    *string
	}{{"metadata.project_id", b.Metadata.ProjectID}, {"metadata.silo_id", b.Metadata.SiloID}} {
		if m.v == nil {
			return nil, fmt.Errorf("%s is missing (upstream's InstanceMetadata requires it)", m.name)
		}
		u, err := uuid.Parse(*m.v)
		if err != nil || len(*m.v) != 36 {
			return nil, fmt.Errorf("%s %q is not a UUID", m.name, *m.v)
		}
		meta[m.name] = u.String()
	}
	s, err := spec.Decode(b.VmmSpec)
	if err != nil {
		return nil, err
	}
	g := &Guest{Spec: s, NICs: map[string]net.HardwareAddr{}, Hostname: b.LocalConfig.Hostname, ProjectID: meta["metadata.project_id"], SiloID: meta["metadata.silo_id"]}
	for i, n := range b.LocalConfig.NICs {
		id, err := uuid.Parse(n.ID)
		if err != nil {
			return nil, fmt.Errorf("local_config.nics[%d].id %q is not a UUID", i, n.ID)
		}
		mac, err := net.ParseMAC(n.MAC)
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return nil, fmt.Errorf("local_config.nics[%d].mac %q is not a unicast MAC", i, n.MAC)
		}
		if _, dup := g.NICs[id.String()]; dup {
			return nil, fmt.Errorf("local_config.nics: id %s is given twice", id)
		}
		g.NICs[id.String()] = mac
	}
	for i, z := range b.LocalConfig.DelegatedZvols {
		zv, err := spec.ParseZvol(z.Type, z.ZpoolID, z.DatasetID)
		if err != nil {
			return nil, fmt.Errorf("local_config.delegated_zvols[%d]: %w", i, err)
		}
		g.Zvols = append(g.Zvols, zv)
	}
	return g, nil
}

// MemoryBytes is what the guest holds of the VMM reservoir.
func (g *Guest) MemoryBytes() uint64 { return g.Spec.Board.MemoryMiB << 20 }

// serviceSpec is the spec the VMM service is given: as registered, but
// every virtio NIC's backend named after the NIC's MAC (which is how the
// service learns it, as upstream's propolis learns it from the OPTE port
// the sled agent names there), and every file backend's path the real path
// the agent judged (disks, by component): a delegated zvol's is the file
// that realises it.
func (g *Guest) serviceSpec(disks []DiskUse) (json.RawMessage, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(g.Spec.Raw, &doc); err != nil {
		return nil, err
	}
	var comps map[string]map[string]json.RawMessage
	if err := json.Unmarshal(doc["components"], &comps); err != nil {
		return nil, err
	}
	for key, c := range g.Spec.Components {
		switch {
		case c.Type == spec.TypeVirtioNIC:
			mac := g.NICs[strings.ToLower(c.NIC.InterfaceID)]
			b, err := json.Marshal(map[string]string{"vnic_name": spec.VNICName(mac)})
			if err != nil {
				return nil, err
			}
			comps[c.NIC.BackendID]["component"] = b
		case c.File != nil:
			f := *c.File
			f.Path = filepath.Clean(f.Path)
			for _, u := range disks {
				if u.Component == key {
					f.Path = u.Path
				}
			}
			b, err := json.Marshal(f)
			if err != nil {
				return nil, err
			}
			comps[key]["component"] = b
		}
	}
	cb, err := json.Marshal(comps)
	if err != nil {
		return nil, err
	}
	doc["components"] = cb
	return json.Marshal(doc)
}

// SledIdentity is what a VMM's instance properties say of the sled.
type SledIdentity struct {
	ID, Serial, Model string
	Revision          uint32
}

// properties are the instance properties the VMM service is given, as
// upstream's sled agent makes them.
func (g *Guest) properties(instanceID string, sled SledIdentity) propolisapi.Properties {
	return propolisapi.Properties{
		ID:          instanceID,
		Name:        g.Hostname,
		Description: "Omicron-managed VM",
		Metadata: propolisapi.Metadata{
			ProjectID: g.ProjectID, SiloID: g.SiloID,
			SledID: sled.ID, SledSerial: sled.Serial, SledModel: sled.Model, SledRevision: sled.Revision,
		},
	}
}

// NotRealised lists the components of g's spec its guest does not get on
// this sled, each with why (spec.NotRealised), by key.
func (g *Guest) NotRealised() []string {
	if g == nil || g.Spec == nil {
		return nil
	}
	var out []string
	for _, key := range slices.Sorted(maps.Keys(g.Spec.Components)) {
		c := g.Spec.Components[key]
		if why, ok := spec.NotRealised[c.Type]; ok {
			out = append(out, fmt.Sprintf("component %q (%s): %s", key, c.Type, why))
		}
	}
	return out
}
