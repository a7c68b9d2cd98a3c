package vmm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Not knowing is not knowing that something is unwanted. A VMM zone with no
// readable record (the record directories lost, moved aside, or every copy
// corrupt) is left running and reported unknown, with why; Nexus is
// answered 404 NO_SUCH_INSTANCE for it, as upstream's agent answers for a
// VMM it does not have; and only an operator removes it, on purpose
// (RemoveUnknown). Its record is read again at every CheckRecords: a record
// that becomes readable (restored) is adopted.

// ErrKnown: the VMM has a readable record, so it is not unknown (it is
// unregistered with DELETE /vmms/{id}, not removed as unknown).
var ErrKnown = errors.New("VMM has a readable record")

// Info.Status values.
const (
	// StatusKnown: a readable record of the VMM is held; the agent manages it.
	StatusKnown = "known"
	// StatusUnknown: no record of the VMM is readable; the agent leaves it
	// alone.
	StatusUnknown = "unknown"
)

// unknownVMM is a VMM of which no record is readable. Guarded by
// Manager.mu.
type unknownVMM struct {
	id    string
	why   string // why no record is readable
	zone  bool   // its zone was seen at the last listing
	since time.Time
	// legacy: its only record is an earlier agent's file that cannot be
	// read; the record directories are not asked about it again.
	legacy   bool
	removing bool // RemoveUnknown is tearing it down
}

// owner is the claims owner of an unknown VMM: its zone holds its id.
func (u *unknownVMM) owner() string { return "unknown VMM " + u.id }

func (m *Manager) unknownInfo(u *unknownVMM) Info {
	name := zone.VMMNamePrefix + u.id
	var detail string
	switch {
	case u.zone:
		detail = fmt.Sprintf("zone %s runs but no readable record of it: %s", name, u.why)
	case m.listed:
		detail = fmt.Sprintf("no readable record of it (its zone %s does not run): %s", name, u.why)
	default:
		detail = "no readable record of it: " + u.why
	}
	return Info{ID: u.id, Zone: name, Status: StatusUnknown, Detail: detail,
		History: []LogEntry{{At: u.since, Event: "unknown", Detail: detail}}}
}

// markUnknownLocked makes VMM id unknown, saying why; registerMu held.
// zoneSeen: its zone runs.
func (m *Manager) markUnknownLocked(id, why string, zoneSeen bool) {
	m.mu.Lock()
	u, ok := m.unknown[id]
	if !ok {
		u = &unknownVMM{id: id, since: time.Now()}
		m.unknown[id] = u
	}
	if u.why != why {
		m.opts.Log.Warn("a VMM has no readable record: it is left as it is", "vmm", id, "why", why, "zone_runs", zoneSeen)
	}
	u.why = why
	u.zone = u.zone || zoneSeen
	m.mu.Unlock()
	if c := m.opts.Claims; c != nil && !ok {
		// Its zone holds the id's links: no zone of a sled config may
		// take it. Its address is not known.
		for _, ce := range c.ClaimFree(u.owner(), []claims.Claim{{Key: claims.ID(id), Holder: u.owner(), As: "id"}}) {
			m.opts.Log.Error("an unknown VMM collides", "vmm", id, "err", ce)
		}
	}
}

// dropUnknownLocked forgets VMM id as unknown; registerMu held.
func (m *Manager) dropUnknownLocked(id string) {
	m.mu.Lock()
	u, ok := m.unknown[id]
	delete(m.unknown, id)
	m.mu.Unlock()
	if ok {
		if c := m.opts.Claims; c != nil {
			c.Release(u.owner())
		}
	}
}

// goneLocked notes that VMM id's zone and record are gone, so that a zone
// listing made before does not make it unknown; mu held.
func (m *Manager) goneLocked(id string) {
	m.goneSeq++
	m.gone[id] = m.goneSeq
}

// refreshUnknown lists the VMM zones and settles every one of no VMM the
// manager knows, and every unknown VMM: a readable record is adopted (or
// its unregister finished); without one it is, or stays, unknown.
func (m *Manager) refreshUnknown(ctx context.Context) {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	m.mu.Lock()
	start := m.goneSeq
	m.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	names, err := m.vmmZoneNames(lctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.opts.Log.Error("listing VMM zones for those of no known VMM", "err", err)
		}
		return
	}
	running := map[string]bool{}
	for _, name := range names {
		if id, ok := strings.CutPrefix(name, zone.VMMNamePrefix); ok {
			running[id] = true
		}
	}
	m.registerMu.Lock()
	defer m.registerMu.Unlock()
	m.mu.Lock()
	var check []string
	for id := range running {
		if m.vmms[id] == nil && m.ending[id] == nil && m.gone[id] <= start {
			check = append(check, id)
		}
	}
	for id, u := range m.unknown {
		if u.removing || m.gone[id] > start {
			continue
		}
		u.zone = running[id]
		if !running[id] && !u.legacy {
			check = append(check, id)
		}
	}
	for id, seq := range m.gone {
		if seq <= start { // no listing in progress began before it
			delete(m.gone, id)
		}
	}
	m.listed = true
	m.mu.Unlock()
	for _, id := range check {
		m.mu.Lock()
		u := m.unknown[id]
		m.mu.Unlock()
		if u != nil && u.legacy {
			continue
		}
		m.resumeLocked(id, running[id])
	}
}

