package propolisapi

import (
	"context"
	"errors"
	"sync"
)

// DefaultBufferSize is how much of a console's output a Buffer keeps at
// each end: the first and the most recent mebibyte, as upstream's serial
// history does.
const DefaultBufferSize = 1 << 20

// ErrNoInput is returned by a Buffer's Write when it was made without an
// input writer.
var ErrNoInput = errors.New("serial console takes no input")

// closedChan is returned by Notify when there is something to read already.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Buffer is a Console's output side, ready-made: a backend feeds it the
// guest's output with Append and it keeps, as upstream's serial history
// does, the first size bytes ever written and the most recent size bytes,
// with absolute offsets. Between the two, once more than twice size has
// been written, bytes are gone. Input goes to the write func it was made
// with. It is safe for concurrent use; no call waits on another but for the
// copying of bytes.
type Buffer struct {
	write func(ctx context.Context, p []byte) (int, error)
	size  int

	mu sync.Mutex
	// The fields below are guarded by mu.
	head   []byte        // the first bytes ever written, up to size
	ring   []byte        // the most recent bytes: offset o is at ring[o%size]
	end    uint64        // total bytes written
	closed bool          // no more output is expected
	wake   chan struct{} // closed and replaced when output comes or the buffer closes
	waited bool          // someone holds wake
}

var _ Console = (*Buffer)(nil)

// NewBuffer returns a buffer that keeps size bytes at each end of the
// output (DefaultBufferSize when size ≤ 0) and sends input to write (nil:
// the console takes no input, Write fails with ErrNoInput).
func NewBuffer(size int, write func(ctx context.Context, p []byte) (int, error)) *Buffer {
	if size <= 0 {
		size = DefaultBufferSize
	}
	return &Buffer{
		write: write,
		size:  size,
		head:  make([]byte, 0, size),
		ring:  make([]byte, size),
		wake:  make(chan struct{}),
	}
}

// Append records output of the guest and wakes those waiting for it.
// Output appended after Close is still recorded.
func (b *Buffer) Append(p []byte) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := min(b.size-len(b.head), len(p)); n > 0 {
		b.head = append(b.head, p[:n]...)
	}
	// Only the last size bytes of p can stay in the ring.
	off := b.end
	q := p
	if len(q) > b.size {
		off += uint64(len(q) - b.size)
		q = q[len(q)-b.size:]
	}
	for len(q) > 0 {
		i := int(off % uint64(b.size))
		n := copy(b.ring[i:], q)
		q = q[n:]
		off += uint64(n)
	}
	b.end += uint64(len(p))
	b.wakeLocked()
}

// Close marks the end of the output: every Notify channel is closed from
// now on. Close is idempotent.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.wakeLocked()
	}
}

// wakeLocked closes the channel handed to waiters, if any holds it.
func (b *Buffer) wakeLocked() {
	if b.waited {
		close(b.wake)
		b.wake = make(chan struct{})
		b.waited = false
	}
}

// Read returns up to max bytes from absolute offset from, and the offset
// of the first of them. Bytes from the first part of the output run to its
// end and, while the two parts still touch, on into the recent part. When
// from falls between the parts, the bytes start at the recent part: start
// is then past from. When from is past the end, there is nothing and start
// is End.
func (b *Buffer) Read(from uint64, max int) (data []byte, start uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	headEnd := uint64(len(b.head))
	ringStart := b.end - min(b.end, uint64(b.size))
	switch {
	case from >= b.end:
		return nil, b.end
	case from < headEnd:
		start = from
	case from < ringStart:
		start = ringStart // the bytes from `from` on are gone
	default:
		start = from
	}
	if max <= 0 {
		return nil, start
	}
	want := min(uint64(max), b.end-start)
	data = make([]byte, 0, want)
	off := start
	if off < headEnd {
		n := min(want, headEnd-off)
		data = append(data, b.head[off:off+n]...)
		off += n
		if off < ringStart {
			// The rest of the first part is all there is before a gap.
			return data, start
		}
	}
	for uint64(len(data)) < want {
		i := off % uint64(b.size)
		n := min(want-uint64(len(data)), uint64(b.size)-i)
		data = append(data, b.ring[i:i+n]...)
		off += n
	}
	return data, start
}

// End is the offset one past the last byte written.
func (b *Buffer) End() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.end
}

// Notify returns a channel that is closed once output past offset exists
// or the buffer is closed; it is closed already if either holds.
func (b *Buffer) Notify(offset uint64) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.end > offset || b.closed {
		return closedChan
	}
	b.waited = true
	return b.wake
}

// Write sends input to the guest through the buffer's write func.
func (b *Buffer) Write(ctx context.Context, p []byte) (int, error) {
	if b.write == nil {
		return 0, ErrNoInput
	}
	return b.write(ctx, p)
}
