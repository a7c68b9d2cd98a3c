// Package netio is the VPC data path's I/O, below its engine: a port's
// frames, read and written on the host end of the port's link (a guest's
// tap, a service zone's NIC, a stand-in's veth) through a packet socket
// opened in that link's network namespace; and the underlay, one UDP socket
// per sled on [underlay]:6081 that sends and accepts Geneve with a zero UDP
// checksum, as OPTE and the switch do. Sockets stay in the namespace they
// were made in, so the data path reaches links of any namespace from its
// own threads. Reads and writes go through Go's poller: deadlines work and
// Close ends a blocked read.
package netio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// Port is a packet socket bound to one link: it reads every frame the link
// receives (what the guest sends), and writes frames out of it (to the
// guest). Frames this socket writes are not read back.
type Port struct {
	f    *os.File
	rc   syscall.RawConn
	link string
	mtu  int // the link's when it was opened
	// w is a second packet socket that only writes (bound to no
	// protocol, it reads nothing), blocking, so not in Go's poller: its
	// writes never wait (MSG_DONTWAIT), and the room each frame sent
	// frees in its buffer wakes no poller, as it would on a socket the
	// poller watches.
	w   *os.File
	wrc syscall.RawConn
}

// PacketSocketsPerPort is how many packet sockets a Port holds: one that
// reads the link, one that writes to it.
const PacketSocketsPerPort = 2

// htons is the protocol number as a packet socket takes it.
func htons(v uint16) uint16 { return binary.BigEndian.Uint16([]byte{byte(v), byte(v >> 8)}) }

// OpenPort opens a packet socket on the link called link in the network
// namespace at nsPath ("" for this process's): a file a namespace is
// mounted on (/run/netns/NAME) or a process's /proc/<pid>/ns/net.
func OpenPort(nsPath, link string) (*Port, error) {
	var fd, wfd, mtu int
	open := func() error {
		ifi, err := net.InterfaceByName(link)
		if err != nil {
			return fmt.Errorf("netio: link %s: %w", link, err)
		}
		mtu = ifi.MTU
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("netio: packet socket for %s: %w", link, err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			unix.Close(fd)
			return fmt.Errorf("netio: %s: PACKET_IGNORE_OUTGOING: %w", link, err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("netio: binding to %s: %w", link, err)
		}
		if wfd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			unix.Close(fd)
			return fmt.Errorf("netio: packet socket for writing to %s: %w", link, err)
		}
		if err := unix.Bind(wfd, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			unix.Close(wfd)
			return fmt.Errorf("netio: binding to %s for writing: %w", link, err)
		}
		return nil
	}
	var err error
	if nsPath == "" {
		err = open()
	} else {
		err = zonenet.RunInPath(nsPath, open)
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "packet:"+link)
	w := os.NewFile(uintptr(wfd), "packet-out:"+link)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		w.Close()
		return nil, err
	}
	wrc, err := w.SyscallConn()
	if err != nil {
		f.Close()
		w.Close()
		return nil, err
	}
	return &Port{f: f, rc: rc, link: link, mtu: mtu, w: w, wrc: wrc}, nil
}

// Link is the link's name.
func (p *Port) Link() string { return p.link }

// MTU is the link's MTU when the port was opened.
func (p *Port) MTU() int { return p.mtu }

// Read reads one frame into b and returns its length; a frame longer than
// b is cut (ErrTruncated with the bytes that fit).
func (p *Port) Read(b []byte) (int, error) {
	op := readOps.Get().(*readOp)
	op.b = b
	err := p.rc.Read(op.fn)
	n, rerr := op.n, op.err
	*op = readOp{fn: op.fn}
	readOps.Put(op)
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, fmt.Errorf("netio: reading %s: %w", p.link, rerr)
	}
	if n > len(b) {
		return len(b), ErrTruncated
	}
	return n, nil
}

// A read or a write goes through a closure with its arguments and results
// beside it, kept for the next: one made per frame would be allocated per
// frame (the poller takes it as an interface's argument).
type readOp struct {
	b   []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

var readOps = sync.Pool{New: func() any {
	op := &readOp{}
	op.fn = op.recv
	return op
}}

// recv reads one frame into op.b: recvfrom(2) with no address (the link's
// is known), MSG_TRUNC for the frame's whole length.
func (op *readOp) recv(fd uintptr) bool {
	var ptr unsafe.Pointer
	if len(op.b) > 0 {
		ptr = unsafe.Pointer(&op.b[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(ptr), uintptr(len(op.b)), unix.MSG_TRUNC, 0, 0)
	if errno != 0 {
		op.n, op.err = 0, errno
		return errno != unix.EAGAIN
	}
	op.n, op.err = int(n), nil
	return true
}

type writeOp struct {
	frame []byte
	err   error
	fn    func(fd uintptr) bool
}

var writeOps = sync.Pool{New: func() any {
	op := &writeOp{}
	op.fn = op.send
	return op
}}

// send sends op.frame, never waiting.
func (op *writeOp) send(fd uintptr) bool {
	op.err = unix.Send(int(fd), op.frame, unix.MSG_DONTWAIT)
	return true
}

// ErrTruncated is a frame longer than the buffer it was read into.
var ErrTruncated = errors.New("netio: frame longer than the buffer")

// Write sends one whole frame (destination MAC first) out of the link. It
// never waits: a link whose queue is full drops the frame (ErrBusy), as a
// switch port would.
func (p *Port) Write(frame []byte) error {
	op := writeOps.Get().(*writeOp)
	op.frame = frame
	err := p.wrc.Write(op.fn)
	werr := op.err
	*op = writeOp{fn: op.fn}
	writeOps.Put(op)
	if err != nil {
		return err
	}
	if werr == unix.EAGAIN {
		return ErrBusy
	}
	if werr != nil {
		return fmt.Errorf("netio: writing to %s: %w", p.link, werr)
	}
	return nil
}

// ErrBusy is a frame dropped because the link's queue is full.
var ErrBusy = errors.New("netio: the link's queue is full")

// SetReadDeadline bounds the reads in progress and to come.
func (p *Port) SetReadDeadline(t time.Time) error { return p.f.SetReadDeadline(t) }

// Close closes the socket; a Read in progress returns.
func (p *Port) Close() error { return errors.Join(p.f.Close(), p.w.Close()) }
