package qemu

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// vhostNet is the device a NIC with Vhost needs.
const vhostNet = "/dev/vhost-net"

// openPassed opens or makes, in order, what QEMU is given (the descriptors
// of a Machine with Descriptors), for the command's ExtraFiles. The
// returned done closes what this process opened, whatever happened: call
// it once QEMU has started (QEMU holds its own copies by then) or failed
// to. A listening socket's file stays when its descriptor is closed, so
// that it can be dialled while QEMU listens.
func openPassed(pass []passed) (files []*os.File, done func(), err error) {
	var opened []*os.File
	done = func() {
		for _, f := range opened {
			f.Close()
		}
		opened = nil
	}
	for _, p := range pass {
		var f *os.File
		switch {
		case p.file != nil:
			f = p.file
		case p.socket:
			f, err = listen(p.path)
		default:
			f, err = openFile(p.path, p.write, p.device)
		}
		if err != nil {
			done()
			return nil, func() {}, fmt.Errorf("%s: %w", p.what, err)
		}
		if p.file == nil {
			opened = append(opened, f)
		}
		files = append(files, f)
	}
	return files, done, nil
}

// openFile opens path for QEMU: read and write, or read only. A file that
// is not a regular file (a device, unless device says it is one) is
// refused, as QEMU's file driver refuses it; O_NONBLOCK, cleared once it
// is open, keeps a FIFO from blocking the open.
func openFile(path string, write, device bool) (*os.File, error) {
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	switch {
	case err != nil:
	case device && st.Mode&unix.S_IFMT != unix.S_IFCHR:
		err = fmt.Errorf("%s is not a character device", path)
	case !device && st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("%s is not a regular file", path)
	default:
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// listen makes a unix socket listening at path (whatever was there is
// removed) and returns its descriptor; the socket's file stays when the
// descriptor is closed.
func listen(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stale socket: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File() // a copy of the descriptor
	l.Close()
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return f, nil
}
