package qemujail

// The step between clone and QEMU: it runs as root in the namespaces the
// kernel made at clone, and ends in QEMU's exec or in exit 127.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// stage is where the new root is put together before it becomes the root:
// a directory every Linux host has. Its tmpfs hides the host's /tmp from
// here on, in this mount namespace only; what the new root shows is opened
// before (shown).
const stage = "/tmp"

// shown is a host path opened (O_PATH) before anything is mounted: bound
// from its descriptor, it is the host's file whatever is mounted since.
type shown struct {
	path string
	fd   int
	dir  bool
	link string // a symbolic link's target, made again rather than bound
}

func run(conf, binary string, argv []string) error {
	// The bounding set, ambient capabilities and no_new_privs are the
	// thread's; the exec is from this thread.
	runtime.LockOSThread()
	var c Config
	if err := json.Unmarshal([]byte(conf), &c); err != nil {
		return fmt.Errorf("its configuration: %w", err)
	}
	if c.UID == 0 || c.GID == 0 {
		return fmt.Errorf("QEMU would run as root (uid %d gid %d)", c.UID, c.GID)
	}
	if !filepath.IsAbs(binary) {
		return fmt.Errorf("QEMU's program %q is not an absolute path", binary)
	}
	if err := checkNamespaces(); err != nil {
		return err
	}
	var show, devs []shown
	defer func() {
		for _, s := range slices.Concat(show, devs) {
			if s.fd >= 0 {
				unix.Close(s.fd)
			}
		}
	}()
	for _, p := range c.Show {
		s, err := open(p, false, false)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		show = append(show, s)
	}
	// The binary is shown at its path whatever it links to.
	s, err := open(binary, false, true)
	if err != nil {
		return fmt.Errorf("QEMU's program: %w", err)
	}
	show = append(show, s)
	for _, d := range slices.Concat(devices, c.Devices) {
		s, err := open(d, true, true)
		if err != nil {
			return err
		}
		devs = append(devs, s)
	}
	if err := makeRoot(show, devs, c.TmpSize); err != nil {
		return fmt.Errorf("its root: %w", err)
	}
	if err := dropPrivileges(c); err != nil {
		return err
	}
	// Nothing but what QEMU is handed crosses the exec: descriptors this
	// step opened are close-on-exec already; anything else inherited
	// (from 3+FDs on) is made so.
	if err := unix.CloseRange(uint(3+c.FDs), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("closing descriptors from %d: %w", 3+c.FDs, err)
	}
	return fmt.Errorf("exec %s: %w", binary, syscall.Exec(binary, argv, os.Environ()))
}

