// Package diskfile opens a guest disk's file, a file of the sled's guest
// storage, and judges the descriptor it opened: the agent at registration
// and the VMM service building its machine both open a file backend here,
// and the service hands QEMU the very descriptor judged, so nothing can be
// swapped between the check and QEMU.
//
// The file is opened from its root's directory descriptor, beneath it,
// with no symbolic link followed and no mount point crossed (openat2
// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV; where the kernel
// has no openat2, a walk of the same rules one component at a time, each
// opened O_NOFOLLOW from the last). What was opened must be a regular file
// with exactly one link (another name could be any file's: a hard link to
// /etc/passwd in the image directory is /etc/passwd) on its root's device.
package diskfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Reasons a file is refused, for decisions; the errors Open returns wrap
// one of them (or the system's error: ENOENT, EACCES, …) and name the path.
var (
	// ErrOutside: the path lies in none of the roots (or is a root).
	ErrOutside = errors.New("outside this sled's guest storage")
	// ErrSymlink: the path, or a directory on the way, is a symbolic link.
	ErrSymlink = errors.New("a symbolic link is on the way (none is followed: name the file by its real path)")
	// ErrMount: the path crosses a mount point below its root.
	ErrMount = errors.New("crosses a mount point below its root")
	// ErrNotRegular: what the path names is not a regular file.
	ErrNotRegular = errors.New("not a regular file")
	// ErrLinks: the file has another name (a hard link).
	ErrLinks = errors.New("has more than one hard link")
	// ErrDevice: the file is on another device than its root.
	ErrDevice = errors.New("is on another device than its root")
)

// ID is a file as the kernel knows it: a device and an inode.
type ID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func (id ID) String() string {
	return fmt.Sprintf("device %d:%d inode %d", unix.Major(id.Dev), unix.Minor(id.Dev), id.Ino)
}

// File is a guest disk's file, opened and judged.
type File struct {
	// File is the descriptor: read-write or read-only as asked, blocking.
	// QEMU is given this one.
	*os.File
	// Path is the file's name as judged: its root (as the sled names it)
	// joined with the rest of the path, cleaned.
	Path string
	// Root is the root it lies in.
	Root string
	// ID is the opened file's device and inode.
	ID ID
}

// Close closes f's descriptor; a nil f is fine.
func (f *File) Close() error {
	if f == nil || f.File == nil {
		return nil
	}
	return f.File.Close()
}

// openat2 is unix.Openat2; tests replace it to take the fallback.
var openat2 = unix.Openat2

