package vmm

import (
	"context"
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

	"github.com/sled-agent/sled-agent/internal/atomicfile"
	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// A VMM outlives the agent: its registration and last reported state are
// kept in Options.StateDir, one file per VMM, written durably at every
// change, so that a restarted agent adopts the VMM (Resume) instead of
// forgetting or destroying it, and its generation only ever goes up.

// record is a VMM's file.
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
	Disks        []diskUse       `json:"disks,omitempty"`
	Registration json.RawMessage `json:"registration"`
}

func (v *vmm) path() string { return filepath.Join(v.m.opts.StateDir, v.id+".json") }

// save writes the VMM's file. v.mu is not held while writing; saveMu keeps
// writes in order, and once forget has removed the file no save writes it
// again (a state request or the monitor racing the unregister would
// otherwise bring the VMM back at the next start).
func (v *vmm) save() error {
	if v.m.opts.StateDir == "" {
		return nil
	}
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.forgotten {
		return nil
	}
	v.mu.Lock()
	rec := record{ID: v.id, InstanceID: v.reg.InstanceID, PropolisAddr: v.reg.PropolisAddr.String(), Initial: v.reg.Initial,
		State: v.state, Detail: v.detail, Pending: v.pending, Disks: v.disks, Registration: v.reg.Body}
	if !v.stopAt.IsZero() {
		at := v.stopAt
		rec.StopAsked = &at
	}
	v.mu.Unlock()
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(v.path(), data, atomicfile.Options{Perm: 0o600, Durable: true}); err != nil {
		return fmt.Errorf("keeping VMM %s: %w", v.id, err)
	}
	return nil
}

// forget removes the VMM's file, durably, for good: no later save writes
// it. On an error the file may still be there, and the VMM is not
// forgotten.
func (v *vmm) forget() error {
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	if v.m.opts.StateDir == "" {
		v.forgotten = true
		return nil
	}
	if err := os.Remove(v.path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// The removal must outlive a crash as surely as the writes did.
	if err := syncDir(v.m.opts.StateDir); err != nil {
		return err
	}
	v.forgotten = true
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Resume adopts the VMMs an earlier agent left: each is known again with
// its registration, its generation continues above the last one reported,
// and a monitor looks at its zone: still there, it follows the guest as
// before (nothing is restarted); gone, the VMM fails. VMM zones of no known
// VMM (an unregister cut short) are torn down, in the background. It
// returns how many VMMs it adopted. A file it cannot read is an error naming it; the others are
// adopted all the same, and the zone of a VMM whose file is unreadable is
// left alone.
func (m *Manager) Resume() (int, error) {
	if m.opts.StateDir == "" {
		return 0, nil
	}
	ents, err := os.ReadDir(m.opts.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	var errs []error
	n := 0
	known := map[string]bool{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || uuid.Validate(id) != nil {
			continue
		}
		known[id] = true
		rec, err := readRecord(filepath.Join(m.opts.StateDir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.adopt(id, rec)
		n++
	}
	// Listing every zone takes a while with many: in the background, so
	// that the agent answers at once.
	m.wg.Go(func() { m.removeUnknown(known) })
	return n, errors.Join(errs...)
}

// removeUnknown tears down the VMM zones of no VMM in known.
func (m *Manager) removeUnknown(known map[string]bool) {
	ctx := m.ctx
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	names, err := m.vmmZoneNames(lctx)
	cancel()
	if err != nil {
		m.opts.Log.Error("listing zones for VMM leftovers", "err", err)
		return
	}
	for _, name := range names {
		if id, ok := strings.CutPrefix(name, zone.VMMNamePrefix); ok && !known[id] {
			m.opts.Log.Warn("tearing down the zone of a VMM nobody knows", "zone", name)
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := m.rt.Destroy(dctx, name); err != nil {
				m.opts.Log.Error("tearing down the zone of a VMM nobody knows", "zone", name, "err", err)
			}
			cancel()
		}
	}
}

// Namer is a Runtime that can name its zones without inspecting them.
type Namer interface {
	Names(ctx context.Context, prefix string) ([]string, error)
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

func readRecord(path string) (record, error) {
	var rec record
	data, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := netip.ParseAddrPort(rec.PropolisAddr); err != nil {
		return rec, fmt.Errorf("%s: propolis_addr: %w", path, err)
	}
	return rec, nil
}

// findDisks are the files g has as disks, for a VMM whose record predates
// their being kept: each file backend opened and judged as at
// registration, those that open.
func (m *Manager) findDisks(g *Guest) []diskUse {
	var roots []string
	if m.opts.Sled != nil {
		roots = m.opts.Sled().FileRoots
	}
	files := spec.Files{}
	defer files.Close()
	for key, c := range g.Spec.Components {
		if c.File == nil {
			continue
		}
		f, err := diskfile.Open(c.File.Path, roots, !c.File.ReadOnly)
		if err != nil {
			m.opts.Log.Warn("a disk's file of an adopted VMM", "component", key, "err", err)
			continue
		}
		files[key] = f
	}
	return usesOf(g.Spec, files)
}

func (m *Manager) adopt(id string, rec record) {
	reg := Registration{InstanceID: rec.InstanceID, PropolisAddr: netip.MustParseAddrPort(rec.PropolisAddr), Initial: rec.Initial, Body: rec.Registration}
	g, gerr := ParseGuest(rec.Registration)
	if gerr == nil {
		reg.Guest = g
	}
	v := newVMM(m, id, reg)
	if gerr != nil {
		v.record("no instance spec", "its registration's spec cannot be read: "+gerr.Error())
	}
	if r := m.opts.Reservoir; r != nil && g != nil {
		// What runs holds its memory, whether or not it fits what the
		// reservoir is now.
		if err := r.Reserve(id, g.MemoryBytes()); err != nil {
			m.opts.Log.Error("an adopted VMM does not fit the reservoir", "vmm", id, "err", err)
			v.record("over the reservoir", err.Error())
		}
	}
	v.mu.Lock()
	v.history = nil
	v.state = rec.State
	v.state.Gen = min(v.state.Gen, MaxGen) // a file from before the bound
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
	if v.disks == nil && g != nil {
		v.disks = m.findDisks(g)
	}
	for _, p := range m.disks.takeFree(v.owner, id, v.disks) {
		m.opts.Log.Error("a VMM found at start shares a disk's file", "vmm", id, "err", p)
		v.record("disk shared", p)
	}
	m.mu.Lock()
	m.vmms[id] = v
	m.mu.Unlock()
	terminal := rec.State.State == StateFailed || rec.State.State == StateDestroyed
	if terminal {
		close(v.done) // nothing to follow
		return
	}
	v.save()
	m.wg.Go(func() { v.monitor(v.ctx, true) })
}