// checkNamespaces makes sure this process is in mount and network
// namespaces of its own (not its parent's: mounts made here must never
// be the host's), and that its network namespace holds nothing but a
// loopback that is down.
func checkNamespaces() error {
	parent := "/proc/" + strconv.Itoa(os.Getppid()) + "/ns/"
	for _, ns := range []string{"mnt", "net", "ipc"} {
		var mine, theirs unix.Stat_t
		if err := unix.Stat("/proc/self/ns/"+ns, &mine); err != nil {
			return fmt.Errorf("its %s namespace: %w", ns, err)
		}
		if err := unix.Stat(parent+ns, &theirs); err != nil {
			return fmt.Errorf("its parent's %s namespace: %w", ns, err)
		}
		if mine.Ino == theirs.Ino && mine.Dev == theirs.Dev {
			return fmt.Errorf("not in a %s namespace of its own", ns)
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("its network namespace: %w", err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback == 0 || i.Flags&net.FlagUp != 0 {
			return fmt.Errorf("its network namespace is not empty: it has %s (%v)", i.Name, i.Flags)
		}
	}
	return nil
}

// open opens path for the new root. Unless follow is set, a path that is
// a symbolic link is not followed: it is made again, as a link.
func open(path string, device, follow bool) (shown, error) {
	s := shown{path: filepath.Clean(path), fd: -1}
	if !filepath.IsAbs(path) {
		return s, fmt.Errorf("%q is not an absolute path", path)
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.path, &st); err != nil {
		return s, &fs.PathError{Op: "lstat", Path: s.path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK && !follow {
		l, err := os.Readlink(s.path)
		if err != nil {
			return s, err
		}
		s.link = l
		return s, nil
	}
	fd, err := unix.Open(s.path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return s, &fs.PathError{Op: "open", Path: s.path, Err: err}
	}
	s.fd = fd
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return s, err
	}
	s.dir = st.Mode&unix.S_IFMT == unix.S_IFDIR
	if device && st.Mode&unix.S_IFMT != unix.S_IFCHR {
		unix.Close(fd)
		return s, fmt.Errorf("%s is not a character device", s.path)
	}
	return s, nil
}

// makeRoot makes the new root (a tmpfs at stage), mounts in it the
// private /tmp and /dev/shm, /dev's devices and the shown paths, makes it
// the root and drops the host's, and makes it read-only.
func makeRoot(show, devs []shown, tmpSize string) error {
	if tmpSize == "" {
		tmpSize = "64m"
	}
	if strings.ContainsAny(tmpSize, ",") {
		return fmt.Errorf("tmpfs size %q", tmpSize)
	}
	// Nothing mounted here reaches the host, nor the host's mounts here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	const nosuid = unix.MS_NOSUID | unix.MS_NODEV
	if err := unix.Mount("tmpfs", stage, "tmpfs", nosuid|unix.MS_NOEXEC, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("tmpfs at %s: %w", stage, err)
	}
	in := func(p string) string { return filepath.Join(stage, p) }
	for _, d := range []string{"/tmp", "/dev"} {
		if err := os.Mkdir(in(d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", in("/tmp"), "tmpfs", nosuid|unix.MS_NOEXEC, "mode=1777,size="+tmpSize); err != nil {
		return fmt.Errorf("private /tmp: %w", err)
	}
	if err := unix.Mount("tmpfs", in("/dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	if err := os.Mkdir(in("/dev/shm"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", in("/dev/shm"), "tmpfs", nosuid|unix.MS_NOEXEC, "mode=1777,size="+tmpSize); err != nil {
		return fmt.Errorf("private /dev/shm: %w", err)
	}
	for _, d := range devs {
		if err := bind(in(d.path), d, unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
			return err
		}
	}
	if err := remountRO(in("/dev"), unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
		return err
	}
	for _, s := range show {
		if _, err := os.Lstat(in(s.path)); err == nil {
			continue // under a directory shown already
		}
		if err := os.MkdirAll(filepath.Dir(in(s.path)), 0o755); err != nil {
			return err
		}
		if s.link != "" {
			if err := os.Symlink(s.link, in(s.path)); err != nil {
				return err
			}
			continue
		}
		if err := bind(in(s.path), s, unix.MS_NOSUID|unix.MS_NODEV); err != nil {
			return err
		}
	}
	// The new root becomes the root, the host's stacked over it and then
	// detached: nothing of it is reachable any more.
	if err := unix.Chdir(stage); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return remountRO("/", nosuid|unix.MS_NOEXEC)
}

// bind mounts what s opened at target (made as an empty file or directory)
// read-only, with flags.
func bind(target string, s shown, flags uintptr) error {
	err := os.MkdirAll(filepath.Dir(target), 0o755)
	switch {
	case err != nil:
	case s.dir:
		err = os.Mkdir(target, 0o755)
	default:
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return err
	}
	// Not recursive: what is mounted below a shown directory on the host
	// is not shown.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(s.fd), target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("showing %s: %w", s.path, err)
	}
	return remountRO(target, flags)
}

// remountRO makes the mount at target read-only, with flags.
func remountRO(target string, flags uintptr) error {
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", target, err)
	}
	return nil
}

// dropPrivileges makes this process QEMU's user: its groups, no
// capabilities (an empty bounding set, none ambient, inheritable,
// permitted or effective), and no_new_privs, so that nothing it execs
// gains any.
func dropPrivileges(c Config) error {
	for capability := 0; ; capability++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(capability), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", capability, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	groups := make([]int, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = int(g)
	}
	// syscall's Setgroups, Setgid and Setuid change every thread.
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(c.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", c.GID, err)
	}
	if err := syscall.Setuid(int(c.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", c.UID, err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("clearing capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// What the kernel says now, not what was asked.
	var got [2]unix.CapUserData
	if err := unix.Capget(&hdr, &got[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if got != none {
		return fmt.Errorf("capabilities left: %+v", got)
	}
	if r, e, s := unix.Getresuid(); r != int(c.UID) || e != r || s != r {
		return fmt.Errorf("uids %d %d %d, want %d", r, e, s, c.UID)
	}
	if r, e, s := unix.Getresgid(); r != int(c.GID) || e != r || s != r {
		return fmt.Errorf("gids %d %d %d, want %d", r, e, s, c.GID)
	}
	return nil
}