// Open opens path, an absolute path inside one of roots, for a guest's
// disk: read-write if write, else read-only. The root a path lies in is
// the deepest of roots that is a prefix of it, as the root is named or as
// its symbolic links resolve (a root is the operator's and is followed;
// below it nothing is).
func Open(path string, roots []string, write bool) (*File, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("path %q is not absolute", path)
	}
	clean := filepath.Clean(path)
	type cand struct{ root, named, rel string }
	var cands []cand
	for _, root := range roots {
		names := []string{filepath.Clean(root)}
		if r, err := filepath.EvalSymlinks(root); err == nil && r != names[0] {
			names = append(names, r)
		}
		for _, n := range names {
			if rel, ok := beneath(clean, n); ok {
				cands = append(cands, cand{root: root, named: n, rel: rel})
			}
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("path %q (%s) is %w (the pools' local_storage datasets and the VMM image directory)", path, clean, ErrOutside)
	}
	// The deepest root first: a dataset mounted inside another root is
	// opened from its own directory, not across its mount point.
	slices.SortStableFunc(cands, func(a, b cand) int { return len(b.named) - len(a.named) })
	var errs []error
	for _, c := range cands {
		f, err := openIn(c.named, c.rel, write)
		if err == nil {
			f.Path, f.Root = filepath.Join(c.named, c.rel), c.root
			return f, nil
		}
		var re rootError
		if !errors.As(err, &re) {
			return nil, fmt.Errorf("path %q: %w", path, err)
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("path %q: %w", path, errors.Join(errs...))
}

// beneath returns p, a clean absolute path, relative to root if it lies
// below it (not root itself).
func beneath(p, root string) (string, bool) {
	if !filepath.IsAbs(root) {
		return "", false
	}
	if root == "/" {
		return p[1:], p != "/"
	}
	rest, ok := strings.CutPrefix(p, root)
	if !ok || len(rest) < 2 || rest[0] != '/' {
		return "", false
	}
	return rest[1:], true
}

// rootError is a root that could not be opened: another root holding the
// path may be tried.
type rootError struct{ err error }

func (e rootError) Error() string { return e.err.Error() }
func (e rootError) Unwrap() error { return e.err }

// openIn opens rel, a clean relative path with no "..", beneath root.
func openIn(root, rel string, write bool) (*File, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, rootError{fmt.Errorf("its root %s: %w", root, err)}
	}
	defer unix.Close(rfd)
	var rst unix.Stat_t
	if err := unix.Fstat(rfd, &rst); err != nil {
		return nil, rootError{fmt.Errorf("its root %s: %w", root, err)}
	}
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	// O_NONBLOCK keeps a FIFO from blocking the open; it is cleared once
	// the file is known to be a regular one.
	flags |= unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK
	fd, err := openat2(rfd, rel, &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = walk(rfd, rst.Dev, rel, flags)
	}
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, ErrSymlink
	case errors.Is(err, unix.EXDEV):
		// rel has no "..": only a mount point makes openat2 say this.
		return nil, fmt.Errorf("%w %s", ErrMount, root)
	case errors.Is(err, unix.EISDIR): // a directory opened for writing
		return nil, fmt.Errorf("%w (%s)", ErrNotRegular, os.ModeDir)
	case err != nil:
		return nil, err
	}
	f, err := judge(fd, filepath.Join(root, rel), root, rst.Dev)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return f, nil
}

// judge checks the descriptor opened: a regular file with one link, on
// its root's device.
func judge(fd int, name, root string, rootDev uint64) (*File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	id := ID{Dev: st.Dev, Ino: st.Ino}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%w (%s)", ErrNotRegular, fileType(st.Mode))
	case st.Nlink != 1:
		return nil, fmt.Errorf("%w (%d): another name could be any file's", ErrLinks, st.Nlink)
	case st.Dev != rootDev:
		return nil, fmt.Errorf("%w %s (%s, the root %d:%d)", ErrDevice, root, id, unix.Major(rootDev), unix.Minor(rootDev))
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return nil, err
	}
	return &File{File: os.NewFile(uintptr(fd), name), ID: id}, nil
}

// fileType is what kind of file a stat mode says, as os.FileMode names it.
func fileType(mode uint32) os.FileMode {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFLNK:
		return os.ModeSymlink
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	case unix.S_IFSOCK:
		return os.ModeSocket
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		return os.ModeDevice
	}
	return os.ModeIrregular
}

// walk is openat2's rules without openat2 (kernels before 5.6): each
// directory on the way is opened O_PATH|O_NOFOLLOW from the last and must
// be a directory on the root's device, and the file is opened O_NOFOLLOW.
// A bind mount of the root's own file system is not seen here (its device
// is the root's); openat2's RESOLVE_NO_XDEV sees it.
func walk(rfd int, rootDev uint64, rel string, flags int) (int, error) {
	parts := strings.Split(rel, "/")
	dir := rfd
	defer func() {
		if dir != rfd {
			unix.Close(dir)
		}
	}()
	for _, p := range parts[:len(parts)-1] {
		fd, err := unix.Openat(dir, p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		switch {
		case err != nil:
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			err = unix.ELOOP
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			err = unix.ENOTDIR
		case st.Dev != rootDev:
			err = unix.EXDEV
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		if dir != rfd {
			unix.Close(dir)
		}
		dir = fd
	}
	return unix.Openat(dir, parts[len(parts)-1], flags|unix.O_NOFOLLOW, 0)
}
