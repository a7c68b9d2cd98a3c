package zonenet

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DisableOffloads turns off the transmit checksum and segmentation
// offloads of the link called link in the namespace at nsPath ("" for
// this process's), so that what it sends is whole: frames of at most its
// MTU with their checksums computed, as the VPC data path reads and
// carries them. A zone's NIC (opte0) and the guest end of a stand-in's
// veth pair need it; a QEMU tap without a virtio-net header sends whole
// frames already.
func DisableOffloads(nsPath, link string) error {
	off := func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, cmd := range []uint32{unix.ETHTOOL_STXCSUM, unix.ETHTOOL_STSO, unix.ETHTOOL_SGSO} {
			if err := ethtoolSet(fd, link, cmd, 0); err != nil && err != unix.EOPNOTSUPP {
				return fmt.Errorf("%s: ethtool command %#x: %w", link, cmd, err)
			}
		}
		return nil
	}
	if nsPath == "" {
		return off()
	}
	return RunInPath(nsPath, off)
}

// ethtoolValue is the kernel's struct ethtool_value.
type ethtoolValue struct {
	cmd, data uint32
}

// ifreqData is the kernel's struct ifreq with its union's data pointer.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(unsafe.Pointer(nil))]byte
}

func ethtoolSet(fd int, link string, cmd, value uint32) error {
	if len(link) >= unix.IFNAMSIZ {
		return unix.EINVAL
	}
	v := ethtoolValue{cmd: cmd, data: value}
	var ifr ifreqData
	copy(ifr.name[:], link)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return errno
	}
	return nil
}
