// Package qemujail starts QEMU shut in, so that a guest that escapes into
// QEMU reaches nothing:
//
//   - a network namespace with nothing in it (its loopback down): QEMU is
//     handed its taps, sockets and files as descriptors and needs no
//     network, so it cannot connect to the agent's API, another VMM's
//     service or anything on the underlay;
//   - a mount namespace whose root is a read-only tmpfs showing, read-only,
//     only what QEMU needs to run (its binary, the libraries, its data files
//     such as option ROMs: [DefaultShow]), a /dev with null, zero, full,
//     random and urandom (and /dev/kvm under KVM), and a private /tmp and
//     /dev/shm; no /proc, no /sys, nothing of the host writable;
//   - an IPC namespace of its own;
//   - its own user and group, no other group but those it is given, no
//     capabilities (none permitted, effective, inheritable or ambient, an
//     empty bounding set) and no_new_privs;
//   - only the descriptors it is handed (0, 1, 2, and 3 on).
//
// Go's os/exec runs no code between clone and exec, and a mount namespace
// needs some. So [Wrap] makes QEMU's command start this program again
// (/proc/self/exe), the kernel making the new namespaces at clone
// (SysProcAttr.Cloneflags) so that a namespace that cannot be made fails
// the start; and [RunIfAsked], which a program that starts QEMU calls first
// thing in main, sets the mounts up, becomes QEMU's user and execs QEMU, in
// the same process (the pid the caller sees, born in the caller's cgroup,
// is QEMU's). The step is small and runs nothing else: no flags, no
// other package's code. Whatever it cannot do ends it (exit 127) with a
// line on stderr, which becomes QEMU's last words: QEMU never runs half
// confined.
package qemujail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Marker is argv[0] of the step that shuts QEMU in: RunIfAsked runs it.
const Marker = "sled-agent-qemu-jail"

// selfExe is this program, as the kernel holds it (a binary replaced on
// disk since it started is still the one run).
const selfExe = "/proc/self/exe"

// cloneFlags are the namespaces QEMU gets, made by the kernel at clone.
const cloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWIPC

// DefaultShow are the host's paths QEMU is shown read-only (those that
// exist): the libraries and the dynamic loader (Debian keeps them in
// /usr/lib, /lib and /lib64 being links to it on merged-/usr hosts), the
// loader's cache, and QEMU's data: option ROMs, keymaps and firmware
// descriptions in /usr/share/qemu, SeaBIOS and its VGA BIOSes in
// /usr/share/seabios, iPXE's ROMs in /usr/lib/ipxe (QEMU's firmware path on
// Debian). QEMU's binary is shown too, at its own path.
var DefaultShow = []string{
	"/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32",
	"/etc/ld.so.cache", "/usr/share/qemu", "/usr/share/seabios",
}

// devices are the device nodes every QEMU's /dev holds.
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// Config is who QEMU runs as and what it is shown.
type Config struct {
	// UID and GID are QEMU's user and group; never 0.
	UID, GID uint32
	// Groups are its supplementary groups (none: it has none).
	Groups []uint32
	// Devices are device nodes QEMU opens itself (/dev/kvm under KVM),
	// in its /dev beside the usual ones.
	Devices []string
	// Show are the host's files and directories QEMU sees, read-only, at
	// their own paths (nil: DefaultShow); one that does not exist is
	// skipped.
	Show []string
	// FDs is how many descriptors from 3 on QEMU is handed (Wrap sets
	// it from the command's ExtraFiles); any other is closed at exec.
	FDs int
	// TmpSize is the size of the private /tmp and /dev/shm, each
	// ("64m" if empty): tmpfs's size= option.
	TmpSize string
}

// ErrConfig is a Config or command Wrap refuses.
var ErrConfig = errors.New("qemujail")

// Wrap makes cmd, whose Path is QEMU's program (an absolute path), start
// QEMU shut in as c says (see the package's doc). cmd keeps its
// arguments, descriptors, environment and SysProcAttr (a caller's cgroup,
// process group); it must not set a Credential: QEMU's ids are c's, taken
// after the mounts are made.
func Wrap(cmd *exec.Cmd, c Config) error {
	if c.UID == 0 || c.GID == 0 {
		return fmt.Errorf("%w: QEMU would run as root (uid %d gid %d)", ErrConfig, c.UID, c.GID)
	}
	if !filepath.IsAbs(cmd.Path) {
		return fmt.Errorf("%w: QEMU's program %q is not an absolute path", ErrConfig, cmd.Path)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if cmd.SysProcAttr.Credential != nil {
		return fmt.Errorf("%w: the command sets its credential: QEMU's user is taken inside its namespaces", ErrConfig)
	}
	if c.Show == nil {
		c.Show = DefaultShow
	}
	c.FDs = len(cmd.ExtraFiles)
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	argv := cmd.Args
	if len(argv) == 0 {
		argv = []string{cmd.Path}
	}
	cmd.Args = append([]string{Marker, string(b), cmd.Path}, argv...)
	cmd.Path = selfExe
	cmd.SysProcAttr.Cloneflags |= cloneFlags
	return nil
}

// RunIfAsked shuts QEMU in and execs it when this process was started by
// a command Wrap made; otherwise it returns at once. A program that may
// start QEMU (sled-agent, and test binaries whose code starts it) calls it
// first thing in main. It never returns when asked: QEMU runs, or the
// process exits 127 saying why on stderr.
func RunIfAsked() {
	if len(os.Args) < 4 || os.Args[0] != Marker {
		return
	}
	err := run(os.Args[1], os.Args[2], os.Args[3:])
	fmt.Fprintf(os.Stderr, "qemujail: QEMU not started: %v\n", err)
	os.Exit(127)
}
