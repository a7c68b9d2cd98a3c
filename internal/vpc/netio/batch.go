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
	// The first added, its destination and source port: one alone goes
	// by send(2) or sendmsg(2), cheaper than sendmmsg.
	first     []byte
	firstDst  netip.Addr
	firstPort uint16
	hdrs      []unix.Mmsghdr
	iovs      []unix.Iovec // two per message: a datagram's headers, then what it carries
	names     []unix.RawSockaddrInet6
	heads     [][sendHeadersLen]byte
	n         int // added
	sent      int // sent or given up on
	drop      bool
	err       error
	fn        func(fd uintptr) bool
}

// NewWrites makes a batch of up to count.
func NewWrites(count int) *Writes {
	w := &Writes{hdrs: make([]unix.Mmsghdr, count), iovs: make([]unix.Iovec, 2*count), names: make([]unix.RawSockaddrInet6, count),
		heads: make([][sendHeadersLen]byte, count)}
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
		w.iovs[2*i], w.iovs[2*i+1] = unix.Iovec{}, unix.Iovec{}
		w.hdrs[i] = unix.Mmsghdr{}
	}
	w.n, w.sent, w.err = 0, 0, nil
	w.first, w.firstDst, w.firstPort = nil, netip.Addr{}, 0
}

// Add adds a frame for a port's link. The batch must not be full.
func (w *Writes) Add(frame []byte) {
	i := w.n
	w.n++
	if i == 0 {
		w.first = frame
	}
	iov := &w.iovs[2*i]
	if len(frame) > 0 {
		iov.Base = &frame[0]
	}
	iov.SetLen(len(frame))
	h := &w.hdrs[i].Hdr
	h.Iov = iov
	h.SetIovlen(1)
}

// AddDatagram adds a datagram of payload b (a Geneve header and what it
// carries) for u's underlay, from port srcPort to the sled or switch at
// dst, port 6081. The batch must not be full. A datagram whose headers
// cannot be written (a payload longer than a datagram holds, an address
// not IPv6) is not added.
func (w *Writes) AddDatagram(u *Underlay, b []byte, dst netip.Addr, srcPort uint16) error {
	if !dst.Is6() || dst.Is4In6() {
		return fmt.Errorf("netio: a Geneve datagram to %s: want IPv6", dst)
	}
	i := w.n
	if err := u.out.putHeaders(&w.heads[i], srcPort, len(b)); err != nil {
		return err
	}
	w.Add(b)
	if i == 0 {
		w.firstDst, w.firstPort = dst, srcPort
	}
	w.iovs[2*i+1] = w.iovs[2*i]
	w.iovs[2*i] = unix.Iovec{Base: &w.heads[i][0]}
	w.iovs[2*i].SetLen(sendHeadersLen)
	h := &w.hdrs[i].Hdr
	h.SetIovlen(2)
	// A raw socket's destination port is 0: the ports are in the header.
	w.names[i] = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.As16()}
	h.Name = (*byte)(unsafe.Pointer(&w.names[i]))
	h.Namelen = unix.SizeofSockaddrInet6
	// The kernel only reads the source it gives: one for every message.
	h.Control = &u.out.pktinfo[0]
	h.SetControllen(len(u.out.pktinfo))
	return nil
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
		return u.WriteTo(w.first, w.firstDst, w.firstPort)
	}
	if err := w.write(u.out.rc, false); err != nil {
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
