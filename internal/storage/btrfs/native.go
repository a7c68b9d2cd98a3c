package btrfs

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs-progs commands the backend runs for every dataset it makes or
// changes (subvolume create and delete, qgroup limit) and in every pass
// (subvolume list) are made here by the ioctls each command itself makes,
// without a process: a process per step cost more than the step when
// hundreds of datasets are made at once. They keep their names: the backend
// asks for them, and its tests record them, as the commands they are; each
// runs under the command's deadline, and the list prints what the command
// prints.

// The ioctls, from linux/btrfs.h.
const (
	// _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSubvolCreate = 0x5000940e
	// _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocSnapDestroy = 0x5000940f
	// _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	iocQgroupLimit = 0x8030942b
	// BTRFS_QGROUP_LIMIT_MAX_RFER: the limit is on referenced bytes, as
	// `btrfs qgroup limit` sets it without -e.
	qgroupLimitMaxRfer = 1 << 0
)

// volArgs is struct btrfs_ioctl_vol_args.
type volArgs struct {
	fd   int64
	name [4088]byte // BTRFS_PATH_NAME_MAX + 1
}

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type qgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// nativeTool returns the function that does what argv, a command the
// backend runs, does, for the commands done without a process.
func nativeTool(argv []string) (func() ([]byte, error), bool) {
	if len(argv) < 4 || argv[0] != "btrfs" {
		return nil, false
	}
	switch sub := argv[1] + " " + argv[2]; {
	case sub == "subvolume list" && len(argv) == 4:
		return func() ([]byte, error) { return listSubvolumes(argv[3]) }, true
	case sub == "subvolume create" && len(argv) == 4:
		return quiet(func() error { return volIoctl(argv[3], iocSubvolCreate, "creating subvolume") }), true
	case sub == "subvolume delete" && len(argv) == 4:
		return quiet(func() error { return volIoctl(argv[3], iocSnapDestroy, "deleting subvolume") }), true
	case sub == "qgroup limit" && len(argv) == 5:
		size := ^uint64(0) // "none": no limit, as btrfs-progs sets it
		if argv[3] != "none" {
			n, err := strconv.ParseUint(argv[3], 10, 64)
			if err != nil {
				return nil, false
			}
			size = n
		}
		return quiet(func() error { return qgroupLimit(argv[4], size) }), true
	}
	return nil, false
}

// quiet is f as a command that prints nothing.
func quiet(f func() error) func() ([]byte, error) {
	return func() ([]byte, error) { return nil, f() }
}

// runTool is the backend's runner of commands: the few made for every
// dataset and in every pass are done without a process, by the ioctls the
// command makes, as the backend's other syscalls are (call, keyed by the
// pool the path is in: one abandoned at its deadline makes the pool's
// further calls fail at once with ErrHung rather than pile up); the others
// run as commands.
func (b *Backend) runTool(ctx context.Context, argv ...string) ([]byte, error) {
	f, ok := nativeTool(argv)
	if !ok {
		return runCommand(ctx, argv...)
	}
	return b.runNative(ctx, argv, f)
}

// runNative runs f, the syscalls of the command argv, as call does.
func (b *Backend) runNative(ctx context.Context, argv []string, f func() ([]byte, error)) ([]byte, error) {
	out, err := call(ctx, b, b.poolOfPath(argv[len(argv)-1]), f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return out, nil
}

// poolOfPath is the id of the pool whose mountpoint path is in, or path
// itself if it is in none.
func (b *Backend) poolOfPath(path string) string {
	rel, ok := strings.CutPrefix(path, filepath.Join(b.opts.PoolRoot, "ext")+"/")
	if !ok {
		return path
	}
	id, _, _ := strings.Cut(rel, "/")
	return id
}

// volIoctl makes ioctl req, one on a subvolume by name, on path's parent
// directory with path's last element.
func volIoctl(path string, req uintptr, what string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return fmt.Errorf("%s %s: want a clean absolute path", what, path)
	}
	name := filepath.Base(path)
	var args volArgs
	if len(name) >= len(args.name) {
		return fmt.Errorf("%s %s: name too long", what, path)
	}
	copy(args.name[:], name)
	fd, err := openDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&args))); errno != 0 {
		return &os.PathError{Op: what, Path: path, Err: errno}
	}
	return nil
}

// qgroupLimit limits the referenced bytes of the qgroup of the subvolume
// at path (qgroup id 0: the subvolume the ioctl is made on).
func qgroupLimit(path string, size uint64) error {
	fd, err := openDir(path)
	if err != nil {
		return fmt.Errorf("limiting the qgroup of %s: %w", path, err)
	}
	defer unix.Close(fd)
	args := qgroupLimitArgs{flags: qgroupLimitMaxRfer, maxRfer: size}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQgroupLimit, uintptr(unsafe.Pointer(&args))); errno != 0 {
		return &os.PathError{Op: "limiting the qgroup of", Path: path, Err: errno}
	}
	return nil
}

func openDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// The tree search, from linux/btrfs.h and the on-disk format.
const (
	// _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	iocTreeSearch = 0xd0009411
	// _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	iocInoLookup = 0xd0009412

	rootTreeObjectID = 1   // BTRFS_ROOT_TREE_OBJECTID
	fsTreeObjectID   = 5   // BTRFS_FS_TREE_OBJECTID: the top level
	firstFreeID      = 256 // BTRFS_FIRST_FREE_OBJECTID
	rootItemKey      = 132 // BTRFS_ROOT_ITEM_KEY
	rootBackrefKey   = 144 // BTRFS_ROOT_BACKREF_KEY
	// rootItemGenOffset is where a root item's generation is: after its
	// struct btrfs_inode_item.
	rootItemGenOffset = 160
)

