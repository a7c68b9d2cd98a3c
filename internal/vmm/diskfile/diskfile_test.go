package diskfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// withFallback runs f twice: with openat2, and as on a kernel without it
// (the component-by-component walk).
func withFallback(t *testing.T, f func(t *testing.T)) {
	t.Run("openat2", f)
	t.Run("walk", func(t *testing.T) {
		old := openat2
		openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
		t.Cleanup(func() { openat2 = old })
		f(t)
	})
}

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
}

func idOf(t *testing.T, path string) ID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}
}

// mountTmpfs mounts a tmpfs at dir (made) until the test ends; it skips
// the test without root.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

func TestOpenJudgesAndKeepsTheDescriptor(t *testing.T) {
	withFallback(t, func(t *testing.T) {
		root := t.TempDir()
		if err := os.Mkdir(filepath.Join(root, "vm"), 0o700); err != nil {
			t.Fatal(err)
		}
		disk := filepath.Join(root, "vm", "disk.raw")
		write(t, disk)
		for _, w := range []bool{true, false} {
			f, err := Open(root+"/vm//./disk.raw", []string{"/nonexistent", root}, w)
			if err != nil {
				t.Fatal(err)
			}
			if f.ID != idOf(t, disk) || f.Path != disk || f.Root != root {
				t.Errorf("opened %s %s in %s; want %s %s in %s", f.Path, f.ID, f.Root, disk, idOf(t, disk), root)
			}
			fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := unix.O_RDONLY
			if w {
				want = unix.O_RDWR
			}
			if fl&unix.O_ACCMODE != want || fl&unix.O_NONBLOCK != 0 {
				t.Errorf("write %v: flags %#x; want access %#x, blocking", w, fl, want)
			}
			f.Close()
		}
	})
}

// A path that is a symbolic link when it is opened is refused, whether
// the file itself or a directory on the way is the link, and wherever it
// points; so is a hard link (nlink 2), whose other name could be any
// file's.
func TestRefusals(t *testing.T) {
	withFallback(t, func(t *testing.T) {
		root, other := t.TempDir(), t.TempDir()
		secret := filepath.Join(other, "secret")
		write(t, secret)
		disk := filepath.Join(root, "disk.raw")
		write(t, disk)
		if err := os.Mkdir(filepath.Join(root, "dir"), 0o700); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(root, "dir", "inner.raw"))
		mustSymlink(t, disk, filepath.Join(root, "inside-link"))
		mustSymlink(t, secret, filepath.Join(root, "outside-link"))
		mustSymlink(t, "dir", filepath.Join(root, "dirlink"))
		mustSymlink(t, other, filepath.Join(root, "otherlink"))
		if err := os.Link(secret, filepath.Join(root, "hard")); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			path string
			want error
			says string
		}{
			{filepath.Join(root, "inside-link"), ErrSymlink, "symbolic link"},
			{filepath.Join(root, "outside-link"), ErrSymlink, "symbolic link"},
			{filepath.Join(root, "dirlink", "inner.raw"), ErrSymlink, "symbolic link"},
			{filepath.Join(root, "otherlink", "secret"), ErrSymlink, "symbolic link"},
			{filepath.Join(root, "hard"), ErrLinks, "more than one hard link (2)"},
			{filepath.Join(root, "dir"), ErrNotRegular, "not a regular file (d"},
			{filepath.Join(root, "fifo"), ErrNotRegular, "not a regular file (p"},
			{filepath.Join(root, "nope.raw"), unix.ENOENT, "no such file"},
			{root, ErrOutside, "outside this sled's guest storage"},
			{secret, ErrOutside, "outside"},
			{root + "/dir/../../" + filepath.Base(other) + "/secret", ErrOutside, "outside"},
			{"/etc/passwd", ErrOutside, `path "/etc/passwd" (/etc/passwd) is outside`},
		} {
			f, err := Open(tc.path, []string{root}, true)
			if f != nil {
				f.Close()
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("Open(%s) = %v; want %v saying %q and naming the path", tc.path, err, tc.want, tc.says)
			}
		}
		if _, err := Open("disk.raw", []string{root}, false); err == nil || !strings.Contains(err.Error(), "not absolute") {
			t.Errorf("a relative path: %v", err)
		}
	})
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// A file judged and then replaced by a symbolic link: the descriptor is
// still the file judged, and opening the path again is refused.
func TestSwapAfterOpen(t *testing.T) {
	withFallback(t, func(t *testing.T) {
		root, other := t.TempDir(), t.TempDir()
		secret := filepath.Join(other, "secret")
		write(t, secret)
		disk := filepath.Join(root, "disk.raw")
		write(t, disk)
		judged := idOf(t, disk)
		f, err := Open(disk, []string{root}, true)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tmp := filepath.Join(root, "swap")
		mustSymlink(t, secret, tmp)
		if err := os.Rename(tmp, disk); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		if (ID{Dev: st.Dev, Ino: st.Ino}) != judged {
			t.Fatalf("the descriptor is %d:%d after the swap; want the judged %s", st.Dev, st.Ino, judged)
		}
		if g, err := Open(disk, []string{root}, true); !errors.Is(err, ErrSymlink) {
			g.Close()
			t.Fatalf("opening the swapped path: %v; want ErrSymlink", err)
		}
	})
}

// A file on another mount below its root is refused: a directory on the
// way that is a mount point, or the file itself bind-mounted from
// elsewhere. A root mounted inside another root is opened from itself.
func TestOtherMounts(t *testing.T) {
	withFallback(t, func(t *testing.T) {
		root := t.TempDir()
		mnt := filepath.Join(root, "mnt")
		mountTmpfs(t, mnt)
		inner := filepath.Join(mnt, "disk.raw")
		write(t, inner)
		f, err := Open(inner, []string{root}, true)
		if f != nil {
			f.Close()
		}
		if !errors.Is(err, ErrMount) {
			t.Errorf("a file on a mount below the root: %v; want ErrMount", err)
		}
		// The mount is a root of its own: the deepest root holds it.
		f, err = Open(inner, []string{root, mnt}, true)
		if err != nil {
			t.Fatalf("a file in a root mounted inside another: %v", err)
		}
		if f.Root != mnt || f.ID != idOf(t, inner) {
			t.Errorf("opened in %s as %s", f.Root, f.ID)
		}
		f.Close()

		// A file of the root bind-mounted over by the tmpfs's.
		target := filepath.Join(root, "bound.raw")
		write(t, target)
		if err := unix.Mount(inner, target, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
		f, err = Open(target, []string{root}, true)
		if f != nil {
			f.Close()
		}
		if !errors.Is(err, ErrMount) && !errors.Is(err, ErrDevice) {
			t.Errorf("a bind-mounted file: %v; want ErrMount or ErrDevice", err)
		}
	})
}

// A root named through a symbolic link holds the paths under either name.
func TestRootThroughALink(t *testing.T) {
	real := t.TempDir()
	named := filepath.Join(t.TempDir(), "images")
	mustSymlink(t, real, named)
	write(t, filepath.Join(real, "disk.raw"))
	for _, p := range []string{filepath.Join(named, "disk.raw"), filepath.Join(real, "disk.raw")} {
		f, err := Open(p, []string{named}, false)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if f.Path != p {
			t.Errorf("judged %s as %s", p, f.Path)
		}
		f.Close()
	}
}
