package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/storage"
)

// The simulated OS outlives the agent, as a real one does: with
// Options.StateFile set, every change to the zones (and to leftovers, disks,
// pools and datasets) is
// written to that file before the call that made it returns, and Open reads
// it back. A zone whose start was in progress when the agent died is kept
// half-made (not running), as a real zone could be.

// stateFile is the file's shape.
type stateFile struct {
	Incarnation uint64       `json:"incarnation"`
	Zones       []zoneRecord `json:"zones"`
	Leftovers   []Leftover   `json:"leftovers,omitempty"`
	Disks       []diskRecord `json:"disks,omitempty"`
	Pools       []poolRecord `json:"pools,omitempty"`
	SavedAt     time.Time    `json:"saved_at"`
	Version     uint64       `json:"version"`
}

type zoneRecord struct {
	Name        string    `json:"name"`
	ID          string    `json:"id"`
	Hash        string    `json:"config_hash"`
	Running     bool      `json:"running"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	Incarnation uint64    `json:"incarnation"`
}

type diskRecord struct {
	Identity storage.DiskIdentity `json:"identity"`
	Slot     int64                `json:"slot"`
}

// poolRecord is a pool with its datasets. Open survives the agent, as a
// mounted filesystem does.
type poolRecord struct {
	ID       string               `json:"id"`
	Disk     storage.DiskIdentity `json:"disk"`
	Open     bool                 `json:"open"`
	Datasets []datasetRecord      `json:"datasets"`
}

type datasetRecord struct {
	Name        string              `json:"name"`
	ID          string              `json:"id"`
	Quota       *uint64             `json:"quota,omitempty"`
	Reservation *uint64             `json:"reservation,omitempty"`
	Compression storage.Compression `json:"compression"`
}

// Leftover is a part of a zone that outlived it in the simulated OS (a link,
// a process, a zone root), for the restore protocol to find and remove.
type Leftover struct {
	Kind string `json:"kind"` // "link", "process", "root", …
	Zone string `json:"zone"` // the name of the zone it belonged to
}

func (l Leftover) String() string { return l.Kind + " of zone " + l.Zone }

// Open returns a simulated runtime that keeps its state in opts.StateFile,
// reading what an earlier one left there. A file that cannot be read or
// parsed is an error: the simulated OS is not silently reset.
func Open(opts Options) (*Runtime, error) {
	r := New(opts)
	if opts.StateFile == "" {
		return r, nil
	}
	data, err := os.ReadFile(opts.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sim state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("sim state %s: %w", opts.StateFile, err)
	}
	r.incarnation = st.Incarnation
	r.version = st.Version
	r.saved = st.Version
	for _, z := range st.Zones {
		if z.Name == "" || z.ID == "" {
			return nil, fmt.Errorf("sim state %s: a zone without name or id", opts.StateFile)
		}
		r.zones[z.Name] = &simZone{name: z.Name, id: z.ID, hash: z.Hash, running: z.Running, startedAt: z.StartedAt, incarnation: z.Incarnation, gone: make(chan struct{})}
	}
	r.leftovers = st.Leftovers
	for _, d := range st.Disks {
		r.disks[d.Identity] = &simDisk{id: d.Identity, slot: d.Slot}
	}
	for _, p := range st.Pools {
		if p.ID == "" {
			return nil, fmt.Errorf("sim state %s: a pool without id", opts.StateFile)
		}
		sp := &simPool{id: p.ID, disk: p.Disk, open: p.Open, datasets: map[string]*simDataset{}}
		for _, d := range p.Datasets {
			sp.datasets[d.Name] = &simDataset{name: d.Name, id: d.ID, quota: d.Quota, reservation: d.Reservation, compression: d.Compression}
		}
		r.pools[p.ID] = sp
	}
	return r, nil
}

// changedLocked notes a change of the simulated OS, to be saved.
func (r *Runtime) changedLocked() { r.version++ }

// persist writes the state, if it changed since the last write, to the state
// file. r.mu is not held while writing; saveMu orders writers, so an older
// snapshot never overwrites a newer one.
func (r *Runtime) persist() error {
	if r.opts.StateFile == "" {
		return nil
	}
	// One write covers every change made before its snapshot: callers that
	// waited for the write in progress find theirs saved and return (with
	// a thousand disks' workers persisting at once, one snapshot each was
	// most of the sim's time).
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	r.mu.Lock()
	if r.version <= r.saved {
		r.mu.Unlock()
		return nil
	}
	st := r.snapshotLocked()
	r.mu.Unlock()
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	// Not fsynced: a crash of the machine takes the simulated zones with it,
	// as it would take real ones.
	if err := atomicfile.WriteFile(r.opts.StateFile, data, atomicfile.Options{Perm: 0o600}); err != nil {
		return fmt.Errorf("sim state: %w", err)
	}
	r.saved = st.Version
	return nil
}

func (r *Runtime) snapshotLocked() stateFile {
	st := stateFile{Incarnation: r.incarnation, Version: r.version, SavedAt: time.Now(), Leftovers: slices.Clone(r.leftovers)}
	for _, z := range r.zones {
		st.Zones = append(st.Zones, zoneRecord{Name: z.name, ID: z.id, Hash: z.hash, Running: z.running, StartedAt: z.startedAt, Incarnation: z.incarnation})
	}
	for _, d := range r.disks {
		st.Disks = append(st.Disks, diskRecord{Identity: d.id, Slot: d.slot})
	}
	slices.SortFunc(st.Disks, func(a, b diskRecord) int { return cmp.Compare(a.Slot, b.Slot) })
	for _, p := range r.pools {
		pr := poolRecord{ID: p.id, Disk: p.disk, Open: p.open}
		for _, d := range p.datasets {
			pr.Datasets = append(pr.Datasets, datasetRecord{Name: d.name, ID: d.id, Quota: clonePtr(d.quota), Reservation: clonePtr(d.reservation), Compression: d.compression})
		}
		slices.SortFunc(pr.Datasets, func(a, b datasetRecord) int { return strings.Compare(a.Name, b.Name) })
		st.Pools = append(st.Pools, pr)
	}
	slices.SortFunc(st.Pools, func(a, b poolRecord) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(st.Zones, func(a, b zoneRecord) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return st
}

// AddLeftover puts a part of a zone into the simulated OS (tests, debugging):
// with no such zone, it is a leftover for Sweep.
func (r *Runtime) AddLeftover(l Leftover) error {
	r.mu.Lock()
	r.leftovers = append(r.leftovers, l)
	r.changedLocked()
	r.mu.Unlock()
	return r.persist()
}

// Leftovers returns the parts that belong to no zone.
func (r *Runtime) Leftovers() []Leftover {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Leftover
	for _, l := range r.leftovers {
		if _, ok := r.zones[l.Zone]; !ok {
			out = append(out, l)
		}
	}
	return out
}

// Sweep removes every leftover whose zone does not exist.
func (r *Runtime) Sweep(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.recordLocked("sweep", "")
	var removed []string
	kept := r.leftovers[:0:0]
	for _, l := range r.leftovers {
		if _, ok := r.zones[l.Zone]; ok {
			kept = append(kept, l)
			continue
		}
		removed = append(removed, l.String())
	}
	if len(removed) > 0 {
		r.leftovers = kept
		r.changedLocked()
	}
	r.mu.Unlock()
	return removed, r.persist()
}

// removeLeftoversLocked drops the parts of zone name, which Destroy removes
// with it.
func (r *Runtime) removeLeftoversLocked(name string) {
	n := len(r.leftovers)
	r.leftovers = slices.DeleteFunc(r.leftovers, func(l Leftover) bool { return l.Zone == name })
	if len(r.leftovers) != n {
		r.changedLocked()
	}
}

// Incarnation returns the incarnation of a zone: a number that changes every
// time the zone is created again, the simulated analog of its service's PID.
func (r *Runtime) Incarnation(name string) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	z, ok := r.zones[name]
	if !ok {
		return 0, false
	}
	return z.incarnation, true
}
