// Package boundary is the switch's boundary services data path, simulated,
// as dendrite's sidecar.p4 does it for a rack: packets a sled sends to the
// switch's tunnel endpoint (Geneve, VNI not 0, the boundary services VNI 99
// from OPTE) are decapsulated and their inner IP packet routed out of the
// switch's external side; packets arriving there are matched against the
// switch's NAT table (destination address, and TCP or UDP destination port
// or ICMP echo identifier) and encapsulated to the sled the entry names,
// with the entry's VNI, its MAC as the inner destination and the External
// option, so that the sled's data path knows them from outside.
//
// It runs in the switch's network namespace: the tunnel endpoint is a UDP
// socket on [tep]:6081, the external side a packet socket on the external
// link (what arrives there) and raw IP sockets (what leaves: the kernel of
// the switch's namespace routes the inner packet and resolves its next
// hop). The namespace must not forward IP itself (the default), or the
// kernel would route what the NAT table takes.
//
// Where it differs from the switch: it sends from [tep]:6081, not from ::,
// with a zero UDP checksum whatever the inner protocol (the switch computes
// one for inner TCP and UDP; receivers take both); it ignores inner packets
// that are not IPv4 or IPv6 with a transport OPTE carries.
package boundary

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/dpd"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// NATTable is the switch's NAT table: the target of the entry holding an
// address and port (dpdsim.Server's Lookup).
type NATTable interface {
	Lookup(ip netip.Addr, port uint16) (dpd.NatTarget, bool)
}

// Options place the data path.
type Options struct {
	// Netns is the switch's network namespace (a path; "" for this
	// process's).
	Netns string
	// TEP is the switch's tunnel endpoint address, on its underlay side.
	TEP netip.Addr
	// External is the name of the switch's external link.
	External string
	NAT      NATTable
	Log      *slog.Logger
}

// Stats count what the data path did.
type Stats struct {
	// Egress: inner packets sent out of the external side; Ingress:
	// packets from outside encapsulated to a sled.
	Egress, Ingress uint64
	// NoEntry: packets from outside no NAT entry holds; Dropped: packets
	// neither way could take (not Geneve, VNI 0, no IP inside, …).
	NoEntry, Dropped uint64
}

// Switch is a running boundary services data path.
type Switch struct {
	opts     Options
	underlay *netio.Underlay
	ext      *netio.Port
	raw4     int
	raw6     int
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	egress, ingress, noEntry, dropped atomic.Uint64
}

// Start opens the switch's sockets and runs the data path until Close.
func Start(opts Options) (s *Switch, err error) {
	if opts.NAT == nil {
		return nil, errors.New("boundary: no NAT table")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s = &Switch{opts: opts, raw4: -1, raw6: -1}
	defer func() {
		if err != nil {
			s.closeSockets()
		}
	}()
	if s.underlay, err = netio.ListenUnderlay(opts.Netns, opts.TEP); err != nil {
		return nil, err
	}
	if s.ext, err = netio.OpenPort(opts.Netns, opts.External); err != nil {
		return nil, err
	}
	openRaw := func() error {
		var err error
		if s.raw4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
			return fmt.Errorf("boundary: raw IPv4 socket: %w", err)
		}
		// IPPROTO_RAW sends the header given, for IPv6 as for IPv4.
		if s.raw6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
			return fmt.Errorf("boundary: raw IPv6 socket: %w", err)
		}
		return nil
	}
	if opts.Netns == "" {
		err = openRaw()
	} else {
		err = zonenet.RunInPath(opts.Netns, openRaw)
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.egressLoop(ctx) }()
	go func() { defer s.wg.Done(); s.ingressLoop(ctx) }()
	return s, nil
}

// Stats is what the data path did so far.
func (s *Switch) Stats() Stats {
	return Stats{Egress: s.egress.Load(), Ingress: s.ingress.Load(), NoEntry: s.noEntry.Load(), Dropped: s.dropped.Load()}
}

// Close stops the data path and closes its sockets.
func (s *Switch) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	s.closeSockets()
	s.wg.Wait()
	return nil
}

