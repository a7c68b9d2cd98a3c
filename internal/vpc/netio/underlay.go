package netio

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// GenevePort is Geneve's UDP port, on which sleds and the switch's
// boundary services send and receive.
const GenevePort = 6081

// Underlay is the sled's Geneve sockets: it receives on UDP
// [underlay]:6081, accepting datagrams with a zero UDP checksum (RFC
// 6935/6936, as OPTE and the switch send; Linux drops them on an IPv6
// socket unless told), and sends as OPTE does, from the flow's hash as
// source port with checksum 0 and hop limit 128 (udpSender).
type Underlay struct {
	c   *net.UDPConn
	rc  syscall.RawConn // the socket's, for batches
	out *udpSender
}

// ListenUnderlay opens the sled's Geneve socket on addr, in the network
// namespace at nsPath ("" for this process's).
func ListenUnderlay(nsPath string, addr netip.Addr) (*Underlay, error) {
	if !addr.Is6() || addr.Is4In6() {
		return nil, fmt.Errorf("netio: underlay address %s: want IPv6", addr)
	}
	var c *net.UDPConn
	var out *udpSender
	listen := func() error {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				for _, opt := range []int{unix.UDP_NO_CHECK6_TX, unix.UDP_NO_CHECK6_RX} {
					if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, opt, 1); serr != nil {
						return
					}
				}
				// The sled's address may come to its link after the data
				// path starts (or go and come back): bind to it anyway.
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
			})
			if err != nil {
				return err
			}
			return serr
		}}
		pc, err := lc.ListenPacket(nil, "udp6", netip.AddrPortFrom(addr, GenevePort).String())
		if err != nil {
			return fmt.Errorf("netio: underlay socket on %s: %w", addr, err)
		}
		c = pc.(*net.UDPConn)
		if out, err = openUDPSender(addr); err != nil {
			c.Close()
			return err
		}
		return nil
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = zonenet.RunInPath(nsPath, listen)
	}
	if err != nil {
		return nil, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		out.Close()
		return nil, err
	}
	return &Underlay{c: c, rc: rc, out: out}, nil
}

// ReadFrom reads one datagram (a Geneve header and what it carries) and
// returns its length and sender.
func (u *Underlay) ReadFrom(b []byte) (int, netip.AddrPort, error) {
	return u.c.ReadFromUDPAddrPort(b)
}

// WriteTo sends one datagram, of payload b, from port srcPort to the sled
// or switch at dst, port 6081.
func (u *Underlay) WriteTo(b []byte, dst netip.Addr, srcPort uint16) error {
	return u.out.writeTo(b, dst, srcPort)
}

// LocalAddr is the socket's address.
func (u *Underlay) LocalAddr() netip.AddrPort { return u.c.LocalAddr().(*net.UDPAddr).AddrPort() }

// SetReadDeadline bounds the reads in progress and to come.
func (u *Underlay) SetReadDeadline(t time.Time) error { return u.c.SetReadDeadline(t) }

// Close closes the sockets.
func (u *Underlay) Close() error { return errors.Join(u.c.Close(), u.out.Close()) }
