// Package sledns runs this process as a sled inside a network namespace
// that plays its host: its underlay address, its zones' host ends and its
// routes live there, while its zones' namespaces are made in /run/netns as
// every agent's are. It is how several sleds run on one machine (tests, dev,
// a small rack on one host).
//
// The whole process must live in the namespace, every thread of it: a
// thread that entered it alone would leave the Go runtime's other threads,
// and everything they open, in the host's. So Enter re-executes the binary
// from a thread that entered the namespace: execve keeps the calling
// thread's namespaces, and every thread of the new image is born there. It
// does not enter a mount namespace of its own (as `ip netns exec` does), so
// the namespaces the agent bind-mounts in /run/netns are the host's to see
// and to tear down; /sys then still shows the host's links, which the Linux
// runtime notices and reads links through netlink instead.
package sledns

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Env names the namespace the re-executed process was started in; Enter
// reads it to know it is already there.
const Env = "SLED_AGENT_NETNS"

// Dir holds the named network namespaces, as iproute2's.
const Dir = "/run/netns"

var validName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)

// ErrNoNetns is a namespace name with no namespace at Dir/name.
var ErrNoNetns = errors.New("no such network namespace")

// Enter makes the process a sled in the network namespace called name
// (Dir/name, as `ip netns add` makes): in the process Enter re-executed, it
// checks that the process is there and returns nil; otherwise it enters the
// namespace on a locked thread and re-executes the binary with the same
// arguments, so it returns only on an error (the namespace missing, or the
// exec failing). Call it before the process writes or opens anything of the
// sled's.
func Enter(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("--netns %q: want 1–128 bytes of [A-Za-z0-9_.-], not starting with a dot", name)
	}
	path := Dir + "/" + name
	want, err := nsID(path)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("--netns %s: %w (%s; make it with ip netns add %s)", name, ErrNoNetns, path, name)
		}
		return fmt.Errorf("--netns %s: %w", name, err)
	}
	if os.Getenv(Env) == name {
		have, err := nsID("/proc/self/ns/net")
		if err != nil {
			return fmt.Errorf("--netns %s: %w", name, err)
		}
		if have != want {
			return fmt.Errorf("--netns %s: %s=%s says this process was started in it, but it is not", name, Env, name)
		}
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--netns %s: finding this binary to run it there: %w", name, err)
	}
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--netns %s: %w", name, err)
	}
	defer ns.Close()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, Env+"=") })
	env = append(env, Env+"="+name)

	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--netns %s: %w", name, err)
	}
	defer home.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("--netns %s: entering it: %w", name, err)
	}
	err = unix.Exec(exe, os.Args, env)
	// The exec failed: back home, or the thread stays locked and goes with
	// this goroutine's end, never running anything else in the sled's
	// namespace.
	if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return fmt.Errorf("--netns %s: running %s there: %w", name, exe, err)
}

// nsID is the device and inode of the namespace file path: two paths with
// one ID are one namespace.
func nsID(path string) ([2]uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return [2]uint64{}, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return [2]uint64{}, err
	}
	if fs.Type != unix.NSFS_MAGIC {
		return [2]uint64{}, fmt.Errorf("%s is not a namespace (nothing is mounted on it)", path)
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}