func (s *Switch) closeSockets() {
	if s.underlay != nil {
		s.underlay.Close()
	}
	if s.ext != nil {
		s.ext.Close()
	}
	for _, fd := range []*int{&s.raw4, &s.raw6} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// egressLoop takes what sleds send to the tunnel endpoint out of the
// external side.
func (s *Switch) egressLoop(ctx context.Context) {
	buf := make([]byte, 1<<16)
	var d wire.Decap
	var f wire.Frame
	for ctx.Err() == nil {
		n, from, err := s.underlay.ReadFrom(buf)
		if err != nil {
			if ctx.Err() == nil {
				s.opts.Log.Warn("boundary: reading the tunnel endpoint", "err", err)
			}
			return
		}
		pkt := buf[:n]
		if err := wire.DecapGeneve(pkt, &d); err != nil || d.Geneve.VNI == 0 {
			s.dropped.Add(1)
			s.opts.Log.Debug("boundary: not Geneve to boundary services", "from", from, "err", err)
			continue
		}
		inner := d.Inner(pkt)
		if err := wire.Parse(inner, &f); err != nil || !f.HasL4 {
			s.dropped.Add(1)
			continue
		}
		ip := inner[f.L3Off:f.End]
		if err := s.sendOut(ip, f.DstIP); err != nil {
			s.dropped.Add(1)
			s.opts.Log.Debug("boundary: sending out", "dst", f.DstIP, "err", err)
			continue
		}
		s.egress.Add(1)
	}
}

// sendOut sends the IP packet ip (header included) to dst through the
// switch namespace's routes.
func (s *Switch) sendOut(ip []byte, dst netip.Addr) error {
	if dst.Is4() {
		return unix.Sendto(s.raw4, ip, 0, &unix.SockaddrInet4{Addr: dst.As4()})
	}
	return unix.Sendto(s.raw6, ip, 0, &unix.SockaddrInet6{Addr: dst.As16()})
}

// ingressLoop takes what arrives on the external side to the sled its NAT
// entry names.
func (s *Switch) ingressLoop(ctx context.Context) {
	buf := make([]byte, 1<<16)
	out := make([]byte, 128+1<<16) // the Geneve header and options, then the frame
	var f wire.Frame
	for ctx.Err() == nil {
		n, err := s.ext.Read(buf)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, netio.ErrTruncated) {
				s.opts.Log.Warn("boundary: reading the external link", "err", err)
				return
			}
			continue
		}
		frame := buf[:n]
		if wire.Parse(frame, &f) != nil || (f.L3 != wire.L3IPv4 && f.L3 != wire.L3IPv6) || !f.HasL4 {
			continue // ARP, neighbour discovery: the kernel's
		}
		port, ok := natPort(&f)
		if !ok {
			s.dropped.Add(1)
			continue
		}
		t, ok := s.opts.NAT.Lookup(f.DstIP, port)
		if !ok {
			s.noEntry.Add(1)
			continue
		}
		e := wire.SwitchEncap(t.VNI, t.InternalIP, f.Proto)
		e.UDPChecksum = false // sent through a socket with zero checksums
		// The inner frame, after room for the Geneve header: the target's
		// MAC, source 0, the IP packet.
		ipPkt := frame[f.L3Off:f.End]
		hl := e.GeneveHeaderLen()
		inner := out[hl : hl+14+len(ipPkt)]
		wire.PutEthernet(inner, wire.MAC(t.InnerMAC), wire.MAC{}, f.EtherType)
		copy(inner[14:], ipPkt)
		m, err := e.EncapGeneve(out, inner)
		if err != nil {
			s.dropped.Add(1)
			continue
		}
		if err := s.underlay.WriteTo(out[:m], t.InternalIP, e.SrcPort); err != nil {
			s.dropped.Add(1)
			s.opts.Log.Debug("boundary: sending to the sled", "sled", t.InternalIP, "err", err)
			continue
		}
		s.ingress.Add(1)
	}
}

// natPort is what the switch matches a packet's NAT entry by, besides its
// destination: the TCP or UDP destination port, or the ICMP echo
// identifier (sidecar.p4).
func natPort(f *wire.Frame) (uint16, bool) {
	switch f.Proto {
	case wire.ProtoTCP, wire.ProtoUDP:
		return f.DstPort, true
	case wire.ProtoICMP, wire.ProtoICMPv6:
		if f.IsEcho {
			return f.EchoID, true
		}
	}
	return 0, false
}
