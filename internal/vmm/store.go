package vmm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// A VMM outlives the agent: its registration and last reported state are
// its record, kept like the sled config (internal/ledger) with a copy in
// each of Options.RecordDirs: checksummed, replaced atomically at every
// change, the valid copy with the highest generation read, a bad or
// missing copy rewritten from the good one (at start and every
// CheckRecords). A restarted agent adopts the VMM of every readable record
// (Resume) instead of forgetting or destroying it, and its generation only
// ever goes up.
//
// Losing a record destroys nothing: a VMM zone is torn down only when a
// readable record says it is not wanted (an unregister writes that record
// before it tears the zone down, and removes the record once the zone is
// gone). A zone with no readable record is left running and reported
// unknown (unknown.go) until an operator removes it on purpose.

// record is a VMM's record.
type record struct {
	ID           string       `json:"propolis_id"`
	InstanceID   string       `json:"instance_id"`
	PropolisAddr string       `json:"propolis_addr"`
	Initial      RuntimeState `json:"initial"`
	State        RuntimeState `json:"vmm_state"`
	Detail       string       `json:"detail,omitempty"`
	// Pending is a state asked for before the VMM's service had its
	// instance: a restarted agent hands it over as the dead one would have.
	Pending Request `json:"pending,omitempty"`
	// StopAsked is when a stop was asked: a restarted agent forces a stop
	// that outlives StopGrace as the dead one would have.
	StopAsked *time.Time `json:"stop_asked,omitempty"`
	// Disks are the files it has as disks, as judged at registration: a
	// restarted agent holds them again without opening them (a pool may
	// not be mounted yet when it starts).
	Disks []DiskUse `json:"disks,omitempty"`
	// Boot is the host boot in which the record was written (Options.Boot):
	// a VMM's zone does not outlive the host's boot.
	Boot         string          `json:"boot,omitempty"`
	Registration json.RawMessage `json:"registration"`
	// Unregistered says the VMM was unregistered and its zone is to be
	// torn down: the only record that makes an agent tear a VMM zone
	// down. It is removed once the zone is gone.
	Unregistered bool `json:"unregistered,omitempty"`
}

// recordName is the file of VMM id's record in each record directory.
func recordName(id string) string { return id + ".json" }

// openRecord opens the ledger of VMM id's record; nil when no record is
// kept.
func (m *Manager) openRecord(id string) (*ledger.Ledger, error) {
	if len(m.opts.RecordDirs) == 0 {
		return nil, nil
	}
	return ledger.Open(m.opts.RecordDirs, recordName(id), m.opts.Log)
}

// snapshot is the VMM's record as of now.
func (v *vmm) snapshot() record {
	v.mu.Lock()
	defer v.mu.Unlock()
	rec := record{ID: v.id, InstanceID: v.reg.InstanceID, PropolisAddr: v.reg.PropolisAddr.String(), Initial: v.reg.Initial,
		State: v.state, Detail: v.detail, Pending: v.pending, Disks: v.disks, Boot: v.m.opts.Boot, Registration: v.reg.Body}
	if !v.stopAt.IsZero() {
		at := v.stopAt
		rec.StopAsked = &at
	}
	return rec
}

// save writes the VMM's record. v.mu is not held while writing; saveMu
// keeps writes in order, and once the VMM is unregistered no save writes
// its record again (a state request or the monitor racing the unregister
// would otherwise bring the VMM back at the next start).
func (v *vmm) save() error {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.led == nil || v.forgotten {
		return nil
	}
	return v.writeLocked(v.snapshot())
}

// writeLocked commits rec as the record's next generation; saveMu held.
// An error means no copy was written: a restart reads what it read before.
func (v *vmm) writeLocked(rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	lr := ledger.Record{Generation: v.recGen + 1, Data: data, Checked: true}
	if _, err := v.led.Commit(lr); err != nil {
		return fmt.Errorf("keeping VMM %s: %w", v.id, err)
	}
	v.recGen, v.last = lr.Generation, lr
	return nil
}

// markUnregistered writes the record that says the VMM is unregistered and
// its zone is to be torn down; from then on no save writes the record. On
// an error nothing was written, and the VMM is still registered.
func (v *vmm) markUnregistered() error {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.led != nil {
		rec := v.snapshot()
		rec.Unregistered = true
		if err := v.writeLocked(rec); err != nil {
			return err
		}
	}
	v.forgotten = true
	return nil
}

// removeRecord removes every copy of the VMM's record, once its zone is
// gone.
func (v *vmm) removeRecord() error {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.led == nil {
		return nil
	}
	_, err := v.led.Remove()
	return err
}

