package vmm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// Resume adopts the VMMs an earlier agent left: each VMM with a readable
// record is known again with its registration, its generation continues
// above the last one reported, and a monitor looks at its zone: still
// there, it follows the guest as before (nothing is restarted); gone, the
// VMM fails. A bad or missing copy of a record is rewritten from the
// readable one. A VMM whose record says it was unregistered has its
// teardown finished, in the background. Records an earlier agent kept in
// LegacyDir are rewritten as records first. A VMM with no readable record
// is unknown (unknown.go): its zone is left running. It returns how many
// VMMs it adopted, and an error naming what it could not read.
func (m *Manager) Resume() (int, error) {
	if len(m.opts.RecordDirs) == 0 {
		return 0, nil
	}
	unwritten, unreadable := m.migrate()
	ids, listErr := m.recordIDs()
	m.listErr.Store(&listErr)
	var errs []error
	if listErr != nil {
		errs = append(errs, listErr)
	}
	m.registerMu.Lock()
	n := 0
	for id, why := range unreadable {
		if !ids[id] {
			m.markUnknownLocked(id, fmt.Sprintf("its record from an earlier agent cannot be read: %s", why), false)
			m.mu.Lock()
			m.unknown[id].legacy = true
			m.mu.Unlock()
			errs = append(errs, fmt.Errorf("VMM %s: %s", id, why))
		}
	}
	for id, rec := range unwritten {
		if !ids[id] {
			led, _ := m.openRecord(id)
			m.adopt(id, led, ledger.Record{}, rec)
			n++
		}
	}
	for id := range ids {
		adopted, err := m.resumeLocked(id, false)
		if adopted {
			n++
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	m.registerMu.Unlock()
	// Listing every zone takes a while with many: in the background, so
	// that the agent answers at once.
	m.wg.Go(func() { m.refreshUnknown(m.ctx) })
	return n, errors.Join(errs...)
}

// resumeLocked takes VMM id back from its record, with registerMu held:
// adopted (true), its teardown finished (an unregistered VMM's), or
// unknown when no copy of its record is readable (its error). zoneRuns
// says a zone of the VMM was seen.
func (m *Manager) resumeLocked(id string, zoneRuns bool) (bool, error) {
	led, err := m.openRecord(id)
	if err != nil {
		m.markUnknownLocked(id, err.Error(), zoneRuns)
		return false, err
	}
	lr, copies, err := led.Read()
	switch {
	case errors.Is(err, ledger.ErrNotFound) && !zoneRuns:
		// Neither a record nor (as far as is known) a zone: nothing to
		// report.
		m.dropUnknownLocked(id)
		return false, nil
	case errors.Is(err, ledger.ErrNotFound):
		m.markUnknownLocked(id, m.noRecord(), zoneRuns)
		return false, nil
	case err != nil:
		// No valid copy: the agent does not know what the VMM is, and
		// so acts on none of them.
		m.markUnknownLocked(id, err.Error(), zoneRuns)
		return false, fmt.Errorf("VMM %s: %w", id, err)
	}
	rec, err := decodeRecord(id, lr.Data)
	if err != nil {
		err = fmt.Errorf("its record (generation %d) cannot be used: %w", lr.Generation, err)
		m.markUnknownLocked(id, err.Error(), zoneRuns)
		return false, fmt.Errorf("VMM %s: %w", id, err)
	}
	for _, c := range copies {
		if c.State != ledger.StateOK {
			// The readable copy wins; the others are made to hold it now,
			// not at the VMM's next change.
			m.opts.Log.Warn("a copy of a VMM's record is not current; rewriting it from the readable one", "vmm", id, "path", c.Path, "state", c.State, "err", c.Err)
			if _, _, err := led.Repair(lr); err != nil {
				m.opts.Log.Error("rewriting a VMM's record", "vmm", id, "err", err)
			}
			break
		}
	}
	if rec.Unregistered {
		m.resumeUnregistered(id, led, lr, rec)
		return false, nil
	}
	m.adopt(id, led, lr, rec)
	return true, nil
}

// noRecord says why a VMM has no record: none in any record directory (and
// which directories could not be listed).
func (m *Manager) noRecord() string {
	why := "no record of it in " + strings.Join(m.opts.RecordDirs, " or ")
	if p := m.listErr.Load(); p != nil && *p != nil {
		why += " (" + (*p).Error() + ")"
	}
	return why
}

// registration is the VMM registration a record holds.
func (rec record) registration() (Registration, error) {
	reg := Registration{InstanceID: rec.InstanceID, PropolisAddr: netip.MustParseAddrPort(rec.PropolisAddr), Initial: rec.Initial, Body: rec.Registration}
	g, err := ParseGuest(rec.Registration)
	if err == nil {
		reg.Guest = g
	}
	return reg, err
}

// adopt makes VMM id known again from its record lr (rec decoded), with
// registerMu held.
func (m *Manager) adopt(id string, led *ledger.Ledger, lr ledger.Record, rec record) {
	m.dropUnknownLocked(id)
	reg, gerr := rec.registration()
	v := newVMM(m, id, reg)
	v.led, v.recGen, v.last = led, lr.Generation, lr
	if gerr != nil {
		v.record("no instance spec", "its registration's spec cannot be read: "+gerr.Error())
	}
	if r := m.opts.Reservoir; r != nil && reg.Guest != nil {
		// What runs holds its memory, whether or not it fits what the
		// reservoir is now.
		if err := r.Reserve(id, reg.Guest.MemoryBytes()); err != nil {
			m.opts.Log.Error("an adopted VMM does not fit the reservoir", "vmm", id, "err", err)
			v.record("over the reservoir", err.Error())
		}
	}
	v.mu.Lock()
	v.history = nil
	v.state = rec.State
	v.state.Gen = min(v.state.Gen, MaxGen) // a record from before the bound
	v.detail = rec.Detail
	v.pending = rec.Pending
	switch {
	case rec.StopAsked != nil:
		v.stopAt = *rec.StopAsked
	case rec.State.State == StateStopping:
		// Stopping, with no record of when the stop was asked: its grace
		// starts now.
		v.stopAt = time.Now()
	}
	v.setLocked(rec.State.State, "adopted after an agent restart", "adopted")
	v.mu.Unlock()
	v.claimFree()
	v.disks = rec.Disks
	if v.disks == nil && reg.Guest != nil {
		v.disks = m.findDisks(reg.Guest)
	}
	for _, p := range m.disks.takeFree(v.owner, id, v.disks) {
		m.opts.Log.Error("a VMM found at start shares a disk's file", "vmm", id, "err", p)
		v.record("disk shared", p)
	}
	v.recBoot = rec.Boot
	m.mu.Lock()
	m.vmms[id] = v
	m.mu.Unlock()
	terminal := rec.State.State == StateFailed || rec.State.State == StateDestroyed
	if terminal {
		close(v.done) // nothing to follow
		return
	}
	v.saveOrLog()
	m.wg.Go(func() { v.monitor(v.ctx, true) })
}

// resumeUnregistered finishes the unregister an earlier agent began: VMM
// id's record says it is not wanted, so its zone is torn down and then its
// record removed, in the background.
func (m *Manager) resumeUnregistered(id string, led *ledger.Ledger, lr ledger.Record, rec record) {
	m.dropUnknownLocked(id)
	reg, _ := rec.registration()
	v := newVMM(m, id, reg)
	v.led, v.recGen, v.last, v.forgotten = led, lr.Generation, lr, true
	// Its QEMU may still run on its disks until the zone is torn down:
	// they stay held until then (release).
	v.disks = rec.Disks
	for _, p := range m.disks.takeFree(v.owner, id, v.disks) {
		m.opts.Log.Error("an unregistered VMM found at start shares a disk's file", "vmm", id, "err", p)
	}
	v.cancel()
	close(v.done) // no monitor: it is being torn down
	v.mu.Lock()
	v.history = nil
	v.state, v.detail = rec.State, "unregistered; its zone is being torn down"
	v.recordLocked("unregistered", "an earlier agent was unregistering it; finishing its teardown")
	v.mu.Unlock()
	// Its id and address are the VMM's until its zone is gone.
	v.claimFree()
	m.mu.Lock()
	m.ending[id] = v
	m.mu.Unlock()
	m.opts.Log.Info("finishing the teardown of an unregistered VMM", "vmm", id)
	m.wg.Go(func() { m.finish(m.ctx, v, false) })
}

// finish tears an unregistered VMM's zone down, then gives up what the VMM
// held and removes its record. A zone that could not be torn down is an
// error; a record that could not be removed is logged. Either is tried
// again by CheckRecords until done. wait: if another finish of v runs,
// wait for it (within ctx) and then go on; else leave it to that one.
func (m *Manager) finish(ctx context.Context, v *vmm, wait bool) error {
	select {
	case v.finishSlot <- struct{}{}:
	default:
		if !wait {
			return nil
		}
		select {
		case v.finishSlot <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("VMM %s: waiting for its teardown in progress: %w", v.id, ctx.Err())
		}
	}
	defer func() { <-v.finishSlot }()
	if v.finished {
		return nil
	}
	if !v.tornDown {
		if err := v.teardown(ctx); err != nil {
			// The zone may still be there, with the links and route of
			// the VMM's id and address: they stay claimed.
			v.record("teardown failed", err.Error()+"; tried again every record check")
			m.opts.Log.Error("tearing down an unregistered VMM's zone", "vmm", v.id, "err", err)
			return err
		}
		v.tornDown = true
		v.release()
		m.unreserve(v.id)
	}
	if err := v.removeRecord(); err != nil {
		// Harmless: the record says the VMM is unregistered.
		v.record("record not removed", err.Error())
		m.opts.Log.Error("removing an unregistered VMM's record", "vmm", v.id, "err", err)
		return nil
	}
	v.finished = true
	m.mu.Lock()
	if m.ending[v.id] == v {
		delete(m.ending, v.id)
	}
	m.goneLocked(v.id)
	m.mu.Unlock()
	return nil
}

// vmmZoneNames names the VMM zones that exist.
func (m *Manager) vmmZoneNames(ctx context.Context) ([]string, error) {
	if n, ok := m.rt.(Namer); ok {
		return n.Names(ctx, zone.VMMNamePrefix)
	}
	obs, err := m.rt.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range obs {
		if zone.IsVMM(o.Name) {
			out = append(out, o.Name)
		}
	}
	return out, nil
}

// Namer is a Runtime that can name its zones without inspecting them.
type Namer interface {
	Names(ctx context.Context, prefix string) ([]string, error)
}
