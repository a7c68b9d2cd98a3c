package btrfs

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// mountTable is this process's /proc/self/mountinfo, parsed, read again
// only when the kernel says the table changed since the last read (a poll
// of the open file reports POLLPRI after any mount or unmount): with
// hundreds of pools and zones' namespaces mounted, each read is tens of
// kilobytes, and every dataset call asks where its pool is mounted.
//
// A change made between the poll and the read is in what is read, and is
// reported again by the next poll: the table is never older than the
// kernel's at the moment of the call. Reading /proc never waits on a disk.
type mountTable struct {
	mu     sync.Mutex
	fd     int     // guarded by mu; -1 until opened
	mounts []mount // guarded by mu; valid while fd >= 0
	buf    []byte  // guarded by mu; the last read
}

var mountinfo = mountTable{fd: -1}

// current returns the mount table as it is now.
func (t *mountTable) current() ([]mount, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd >= 0 {
		fds := []unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLPRI}}
		n, err := unix.Poll(fds, 0)
		if err == nil && n == 0 {
			return t.mounts, nil
		}
	} else {
		fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("mountinfo: %w", err)
		}
		t.fd = fd
	}
	data, err := t.read()
	if err != nil {
		unix.Close(t.fd)
		t.fd, t.mounts = -1, nil
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	t.mounts = parseMountinfo(data)
	return t.mounts, nil
}

// read reads the whole table from its start.
func (t *mountTable) read() ([]byte, error) {
	t.buf = t.buf[:0]
	for off := int64(0); ; {
		if len(t.buf) == cap(t.buf) {
			t.buf = append(t.buf, make([]byte, max(64<<10, cap(t.buf)))...)[:len(t.buf)]
		}
		n, err := unix.Pread(t.fd, t.buf[len(t.buf):cap(t.buf)], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return t.buf, nil
		}
		t.buf = t.buf[:len(t.buf)+n]
		off += int64(n)
	}
}
