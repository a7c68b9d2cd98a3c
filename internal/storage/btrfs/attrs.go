package btrfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// What a subvolume records about itself, in xattrs.
const (
	// xattrID is the dataset's id (upstream's oxide:uuid property).
	xattrID = "user.oxide.uuid"
	// xattrParent marks a subvolume made only to hold datasets ("crypt",
	// or "crypt/zone" before the zone dataset itself is ensured). Such a
	// subvolume without an id is not a dataset and is not listed; ensuring
	// a dataset there gives it an id and removes the mark.
	xattrParent = "user.oxide.parent"
	// xattrReservation is the dataset's reservation in bytes (btrfs has
	// none; it is an admission check, see EnsureDataset).
	xattrReservation = "user.oxide.reservation"
	// xattrCompression is upstream's compression as configured ("gzip",
	// "gzip_n:5"), so that it is reported as it was asked for, not as the
	// btrfs algorithm it maps to (gzip and gzip_n 6 are both zlib:6).
	xattrCompression = "user.oxide.compression"
	// xattrBtrfsCompression is btrfs's compression property.
	xattrBtrfsCompression = "btrfs.compression"
)

// tmpPrefix begins the name a subvolume is created under before it is
// renamed into place with its xattrs set: a subvolume at a dataset's path
// always carries its id. Dataset names never begin with a dot.
const tmpPrefix = ".oxide-new-"

// attrs is what a path is, as far as datasets go.
type attrs struct {
	subvol   bool   // the root of a subvolume
	subvolID uint64 // its id (its qgroup is 0/<id>)
	// The xattrs above, "" where unset.
	id, parent, reservation string
	compression, btrfsComp  string
}

// readAttrs reads path's kind and xattrs; an error wrapping
// os.ErrNotExist if there is nothing there.
func readAttrs(path string) (attrs, error) {
	var a attrs
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return a, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	// The root directory of every btrfs subvolume is inode 256
	// (BTRFS_FIRST_FREE_OBJECTID).
	a.subvol = st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Ino == 256
	if !a.subvol {
		return a, nil
	}
	id, err := subvolumeID(path)
	if err != nil {
		return a, err
	}
	a.subvolID = id
	for name, dst := range map[string]*string{
		xattrID: &a.id, xattrParent: &a.parent, xattrReservation: &a.reservation,
		xattrCompression: &a.compression, xattrBtrfsCompression: &a.btrfsComp,
	} {
		v, err := getxattr(path, name)
		if err != nil {
			return a, err
		}
		*dst = v
	}
	return a, nil
}

// readAttrsOn reads path's attrs as a syscall that can hang (see call).
func (b *Backend) readAttrsOn(ctx context.Context, poolID, path string) (attrs, error) {
	return syscallOn(ctx, b, poolID, func() (attrs, error) { return readAttrs(path) })
}

func getxattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		switch {
		case errors.Is(err, unix.ENODATA):
			return "", nil
		case errors.Is(err, unix.ERANGE):
			buf = make([]byte, len(buf)*4)
			continue
		case err != nil:
			return "", fmt.Errorf("getxattr %s %s: %w", path, name, err)
		}
		return string(buf[:n]), nil
	}
}

// setxattrs sets (or, for "", removes) xattrs on path.
func setxattrs(path string, kv map[string]string) error {
	for k, v := range kv {
		var err error
		if v == "" {
			err = unix.Lremovexattr(path, k)
			if errors.Is(err, unix.ENODATA) {
				err = nil
			}
		} else {
			err = unix.Lsetxattr(path, k, []byte(v), 0)
		}
		if err != nil {
			return fmt.Errorf("xattr %s on %s: %w", k, path, err)
		}
	}
	return nil
}

func (b *Backend) setxattrsOn(ctx context.Context, poolID, path string, kv map[string]string) error {
	_, err := syscallOn(ctx, b, poolID, func() (struct{}, error) { return struct{}{}, setxattrs(path, kv) })
	return err
}

