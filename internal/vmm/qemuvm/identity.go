package qemuvm

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sled-agent/sled-agent/internal/qemu"
)

// IDRange is the uids a VM's QEMU may run as, First to First+Count-1;
// each VM's group id is the same number as its user id. Nothing else on
// the host should use them: a QEMU shares them with no other process.
type IDRange struct {
	First, Count uint32
}

// DefaultIDs is 16,777,216 ids from 1879048192 (0x70000000), the first id
// above the range systemd gives containers (524288–1879048191), in the
// span that systemd's documented ranges leave unused.
var DefaultIDs = IDRange{First: 0x70000000, Count: 1 << 24}

// ErrIDRange is an IDRange that cannot be used.
var ErrIDRange = errors.New("qemu id range")

// ParseIDRange reads FIRST:COUNT, as /etc/subuid writes a range, and
// checks it (see [IDRange.Check]).
func ParseIDRange(s string) (IDRange, error) {
	first, count, ok := strings.Cut(s, ":")
	f, err1 := strconv.ParseUint(first, 10, 32)
	c, err2 := strconv.ParseUint(count, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return IDRange{}, fmt.Errorf("%w %q: want FIRST:COUNT, such as %s", ErrIDRange, s, DefaultIDs)
	}
	r := IDRange{First: uint32(f), Count: uint32(c)}
	return r, r.Check()
}

func (r IDRange) String() string { return fmt.Sprintf("%d:%d", r.First, r.Count) }

// Last is the range's last id.
func (r IDRange) Last() uint32 { return r.First + r.Count - 1 }

// Check refuses an empty range, one past the last id (4294967294: -1 is
// no id), and one that holds root (0), the system's users (below 1000) or
// nobody (65534, 65535 the 16-bit -1): QEMU must share its ids with no
// other process.
func (r IDRange) Check() error {
	last := uint64(r.First) + uint64(r.Count) - 1
	holds := func(id uint64) bool { return uint64(r.First) <= id && id <= last }
	switch {
	case r.Count == 0:
		return fmt.Errorf("%w %s: no ids", ErrIDRange, r)
	case last > 4294967294:
		return fmt.Errorf("%w %s: ends at %d, past the last id, 4294967294", ErrIDRange, r, last)
	case r.First < 1000:
		return fmt.Errorf("%w %s: holds root's or the system's users' ids (below 1000)", ErrIDRange, r)
	case holds(65534) || holds(65535):
		return fmt.Errorf("%w %s: holds nobody's id (65534) or 65535", ErrIDRange, r)
	}
	return nil
}

// Pick is the id of the VM called name (its VMM's id): First plus the
// name's SHA-256 modulo Count, the same on every start, unless taken says
// a process holds it already (another VM whose id hashed alike, or
// anything else), when the next one up is tried, and so on; so two VMs'
// QEMUs on one sled share no id and cannot signal or trace each other
// (bar two whose names hash alike starting in the same instant).
func (r IDRange) Pick(name string, taken func(uint32) bool) (uint32, error) {
	if err := r.Check(); err != nil {
		return 0, err
	}
	sum := sha256.Sum256([]byte(strings.ToLower(name)))
	h := binary.BigEndian.Uint64(sum[:8]) % uint64(r.Count)
	tries := min(uint64(r.Count), 1<<16)
	for i := range tries {
		id := r.First + uint32((h+i)%uint64(r.Count))
		if !taken(id) {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%w %s: the %d ids tried from %d on are all held by processes", ErrIDRange, r, tries, r.First+uint32(h))
}

// idsInUse are the user and group ids (real, effective, saved, file
// system) that the processes under proc (/proc) hold. A process that
// ends while it is read is skipped.
func idsInUse(proc string) (map[uint32]bool, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	ids := map[uint32]bool{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		f, err := os.Open(filepath.Join(proc, e.Name(), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), "Uid:")
			if !ok {
				rest, ok = strings.CutPrefix(sc.Text(), "Gid:")
			}
			if !ok {
				continue
			}
			for _, field := range strings.Fields(rest) {
				if n, err := strconv.ParseUint(field, 10, 32); err == nil {
					ids[uint32(n)] = true
				}
			}
		}
		f.Close()
	}
	return ids, nil
}

// Identity is who a VM's QEMU runs as.
type Identity struct {
	UID, GID uint32
	// Groups are its supplementary groups: /dev/kvm's under KVM where
	// /dev/kvm is open to its group alone, else none.
	Groups []uint32
}

func (id Identity) String() string {
	s := fmt.Sprintf("uid %d gid %d", id.UID, id.GID)
	for _, g := range id.Groups {
		s += fmt.Sprintf(" and group %d (/dev/kvm's)", g)
	}
	return s
}

// identity picks who the VM's QEMU runs as: an id of the range for the
// VM's name, and under KVM the group /dev/kvm needs.
func identity(r IDRange, name string, accel qemu.Accel, proc string, kvmGroups func() ([]uint32, error)) (Identity, error) {
	inUse, err := idsInUse(proc)
	if err != nil {
		return Identity{}, fmt.Errorf("reading the ids processes hold: %w", err)
	}
	id, err := r.Pick(name, func(id uint32) bool { return inUse[id] })
	if err != nil {
		return Identity{}, err
	}
	ident := Identity{UID: id, GID: id}
	if accel == qemu.KVM {
		if ident.Groups, err = kvmGroups(); err != nil {
			return Identity{}, err
		}
	}
	return ident, nil
}
