package btrfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The kernel's device events (uevents), as udev reads them: datagrams on a
// NETLINK_KOBJECT_UEVENT socket bound to the kernel's multicast group, each
// "ACTION@DEVPATH" then NUL-separated KEY=VALUE pairs. No udev daemon is
// needed. Disks' arrivals and removals are followed this way (events.go).

// uevent is one kernel device event.
type uevent struct {
	Action    string // "add", "remove", "change", "bind", …
	Subsystem string // "block", …
	DevType   string // for block: "disk" or "partition"
	DevName   string // "nvme0n1", "loop3"
	DevPath   string // "/devices/virtual/block/loop3"
}

// parseUevent decodes a kernel uevent datagram. Anything else (udev's own
// "libudev" messages, which are sent on another group) is refused.
func parseUevent(msg []byte) (uevent, bool) {
	head, rest, _ := bytes.Cut(msg, []byte{0})
	if !bytes.Contains(head, []byte("@")) {
		return uevent{}, false
	}
	var ev uevent
	for _, kv := range bytes.Split(rest, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte("="))
		if !ok {
			continue
		}
		switch string(k) {
		case "ACTION":
			ev.Action = string(v)
		case "SUBSYSTEM":
			ev.Subsystem = string(v)
		case "DEVTYPE":
			ev.DevType = string(v)
		case "DEVNAME":
			// "loop3", or "/dev/loop3" on some kernels.
			ev.DevName = strings.TrimPrefix(string(v), "/dev/")
		case "DEVPATH":
			ev.DevPath = string(v)
		}
	}
	if ev.Action == "" || ev.DevPath == "" {
		return uevent{}, false
	}
	return ev, true
}

// ueventGroup is the kernel's multicast group of uevents (udev's own
// messages are on group 2).
const ueventGroup = 1

// ueventConn is an open uevent socket.
type ueventConn struct {
	f         *os.File
	closeOnce sync.Once
}

// errEventsLost: the socket's queue overflowed; events were dropped.
var errEventsLost = errors.New("uevents were lost (queue overflow)")

// openUevents subscribes to the kernel's uevents. It needs no privilege on
// Linux, but fails where netlink is not allowed (a seccomp filter, a
// sandbox) or in a network namespace that is not sent them.
func openUevents() (*ueventConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	// A larger queue makes an overflow rarer (a burst of partitions); past
	// the limit without privilege, best effort.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 1<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: ueventGroup}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uevent socket: bind: %w", err)
	}
	// Non-blocking: reads wait in the runtime's poller, and Close ends them.
	return &ueventConn{f: os.NewFile(uintptr(fd), "uevent")}, nil
}

// Close ends a read in progress; it may be called more than once.
func (c *ueventConn) Close() error {
	var err error
	c.closeOnce.Do(func() { err = c.f.Close() })
	return err
}

// read returns the next kernel uevent. Datagrams not from the kernel, and
// ones that are not uevents, are skipped. errEventsLost says some were
// dropped; the socket stays usable.
func (c *ueventConn) read(buf []byte) (uevent, error) {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return uevent{}, err
	}
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return uevent{}, err
		}
		switch {
		case errors.Is(rerr, unix.ENOBUFS):
			return uevent{}, errEventsLost
		case rerr != nil:
			return uevent{}, fmt.Errorf("reading uevents: %w", rerr)
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue // not the kernel's
		}
		if ev, ok := parseUevent(buf[:n]); ok {
			return ev, nil
		}
	}
}

// run calls fn for each uevent until ctx ends (nil) or the socket fails;
// lost events are reported to fn as a zero uevent (list everything again).
// It closes the socket when it returns.
func (c *ueventConn) run(ctx context.Context, fn func(uevent)) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	buf := make([]byte, 64<<10) // a uevent is at most a few KiB
	for {
		ev, err := c.read(buf)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, errEventsLost):
			fn(uevent{})
		case err != nil:
			return err
		default:
			fn(ev)
		}
	}
}
