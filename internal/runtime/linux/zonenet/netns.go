package zonenet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const netnsDir = "/run/netns"

// NetnsExists reports whether the namespace called name exists: its file is
// there and has a namespace mounted on it. One statfs; cheap enough to poll.
func NetnsExists(name string) bool {
	if validNetns(name) != nil {
		return false
	}
	return isNetnsMount(NetnsPath(name))
}

func isNetnsMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// runDir guards the one-time preparation of /run/netns. It is held across
// mount(2) calls on a local directory, which do not wait on anything; without
// it two zones created at once could each find /run/netns not yet a mount
// point and stack two bind mounts on it.
var runDir struct {
	mu    sync.Mutex
	ready bool
}

// prepareNetnsDir creates /run/netns and makes it a shared mount point, as
// iproute2 does, so that namespace mounts under it propagate to mount
// namespaces created later (and their unmounts too).
func prepareNetnsDir() error {
	runDir.mu.Lock()
	defer runDir.mu.Unlock()
	if runDir.ready {
		return nil
	}
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	for boundOnItself := false; ; boundOnItself = true {
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			runDir.ready = true
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || boundOnItself {
			return fmt.Errorf("making %s a shared mount: %w", netnsDir, err)
		}
		// Not a mount point yet: bind it onto itself, then retry.
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself: %w", netnsDir, err)
		}
	}
}

// createNetns makes the namespace called name exist. A leftover file without
// a namespace mounted on it (a crash between creating and mounting it) is
// replaced. created says the namespace was made just now: it holds nothing
// but its loopback.
func createNetns(name string) (created bool, err error) {
	path := NetnsPath(name)
	if isNetnsMount(path) {
		return false, nil
	}
	if err := prepareNetnsDir(); err != nil {
		return false, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EEXIST) {
		// A leftover: clear it, and try once more.
		if err := removeNetns(name); err != nil {
			return false, err
		}
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return false, fmt.Errorf("creating namespace file: %w", err)
	}
	unix.Close(fd)

	errc := make(chan error, 1)
	go inNamespace(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		self := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting the new namespace on %s: %w", path, err)
		}
		return nil
	}, errc)
	if err := <-errc; err != nil {
		os.Remove(path)
		return false, err
	}
	return true, nil
}

// openNetns opens the namespace called name, or returns netns.None() if it
// does not exist (no file, or no namespace mounted on it).
func openNetns(name string) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath(NetnsPath(name))
	if errors.Is(err, unix.ENOENT) {
		return netns.None(), nil
	}
	if err != nil {
		return netns.None(), fmt.Errorf("opening namespace %s: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(ns), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		ns.Close()
		return netns.None(), err
	}
	return ns, nil
}

// handleIn opens a netlink handle whose sockets live in ns (a socket stays in
// the namespace it was made in).
func handleIn(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	errc := make(chan error, 1)
	go inNamespace(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	}, errc)
	return h, <-errc
}

// inNamespace runs f on a locked thread that f may move into another network
// namespace, sends f's result to errc, and moves the thread back to where it
// was. Only a thread that is back where it started is unlocked and reused;
// one that could not be moved back stays locked, so the Go runtime discards
// it with this goroutine and no other goroutine ever runs in the wrong
// namespace. (Discarding every such thread instead would, when the thread is
// the process's main one, leave the whole process looking as if it lived in
// the zone and keep the zone's namespace alive.)
func inNamespace(f func() error, errc chan<- error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		errc <- fmt.Errorf("getting the thread's namespace: %w", err)
		return // thread discarded
	}
	defer orig.Close()
	errc <- f()
	if netns.Set(orig) == nil {
		runtime.UnlockOSThread()
	}
}

// RunIn runs f on a thread in the network namespace called name (at
// NetnsPath), moving the thread back after; a thread that cannot be moved
// back is not reused. A namespace that does not exist is ErrNoNetns.
func RunIn(name string, f func() error) error {
	if err := validNetns(name); err != nil {
		return err
	}
	ns, err := openNetns(name)
	if err != nil {
		return err
	}
	if !ns.IsOpen() {
		return ErrNoNetns
	}
	defer ns.Close()
	return runInHandle(ns, f)
}

// RunInPath is RunIn for the network namespace at path: a file a namespace
// is mounted on, or a process's /proc/<pid>/ns/net.
func RunInPath(path string, f func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", path, err)
	}
	defer ns.Close()
	return runInHandle(ns, f)
}

func runInHandle(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go inNamespace(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return f()
	}, errc)
	return <-errc
}

// removeNetns unmounts and deletes the namespace file, as `ip netns delete`
// does. The namespace itself goes when nothing else holds it. A missing file
// is not an error.
func removeNetns(name string) error {
	path := NetnsPath(name)
	// More than one mount may be stacked on the file; take them all off.
	for range 8 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// listNetns returns the names in /run/netns that start with prefix.
func listNetns(prefix string) ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && validNetns(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// StartIn starts cmd with its process inside the namespace called name. The
// process is forked from a thread moved into the namespace for the purpose
// (RunIn), so it is born there, as are its children, and no nsenter has to
// run first.
func StartIn(name string, cmd *exec.Cmd) error {
	if err := RunIn(name, cmd.Start); err != nil {
		return fmt.Errorf("zonenet: starting %s in namespace %s: %w", cmd.Path, name, err)
	}
	return nil
}

// ProcessIn reports whether process pid lives in the namespace called name.
func ProcessIn(pid int, name string) (bool, error) {
	if err := validNetns(name); err != nil {
		return false, err
	}
	var want, got unix.Stat_t
	if err := unix.Stat(NetnsPath(name), &want); err != nil {
		return false, fmt.Errorf("zonenet: namespace %s: %w", name, err)
	}
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &got); err != nil {
		return false, fmt.Errorf("zonenet: namespace of process %d: %w", pid, err)
	}
	return got.Dev == want.Dev && got.Ino == want.Ino, nil
}

// RemoveNetns unmounts and deletes the namespace file called name, as `ip
// netns delete` does, whatever it holds (a simulated reboot's use: its
// processes are dead and its links go with it). A missing file is not an
// error.
func RemoveNetns(name string) error {
	if err := validNetns(name); err != nil {
		return err
	}
	return removeNetns(name)
}
