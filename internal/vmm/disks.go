package vmm

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/sled-agent/sled-agent/internal/vmm/diskfile"
	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// ErrFileHeld: a disk's file is another VMM's writable disk, or a VMM asks
// to write a file other VMMs read. The API answers it with a 409.
var ErrFileHeld = errors.New("a disk's file is another VMM's")

// DiskUse is a file a VMM has as a disk, known by the device and inode of
// the descriptor opened when it was judged (not by its name, which another
// name, or a file moved into its place, would defeat).
type DiskUse struct {
	Component string      `json:"component" doc:"The file backend's component key in the spec."`
	Path      string      `json:"path" doc:"Where the disk's file really is, as judged at registration."`
	Named     string      `json:"named,omitempty" doc:"The path the spec names, when it is not path: a delegated zvol's device (/dev/zvol/rdsk/oxp_<pool>/local_storage_unencrypted/<dataset>/vol), realised here by the file POST /local-storage made."`
	File      diskfile.ID `json:"file" doc:"The file's device and inode, by which it is held."`
	Write     bool        `json:"write"`
}

// usesOf are the uses of s's files as opened and judged.
func usesOf(s *spec.Spec, files spec.Files) []DiskUse {
	var uses []DiskUse
	for _, key := range slices.Sorted(maps.Keys(files)) {
		f, c := files[key], s.Components[key].File
		u := DiskUse{Component: key, Path: f.Path, File: f.ID, Write: !c.ReadOnly}
		if spec.IsZvolPath(c.Path) {
			u.Named = filepath.Clean(c.Path)
		}
		uses = append(uses, u)
	}
	return uses
}

// WhileFree runs do if no VMM has file as a disk, with registrations held
// back until it returns (so that a file do removes is not the disk of a
// VMM registered meanwhile); a file a VMM holds is ErrFileHeld naming the
// VMM, and do is not run. do should be quick: registrations wait for it.
func (m *Manager) WhileFree(file diskfile.ID, do func() error) error {
	m.registerMu.Lock()
	defer m.registerMu.Unlock()
	if vmm, comp, ok := m.disks.holder(file); ok {
		return fmt.Errorf("%w: it is a disk of VMM %s (its component %q): unregister the VMM first", ErrFileHeld, vmm, comp)
	}
	return do()
}

// holder is a VMM holding file, and its component naming it.
func (h *diskHolds) holder(file diskfile.ID) (vmm, component string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range slices.Sorted(maps.Keys(h.by[file])) {
		b := h.by[file][o]
		return b.vmm, b.use.Component, true
	}
	return "", "", false
}

// diskHolds are the files VMMs have as disks: a file is the writable disk
// of at most one VMM at a time, and read by any number while none writes
// it. Two QEMUs writing one file would each corrupt the other's guest
// (QEMU's own lock on the file comes only once the second VMM's service
// starts QEMU, long after its registration was accepted).
type diskHolds struct {
	mu sync.Mutex
	// by is every file held: its holders (claims owners) and their uses.
	by map[diskfile.ID]map[string]heldBy
}

type heldBy struct {
	vmm string // the VMM's id, for messages
	use DiskUse
}

// take holds every one of uses for owner, VMM id, or none of them: a file
// another VMM writes, or that another reads while this one would write
// it, is ErrFileHeld naming the other VMM.
func (h *diskHolds) take(owner, id string, uses []DiskUse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var probs []string
	for _, u := range uses {
		for _, other := range h.conflictsLocked(owner, u) {
			how := "a read-only disk"
			if other.use.Write {
				how = "the writable disk"
			}
			probs = append(probs, fmt.Sprintf("component %q (file_storage_backend): path %q (%s) is %s of VMM %s (its component %q)",
				u.Component, u.Path, u.File, how, other.vmm, other.use.Component))
		}
	}
	if len(probs) > 0 {
		return heldError(strings.Join(probs, "; "))
	}
	h.addLocked(owner, id, uses)
	return nil
}

// takeFree holds uses for owner, VMM id, found running after a restart:
// what runs has its files whatever another holds, and each conflict (left
// by an agent that did not check) is returned to be reported.
func (h *diskHolds) takeFree(owner, id string, uses []DiskUse) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var probs []string
	for _, u := range uses {
		for _, other := range h.conflictsLocked(owner, u) {
			probs = append(probs, fmt.Sprintf("component %q: path %q (%s) is a disk of VMM %s too, and one of them writes it", u.Component, u.Path, u.File, other.vmm))
		}
	}
	h.addLocked(owner, id, uses)
	return probs
}

func (h *diskHolds) conflictsLocked(owner string, u DiskUse) []heldBy {
	var out []heldBy
	for _, o := range slices.Sorted(maps.Keys(h.by[u.File])) {
		if other := h.by[u.File][o]; o != owner && (u.Write || other.use.Write) {
			out = append(out, other)
		}
	}
	return out
}

func (h *diskHolds) addLocked(owner, id string, uses []DiskUse) {
	if h.by == nil {
		h.by = map[diskfile.ID]map[string]heldBy{}
	}
	for _, u := range uses {
		if h.by[u.File] == nil {
			h.by[u.File] = map[string]heldBy{}
		}
		// Two components of one VMM on one file only read it (spec.Check).
		h.by[u.File][owner] = heldBy{vmm: id, use: u}
	}
}

// release gives up every file owner holds.
func (h *diskHolds) release(owner string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, holders := range h.by {
		delete(holders, owner)
		if len(holders) == 0 {
			delete(h.by, id)
		}
	}
}

// heldError is an ErrFileHeld that reads as its cause alone, which names
// the component, the file and the VMM holding it.
type heldError string

func (e heldError) Error() string { return string(e) }
func (e heldError) Unwrap() error { return ErrFileHeld }
