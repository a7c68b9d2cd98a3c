package qemu

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// OpenTap makes the tap name in the calling thread's network namespace,
// owned by uid and gid, and returns its descriptor, which QEMU is given
// (NIC.File): QEMU, unprivileged, could neither make a tap nor, where
// /dev/net/tun is root's alone, attach to one by name. The tap has no
// packet information header and no virtio-net header (IFF_NO_PI, and not
// IFF_VNET_HDR): the sled's VPC data path reads the guest's frames on the
// tap's host side, and takes them whole, each at most the MTU with its
// checksums computed, as OPTE's first phase on Linux does (VPC.md §3.2 d);
// without the header the guest is offered no checksum or segmentation
// offload. It is up: a packet socket bound to a link that is down reads
// nothing but ENETDOWN, so the data path could not take the guest's
// frames (OPTE's port is the guest's device, always up). It is not persistent: the kernel
// removes it when its last descriptor closes, which is QEMU's once the
// caller has closed its own after starting QEMU. A tap of that name
// already there (left by a VMM service that died while its QEMU ran on, or
// made persistent by someone) is deleted first; any other link of that
// name is an error. The caller runs OpenTap on a thread in QEMU's
// namespace, with CAP_NET_ADMIN.
func OpenTap(name string, uid, gid uint32) (*os.File, error) {
	if !validTap(name) {
		return nil, fmt.Errorf("tap %q: want an interface name of 1 to 15 letters, digits, '.', '_' or '-'", name)
	}
	if _, err := RemoveTap(name); err != nil {
		return nil, err
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tap %s: opening /dev/net/tun: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil {
		err = unix.IoctlSetInt(fd, unix.TUNSETOWNER, int(uid))
	}
	if err == nil {
		err = unix.IoctlSetInt(fd, unix.TUNSETGROUP, int(gid))
	}
	if err == nil {
		err = setUp(name)
	}
	if err != nil {
		unix.Close(fd) // the tap, not persistent, goes with it
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap "+name), nil
}

// RemoveTap deletes the tap name in the calling thread's network namespace,
// and says whether there was one. No link of that name is not an error;
// a link of that name that is not a tap is, and is left.
func RemoveTap(name string) (bool, error) {
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tap %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		return false, fmt.Errorf("tap %s: a %s link of that name is in the way", name, l.Type())
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return false, fmt.Errorf("tap %s: deleting it: %w", name, err)
	}
	return true, nil
}

// setUp sets the link name up.
func setUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("setting it up: %w", err)
	}
	return nil
}
