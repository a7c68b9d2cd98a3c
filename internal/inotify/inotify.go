// Package inotify watches one directory's entries with the kernel's
// inotify, for the parts of the agent that follow what comes and goes in a
// directory (network namespaces, vdev files).
package inotify

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"iter"
	"os"

	"golang.org/x/sys/unix"
)

// Watch watches the directory path for the events in mask (unix.IN_*;
// IN_ONLYDIR is added). The watch is non-blocking, so its reads wait in
// Go's poller and closing it ends them.
func Watch(path string, mask uint32) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, mask|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify on %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), "inotify:"+path), nil
}

// BufferSize holds 64 events with the longest names.
const BufferSize = 64 * (unix.SizeofInotifyEvent + unix.NAME_MAX + 1)

// Event is one event read from a watch: its mask and the entry's name (""
// for events of the directory itself or of the queue).
type Event struct {
	Mask uint32
	Name string
}

// Events yields the events in b, what one read from a watch returned; a
// truncated last event is yielded with what of its name there is.
func Events(b []byte) iter.Seq[Event] {
	return func(yield func(Event) bool) {
		for len(b) >= unix.SizeofInotifyEvent {
			mask := binary.NativeEndian.Uint32(b[4:8])
			size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:16]))
			name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:min(size, len(b))], "\x00"))
			b = b[min(size, len(b)):]
			if !yield(Event{Mask: mask, Name: name}) {
				return
			}
		}
	}
}