// subvolumeID asks btrfs for the id of the subvolume whose root is path
// (BTRFS_IOC_INO_LOOKUP with tree id 0 answers the fd's own tree).
func subvolumeID(path string) (uint64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var args struct {
		treeID   uint64
		objectID uint64
		name     [4080]byte
	}
	args.objectID = 256
	const iocInoLookup = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocInoLookup, uintptr(unsafe.Pointer(&args))); errno != 0 {
		return 0, fmt.Errorf("subvolume id of %s: %w", path, errno)
	}
	return args.treeID, nil
}

// qgroup reads a subvolume's referenced bytes and limit from sysfs
// (/sys/fs/btrfs/<fsid>/qgroups/0_<id>), which never waits on the disk.
// Referenced bytes are as of the last transaction commit.
func qgroup(poolID string, subvolID uint64) (used uint64, limit *uint64) {
	dir := filepath.Join("/sys/fs/btrfs", poolID, "qgroups", fmt.Sprintf("0_%d", subvolID))
	used, _ = strconv.ParseUint(readTrim(filepath.Join(dir, "referenced")), 10, 64)
	if l, err := strconv.ParseUint(readTrim(filepath.Join(dir, "max_referenced")), 10, 64); err == nil && l != 0 && l != ^uint64(0) {
		limit = &l
	}
	return used, limit
}

// btrfsCompression is the btrfs compression property for upstream's
// algorithm (the table is in docs/running-on-linux.md):
//
//	off, ""  → none     (explicitly uncompressed)
//	on       → lzo      (ZFS's "on" is lz4, see below)
//	gzip     → zlib:6   (ZFS's gzip is gzip-6)
//	gzip_n   → zlib:n   (n 1 to 9; zlib's levels are gzip's)
//	lz4      → lzo      (btrfs has no lz4; lzo is its fast LZ77 coder
//	                     without entropy coding, lz4's kind)
//	lzjb     → lzo      (lzjb is of the same kind)
//	zle      → lzo      (btrfs has no zero-run-only coder; lzo is its
//	                     cheapest, and compresses zero runs)
func btrfsCompression(c storage.Compression) (string, error) {
	switch c.Type {
	case "", "off":
		return "none", nil
	case "on", "lz4", "lzjb", "zle":
		return "lzo", nil
	case "gzip":
		return "zlib:6", nil
	case "gzip_n":
		if c.Level < 1 || c.Level > 9 {
			return "", fmt.Errorf("compression gzip_n level %d is not 1 to 9", c.Level)
		}
		return fmt.Sprintf("zlib:%d", c.Level), nil
	}
	return "", fmt.Errorf("compression %q is not one of off, on, gzip, gzip_n, lz4, lzjb, zle", c.Type)
}

// encodeCompression and decodeCompression are xattrCompression's value.
func encodeCompression(c storage.Compression) string {
	if c.Type == "" {
		c.Type = "off"
	}
	if c.Type == "gzip_n" {
		return fmt.Sprintf("gzip_n:%d", c.Level)
	}
	return c.Type
}

func decodeCompression(s string) storage.Compression {
	t, l, ok := strings.Cut(s, ":")
	c := storage.Compression{Type: t}
	if ok {
		c.Level, _ = strconv.Atoi(l)
	}
	return c
}

// observedCompression is a dataset's compression: as configured if that
// is still what btrfs has, else read from the btrfs property.
func observedCompression(a attrs) storage.Compression {
	actual := a.btrfsComp
	if actual == "" {
		actual = "none" // no property: the mount's default, which is none
	}
	if a.compression != "" {
		c := decodeCompression(a.compression)
		if m, err := btrfsCompression(c); err == nil && m == actual {
			return c
		}
	}
	alg, level, _ := strings.Cut(actual, ":")
	switch alg {
	case "none", "":
		return storage.Compression{Type: "off"}
	case "zlib":
		n, err := strconv.Atoi(level)
		if err != nil {
			n = 3 // zlib's default level in btrfs
		}
		return storage.Compression{Type: "gzip_n", Level: n}
	case "lzo":
		return storage.Compression{Type: "lz4"}
	}
	return storage.Compression{Type: "on"} // zstd: compressed, by none of upstream's
}