// searchKey is struct btrfs_ioctl_search_key.
type searchKey struct {
	treeID, minObjectID, maxObjectID, minOffset, maxOffset, minTransID, maxTransID uint64
	minType, maxType, nrItems, _                                                   uint32
	_                                                                              [4]uint64
}

// searchArgs is struct btrfs_ioctl_search_args: the key, then the items
// found, each a searchHeader and its item.
type searchArgs struct {
	key searchKey
	buf [4096 - unsafe.Sizeof(searchKey{})]byte
}

// searchHeader is struct btrfs_ioctl_search_header, read from the answer
// field by field (its items are not aligned).
type searchHeader struct {
	transID, objectID, offset uint64
	typ, len                  uint32
}

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type inoLookupArgs struct {
	treeID, objectID uint64
	name             [4080]byte
}

// listSubvolumes prints, as `btrfs subvolume list <mnt>` does, one line
// "ID <id> gen <generation> top level <parent id> path <path>" for every
// subvolume of the filesystem mounted (at its top level) at mnt, in order
// of id: the root tree's root items and back references, and each
// subvolume's directory in its parent looked up by inode.
func listSubvolumes(mnt string) ([]byte, error) {
	fd, err := openDir(mnt)
	if err != nil {
		return nil, fmt.Errorf("listing the subvolumes of %s: %w", mnt, err)
	}
	defer unix.Close(fd)
	type ref struct {
		parent, dirID uint64
		name          string
	}
	gens := map[uint64]uint64{}
	refs := map[uint64]ref{}
	var ids []uint64
	args := searchArgs{key: searchKey{
		treeID: rootTreeObjectID, minObjectID: firstFreeID, maxObjectID: ^uint64(0) - 255, // BTRFS_LAST_FREE_OBJECTID
		maxOffset: ^uint64(0), maxTransID: ^uint64(0), minType: rootItemKey, maxType: rootBackrefKey,
	}}
	for {
		args.key.nrItems = 4096
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocTreeSearch, uintptr(unsafe.Pointer(&args))); errno != 0 {
			return nil, fmt.Errorf("listing the subvolumes of %s: tree search: %w", mnt, errno)
		}
		n := args.key.nrItems
		if n == 0 {
			break
		}
		var last searchHeader
		off := uintptr(0)
		for range n {
			if off+unsafe.Sizeof(searchHeader{}) > uintptr(len(args.buf)) {
				return nil, fmt.Errorf("listing the subvolumes of %s: tree search answer cut short", mnt)
			}
			hb := args.buf[off:]
			h := searchHeader{
				transID: le64(hb), objectID: le64(hb[8:]), offset: le64(hb[16:]),
				typ: binary.LittleEndian.Uint32(hb[24:]), len: binary.LittleEndian.Uint32(hb[28:]),
			}
			off += unsafe.Sizeof(searchHeader{})
			if off+uintptr(h.len) > uintptr(len(args.buf)) {
				return nil, fmt.Errorf("listing the subvolumes of %s: tree search answer cut short", mnt)
			}
			item := args.buf[off : off+uintptr(h.len)]
			off += uintptr(h.len)
			last = h
			switch h.typ {
			case rootItemKey:
				if len(item) >= rootItemGenOffset+8 {
					gens[h.objectID] = le64(item[rootItemGenOffset:])
				}
			case rootBackrefKey:
				// struct btrfs_root_ref: dirid, sequence, name_len, name.
				if len(item) < 18 {
					continue
				}
				nameLen := int(item[16]) | int(item[17])<<8
				if 18+nameLen > len(item) {
					continue
				}
				if _, dup := refs[h.objectID]; !dup {
					ids = append(ids, h.objectID)
				}
				refs[h.objectID] = ref{parent: h.offset, dirID: le64(item), name: string(item[18 : 18+nameLen])}
			}
		}
		// Go on after the last item found.
		k := &args.key
		k.minObjectID, k.minType, k.minOffset = last.objectID, last.typ, last.offset
		switch {
		case k.minOffset < ^uint64(0):
			k.minOffset++
		case k.minType < 255:
			k.minType, k.minOffset = k.minType+1, 0
		default:
			k.minObjectID, k.minType, k.minOffset = k.minObjectID+1, 0, 0
		}
		if k.minObjectID > k.maxObjectID {
			break
		}
	}

	paths := map[uint64]string{fsTreeObjectID: ""}
	var pathOf func(id uint64, depth int) (string, bool)
	pathOf = func(id uint64, depth int) (string, bool) {
		if p, ok := paths[id]; ok {
			return p, true
		}
		r, ok := refs[id]
		if !ok || depth > 4096 {
			return "", false // not reachable from the top level (being deleted)
		}
		parent, ok := pathOf(r.parent, depth+1)
		if !ok {
			return "", false
		}
		dir := ""
		if r.dirID != firstFreeID {
			a := inoLookupArgs{treeID: r.parent, objectID: r.dirID}
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocInoLookup, uintptr(unsafe.Pointer(&a))); errno != 0 {
				return "", false // its directory removed meanwhile
			}
			dir = unix.ByteSliceToString(a.name[:]) // "a/b/"
		}
		p := dir + r.name
		if parent != "" {
			p = parent + "/" + p
		}
		paths[id] = p
		return p, true
	}
	var out strings.Builder
	for _, id := range ids {
		p, ok := pathOf(id, 0)
		if !ok {
			continue
		}
		fmt.Fprintf(&out, "ID %d gen %d top level %d path %s\n", id, gens[id], refs[id].parent, p)
	}
	return []byte(out.String()), nil
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