// RemoveUnknown tears down the zone of VMM id, of which no record is
// readable, and removes what is left of its record: an operator's
// decision, never the agent's. A VMM with a readable record is
// ErrKnown (its record is read again first: one readable now is adopted);
// one the manager does not hold as unknown is ErrNotFound.
func (m *Manager) RemoveUnknown(ctx context.Context, id string) (Info, error) {
	m.registerMu.Lock()
	m.mu.Lock()
	known := m.vmms[id] != nil || m.ending[id] != nil
	u := m.unknown[id]
	m.mu.Unlock()
	switch {
	case known:
		m.registerMu.Unlock()
		return Info{}, fmt.Errorf("%w: VMM %s is registered (unregister it with DELETE /vmms/%s)", ErrKnown, id, id)
	case u == nil:
		m.registerMu.Unlock()
		return Info{}, fmt.Errorf("%w: no unknown VMM %s", ErrNotFound, id)
	}
	m.mu.Lock()
	removing, legacy := u.removing, u.legacy
	m.mu.Unlock()
	if removing {
		m.registerMu.Unlock()
		return Info{}, fmt.Errorf("%w: unknown VMM %s is being removed", ErrConflict, id)
	}
	if !legacy {
		// What it is may be known by now.
		m.resumeLocked(id, u.zone)
		m.mu.Lock()
		known, u = m.vmms[id] != nil || m.ending[id] != nil, m.unknown[id]
		m.mu.Unlock()
		if known {
			m.registerMu.Unlock()
			return Info{}, fmt.Errorf("%w: VMM %s's record is readable again, and it is adopted", ErrKnown, id)
		}
		if u == nil {
			m.registerMu.Unlock()
			return Info{}, fmt.Errorf("%w: VMM %s has neither a zone nor a record any more", ErrNotFound, id)
		}
	}
	m.mu.Lock()
	u.removing = true
	info := m.unknownInfo(u)
	m.mu.Unlock()
	m.registerMu.Unlock()
	undo := func() {
		m.mu.Lock()
		u.removing = false
		m.mu.Unlock()
	}

	m.opts.Log.Warn("removing an unknown VMM, as the operator asks", "vmm", id, "why", info.Detail)
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	err := m.rt.Destroy(dctx, zone.VMMNamePrefix+id)
	cancel()
	if err != nil {
		undo()
		return info, fmt.Errorf("tearing down the zone of unknown VMM %s: %w", id, err)
	}
	// Its unreadable record goes too, or the VMM would be shown again.
	var rerr error
	if led, err := m.openRecord(id); err != nil {
		rerr = err
	} else if led != nil {
		_, rerr = led.Remove()
	}
	if legacy && rerr == nil {
		if err := os.Remove(filepath.Join(m.opts.LegacyDir, recordName(id))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			rerr = err
		}
	}
	if rerr != nil {
		m.mu.Lock()
		u.zone = false
		m.mu.Unlock()
		undo()
		return info, fmt.Errorf("the zone of unknown VMM %s is torn down, but its record is not removed: %w", id, rerr)
	}
	m.mu.Lock()
	if m.unknown[id] == u {
		delete(m.unknown, id)
	}
	m.goneLocked(id)
	m.mu.Unlock()
	if c := m.opts.Claims; c != nil {
		c.Release(u.owner())
	}
	info.Detail = "removed on purpose; " + info.Detail
	return info, nil
}

// CheckRecords reads back every copy of every VMM's record and rewrites
// the bad ones, finishes the unregisters not finished (a zone not torn
// down, a record not removed), and settles the VMM zones of no known VMM
// (refreshUnknown).
func (m *Manager) CheckRecords(ctx context.Context) {
	m.mu.Lock()
	var live, ending []*vmm
	for _, v := range m.vmms {
		live = append(live, v)
	}
	for _, v := range m.ending {
		ending = append(ending, v)
	}
	m.mu.Unlock()
	for _, v := range live {
		v.repair()
	}
	for _, v := range ending {
		m.finish(ctx, v, false)
	}
	m.refreshUnknown(ctx)
}

// Run calls CheckRecords every period until ctx ends.
func (m *Manager) Run(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			m.CheckRecords(ctx)
		}
	}
}
