package netio

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// udpSender sends the sled's Geneve as OPTE does: from the sled's address
// and the flow's hash as UDP source port (so that the underlay's ECMP
// spreads the sled's flows), to port 6081, with UDP checksum 0 and hop
// limit 128. A UDP socket sends from its own port, so this is a raw IPv6
// socket of protocol UDP, to which the UDP header is written (the kernel
// adds the IPv6 header, and no checksum to a raw socket's UDP).
//
// A raw socket is handed a copy of every UDP packet for its address. So
// that the sled's Geneve is not copied to it, it is bound to the loopback
// address, which the sled's Geneve never goes to, and each datagram says
// its source, the sled's address (IPV6_PKTINFO); a filter drops what comes
// to it all the same. (A socket that writes the IPv6 header itself,
// IPPROTO_RAW, is handed nothing, but the kernel makes a route for each
// of its packets to an on-link destination: slower.)
type udpSender struct {
	f       *os.File
	rc      syscall.RawConn
	pktinfo []byte // the control message that gives the source
}

// sendHeadersLen is the length of the header a sender writes before a
// Geneve payload: UDP's.
const sendHeadersLen = wire.UDPLen

// maxPayload is the most a UDP datagram over IPv6 (without jumbograms)
// carries.
const maxPayload = 1<<16 - 1 - wire.UDPLen

// openUDPSender opens the sender of the sled at src, in this thread's
// network namespace.
func openUDPSender(src netip.Addr) (*udpSender, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("netio: the Geneve sender's raw socket: %w", err)
	}
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	for _, set := range []func() error{
		func() error {
			return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &drop[0]})
		},
		func() error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0) },
		func() error {
			return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, wire.OPTEHopLimit)
		},
		// What does not fit the link is refused, not fragmented: OPTE
		// does not fragment what it encapsulates either.
		func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1) },
		// The loopback link may be down in the sled's namespace.
		func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1) },
		func() error { return unix.Bind(fd, &unix.SockaddrInet6{Addr: netip.IPv6Loopback().As16()}) },
	} {
		if err := set(); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("netio: the Geneve sender's raw socket: %w", err)
		}
	}
	f := os.NewFile(uintptr(fd), "geneve-sender")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	pktinfo := make([]byte, unix.CmsgSpace(unix.SizeofInet6Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&pktinfo[0]))
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	(*unix.Inet6Pktinfo)(unsafe.Pointer(&pktinfo[unix.CmsgLen(0)])).Addr = src.As16()
	return &udpSender{f: f, rc: rc, pktinfo: pktinfo}, nil
}

// putHeaders writes the UDP header of a Geneve datagram of payload n bytes
// from srcPort to port 6081, checksum 0.
func (s *udpSender) putHeaders(h *[sendHeadersLen]byte, srcPort uint16, n int) error {
	if n > maxPayload {
		return fmt.Errorf("netio: a Geneve datagram of %d bytes: %w", n, unix.EMSGSIZE)
	}
	_, err := wire.PutUDP(h[:], srcPort, GenevePort, n)
	return err
}

// sendOp is one datagram's sendmsg(2): its headers, buffers and address,
// and the function the socket's Write calls, made once and kept in a pool
// so that a send allocates nothing.
type sendOp struct {
	heads [sendHeadersLen]byte
	iovs  [2]unix.Iovec
	name  unix.RawSockaddrInet6
	msg   unix.Msghdr
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

var sendOps = sync.Pool{New: func() any {
	op := &sendOp{}
	op.fn = op.send
	return op
}}

func (op *sendOp) send(fd uintptr) bool {
	_, _, op.errno = unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&op.msg)), 0)
	return op.errno != unix.EAGAIN
}

// writeTo sends one datagram of payload b from srcPort to [dst]:6081,
// waiting for room in the socket's buffer.
func (s *udpSender) writeTo(b []byte, dst netip.Addr, srcPort uint16) error {
	op := sendOps.Get().(*sendOp)
	defer func() {
		*op = sendOp{fn: op.fn}
		sendOps.Put(op)
	}()
	if !dst.Is6() || dst.Is4In6() {
		return fmt.Errorf("netio: a Geneve datagram to %s: want IPv6", dst)
	}
	if err := s.putHeaders(&op.heads, srcPort, len(b)); err != nil {
		return err
	}
	op.iovs[0] = unix.Iovec{Base: &op.heads[0]}
	op.iovs[0].SetLen(sendHeadersLen)
	if len(b) > 0 {
		op.iovs[1] = unix.Iovec{Base: &b[0]}
		op.iovs[1].SetLen(len(b))
	}
	// A raw socket's destination port is 0: the ports are in the header.
	op.name = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.As16()}
	op.msg.Name = (*byte)(unsafe.Pointer(&op.name))
	op.msg.Namelen = unix.SizeofSockaddrInet6
	op.msg.Iov = &op.iovs[0]
	op.msg.SetIovlen(2)
	op.msg.Control = &s.pktinfo[0]
	op.msg.SetControllen(len(s.pktinfo))
	if err := s.rc.Write(op.fn); err != nil {
		return err
	}
	if op.errno != 0 {
		return op.errno
	}
	return nil
}

func (s *udpSender) Close() error { return s.f.Close() }
