package netio

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reads is a batch of buffers that one system call fills (recvmmsg(2)):
// as many frames or datagrams as were waiting, up to its count. A Reads is
// one goroutine's; what it read is valid until its next read.
type Reads struct {
	bufs     [][]byte
	headroom int
	hdrs     []unix.Mmsghdr
	iovs     []unix.Iovec
	n        int
	err      error
	fn       func(fd uintptr) bool
	// single is whether the next read takes one frame by recvfrom(2),
	// cheaper than recvmmsg(2) for one: frames that come one at a time,
	// each waited for, are read so; once one is found already waiting,
	// the reads take batches until a batch holds one.
	single bool
	tries  int // calls of fn in this read
}

// NewReads makes count buffers of headroom+size bytes, each read into
// after its first headroom bytes.
func NewReads(count, size, headroom int) *Reads {
	r := &Reads{bufs: make([][]byte, count), headroom: headroom, hdrs: make([]unix.Mmsghdr, count), iovs: make([]unix.Iovec, count)}
	for i := range count {
		r.bufs[i] = make([]byte, headroom+size)
		r.iovs[i].Base = &r.bufs[i][headroom]
		r.iovs[i].SetLen(size)
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
	}
	r.fn = r.recv
	r.single = true
	return r
}

// Len is how many the last read filled.
func (r *Reads) Len() int { return r.n }

// Buf is the i-th buffer whole, headroom first.
func (r *Reads) Buf(i int) []byte { return r.bufs[i] }

// Size is the length of what the i-th buffer holds (after its headroom),
// and whether it was cut: a frame longer than the buffer (truncated), of
// which the buffer holds the start.
func (r *Reads) Size(i int) (n int, truncated bool) {
	n = int(r.hdrs[i].Len)
	if room := len(r.bufs[i]) - r.headroom; n > room {
		return room, true
	}
	return n, false
}

// recv is recvmmsg(2) with no addresses, MSG_TRUNC for each frame's whole
// length, waiting for none after the first.
func (r *Reads) recv(fd uintptr) bool {
	r.tries++
	if r.single {
		b := r.bufs[0][r.headroom:]
		n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_TRUNC, 0, 0)
		if errno != 0 {
			r.n, r.err = 0, errno
			return errno != unix.EAGAIN
		}
		r.hdrs[0].Len = uint32(n)
		r.n, r.err = 1, nil
		return true
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)),
		unix.MSG_TRUNC|unix.MSG_WAITFORONE, 0, 0)
	if errno != 0 {
		r.n, r.err = 0, errno
		return errno != unix.EAGAIN
	}
	r.n, r.err = int(n), nil
	return true
}

func (r *Reads) read(rc syscall.RawConn) error {
	r.tries = 0
	if err := rc.Read(r.fn); err != nil {
		return err
	}
	if r.single {
		r.single = r.tries > 1
	} else {
		r.single = r.n == 1
	}
	return r.err
}

// ReadBatch reads into r the frames waiting on the link, at least one (it
// waits for it).
func (p *Port) ReadBatch(r *Reads) error {
	if err := r.read(p.rc); err != nil {
		return fmt.Errorf("netio: reading %s: %w", p.link, err)
	}
	return nil
}

// ReadBatch reads into r the datagrams waiting, at least one (it waits for
// it). Their senders are not read.
func (u *Underlay) ReadBatch(r *Reads) error {
	if err := r.read(u.rc); err != nil {
		return fmt.Errorf("netio: reading the underlay: %w", err)
	}
	return nil
}

// Writes is a batch of frames or datagrams that one system call sends
// (sendmmsg(2)). A Writes is one goroutine's; it holds the slices added
// until Reset.
type Writes struct {
	first    []byte     // the first added, and its destination: one alone
	firstDst netip.Addr // goes by send(2) or sendto(2), cheaper than sendmmsg
	hdrs     []unix.Mmsghdr
	iovs     []unix.Iovec
	names    []unix.RawSockaddrInet6
	n        int // added
	sent     int // sent or given up on
	drop     bool
	err      error
	fn       func(fd uintptr) bool
}

// NewWrites makes a batch of up to count.
func NewWrites(count int) *Writes {
	w := &Writes{hdrs: make([]unix.Mmsghdr, count), iovs: make([]unix.Iovec, count), names: make([]unix.RawSockaddrInet6, count)}
	w.fn = w.send
	return w
}

// Len is how many were added since the last Reset.
func (w *Writes) Len() int { return w.n }

// Full is whether no more can be added.
func (w *Writes) Full() bool { return w.n == len(w.hdrs) }

// Reset empties the batch.
func (w *Writes) Reset() {
	for i := range w.n {
		w.iovs[i] = unix.Iovec{}
		w.hdrs[i] = unix.Mmsghdr{}
	}
	w.n, w.sent, w.err = 0, 0, nil
	w.first, w.firstDst = nil, netip.Addr{}
}

// Add adds b, to go to dst (a datagram to the sled or switch at dst, port
// 6081; for a port's frames, dst is not used). The batch must not be full.
func (w *Writes) Add(b []byte, dst netip.Addr) {
	i := w.n
	w.n++
	if i == 0 {
		w.first, w.firstDst = b, dst
	}
	if len(b) > 0 {
		w.iovs[i].Base = &b[0]
	}
	w.iovs[i].SetLen(len(b))
	h := &w.hdrs[i].Hdr
	h.Iov = &w.iovs[i]
	h.SetIovlen(1)
	if dst.IsValid() {
		w.names[i] = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: htons(GenevePort), Addr: dst.As16()}
		h.Name = (*byte)(unsafe.Pointer(&w.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
	}
}

// send is sendmmsg(2) of what is left. A message the kernel refuses is
// given up on (its error kept: the first) and the rest sent; a full socket
// buffer waits for room, or, with drop, gives up the rest.
func (w *Writes) send(fd uintptr) bool {
	for w.sent < w.n {
		m, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&w.hdrs[w.sent])), uintptr(w.n-w.sent),
			unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EAGAIN && w.drop:
			w.err = cmpErr(w.err, ErrBusy)
			w.sent = w.n
		case errno == unix.EAGAIN:
			return false
		case errno != 0:
			w.err = cmpErr(w.err, errno)
			w.sent++
		default:
			w.sent += int(m)
		}
	}
	return true
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

func (w *Writes) write(rc syscall.RawConn, drop bool) error {
	w.drop = drop
	if err := rc.Write(w.fn); err != nil {
		return err
	}
	return w.err
}

// WriteBatch sends w's datagrams, each to its sled or switch, waiting for
// room in the socket's buffer as WriteTo does; one refused (no route, too
// big) does not keep the others from going, and its error is returned.
// Then w is empty.
func (u *Underlay) WriteBatch(w *Writes) error {
	defer w.Reset()
	switch w.n {
	case 0:
		return nil
	case 1:
		return u.WriteTo(w.first, w.firstDst)
	}
	if err := w.write(u.rc, false); err != nil {
		return fmt.Errorf("netio: writing to the underlay: %w", err)
	}
	return nil
}

// WriteBatch sends w's frames out of the link. It never waits: what the
// link's full queue does not take is dropped (ErrBusy), as Write drops it.
// Then w is empty.
func (p *Port) WriteBatch(w *Writes) error {
	defer w.Reset()
	switch w.n {
	case 0:
		return nil
	case 1:
		return p.Write(w.first)
	}
	err := w.write(p.wrc, true)
	if errors.Is(err, ErrBusy) {
		return ErrBusy
	}
	if err != nil {
		return fmt.Errorf("netio: writing to %s: %w", p.link, err)
	}
	return nil
}