// repair rewrites the copies of the VMM's record that do not hold the last
// one written (missing, corrupt, stale), as the sled config's are.
func (v *vmm) repair() {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.led == nil || v.recGen == 0 {
		return
	}
	found, now, err := v.led.Repair(v.last)
	var bad []string
	for i, c := range now {
		if f := found[i]; f.State != ledger.StateOK && c.State == ledger.StateOK {
			v.m.opts.Log.Warn("a copy of a VMM's record was not current; rewrote it", "vmm", v.id, "path", c.Path, "was", f.State, "err", f.Err)
		}
		if c.State != ledger.StateOK {
			bad = append(bad, string(c.State)+": "+c.Err)
		}
	}
	// Logged when it changes, not every round.
	if what := strings.Join(bad, "; "); what != v.repairReported {
		v.repairReported = what
		if what != "" {
			v.m.opts.Log.Error("a copy of a VMM's record is degraded and could not be rewritten", "vmm", v.id, "copies", what, "err", err)
		}
	}
}

// decodeRecord reads a record's document; one this agent cannot act on is
// an error saying why.
func decodeRecord(id string, data []byte) (record, error) {
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, err
	}
	if rec.ID != id {
		return rec, fmt.Errorf("it is the record of VMM %q", rec.ID)
	}
	if _, err := netip.ParseAddrPort(rec.PropolisAddr); err != nil {
		return rec, fmt.Errorf("propolis_addr: %w", err)
	}
	return rec, nil
}

// recordID is the VMM id a record file is named after, if name is one.
func recordID(name string) (string, bool) {
	id, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return "", false
	}
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return "", false
	}
	return id, true
}

// recordIDs names the VMMs that have a record file in any record
// directory. A directory that cannot be listed is an error naming it (a
// missing one is not: a record dir is made at the first write).
func (m *Manager) recordIDs() (map[string]bool, error) {
	ids := map[string]bool{}
	var errs []error
	for _, dir := range m.opts.RecordDirs {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, e := range ents {
			if id, ok := recordID(e.Name()); ok {
				ids[id] = true
			}
		}
	}
	return ids, errors.Join(errs...)
}

// migrate rewrites the records an earlier agent kept in LegacyDir (one
// plain JSON file per VMM) as records in RecordDirs, and removes each old
// file once its record is written: upgrading loses no VMM. A VMM that has
// a record already is left to it (a migration cut short after the write);
// an old file that cannot be read is left where it is, and its VMM is
// unknown (see unknown.go). It returns the records it could read but not
// write, to be adopted all the same (their old files stay, and are
// migrated at the next start).
func (m *Manager) migrate() (unwritten map[string]record, unreadable map[string]string) {
	dir := m.opts.LegacyDir
	if dir == "" || len(m.opts.RecordDirs) == 0 {
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.opts.Log.Error("listing the VMM records of an earlier agent", "dir", dir, "err", err)
		}
		return nil, nil
	}
	unwritten, unreadable = map[string]record{}, map[string]string{}
	for _, e := range ents {
		id, ok := recordID(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(dir, e.Name())
		led, err := m.openRecord(id)
		if err != nil {
			unreadable[id] = err.Error()
			continue
		}
		if _, _, err := led.Read(); !errors.Is(err, ledger.ErrNotFound) {
			// Migrated already (err nil: the old file is the older), or
			// a record exists that cannot be read: it, not the older
			// file, says what the VMM is.
			if err == nil {
				m.removeOld(path)
			}
			continue
		}
		rec, err := readOldRecord(id, path)
		if err != nil {
			unreadable[id] = err.Error()
			continue
		}
		data, err := json.Marshal(rec)
		if err == nil {
			_, err = led.Commit(ledger.Record{Generation: 1, Data: data, Checked: true})
		}
		if err != nil {
			m.opts.Log.Error("rewriting an earlier agent's VMM record", "vmm", id, "err", err)
			unwritten[id] = rec
			continue
		}
		m.opts.Log.Info("rewrote an earlier agent's VMM record", "vmm", id, "from", path)
		m.removeOld(path)
	}
	return unwritten, unreadable
}

// removeOld removes an old record file whose record is written, durably.
func (m *Manager) removeOld(path string) {
	err := os.Remove(path)
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.opts.Log.Error("removing an earlier agent's VMM record after rewriting it", "path", path, "err", err)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readOldRecord reads a record an earlier agent kept as plain JSON.
func readOldRecord(id, path string) (record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return record{}, err
	}
	rec, err := decodeRecord(id, data)
	if err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	return rec, nil
}

// findDisks are the files g has as disks, for a VMM whose record predates
// their being kept: each file backend opened and judged as at
// registration, those that open.
func (m *Manager) findDisks(g *Guest) []DiskUse {
	sled := m.guestSled(g)
	files := spec.Files{}
	defer files.Close()
	for key, c := range g.Spec.Components {
		if c.File == nil {
			continue
		}
		f, err := spec.OpenBackend(c.File, sled)
		if err != nil {
			m.opts.Log.Warn("a disk's file of an adopted VMM", "component", key, "err", err)
			continue
		}
		files[key] = f
	}
	return usesOf(g.Spec, files)
}
