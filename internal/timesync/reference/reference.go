// Package reference runs a reference NTP server on this host for NTP zones
// to follow when there is no real one: a chronyd serving its own clock at a
// local stratum, with -x, so it never sets the host's clock. It is what the
// time-sync tests and the Linux development sled (sled-agent dev --runtime
// linux) give their NTP zones in place of the rack's upstream NTP servers.
package reference

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

// MaxTagLen is the longest tag a reference's link names take: a link name
// is at most 15 bytes, and the tag gets two.
const MaxTagLen = 13

// Options say where the reference serves and how.
type Options struct {
	// Binaries are chronyd and chronyc; zero is chrony.Find's.
	Binaries chrony.Binaries
	// Tag names the reference's link: a veth pair <tag>ra/<tag>rb with both
	// ends on the host (the kernel may have no dummy links), which holds
	// Addr. A link of those names is taken as a leftover of an earlier
	// reference of the same tag and replaced.
	Tag string
	// Addr is the address it serves on, port 123.
	Addr netip.Addr
	// Stratum is the stratum it claims (1 to 15).
	Stratum int
	// Root is chronyd's directory (its config, drift, socket).
	Root string
	// Log gets chronyd's messages; nil discards them.
	Log *slog.Logger
	// ReadyTimeout bounds the wait for chronyd to answer (0: 20s).
	ReadyTimeout time.Duration
}

// Server is a running reference. Close stops it.
type Server struct {
	link   netlink.Link
	d      *chrony.Daemon
	cancel context.CancelFunc
	errc   chan error
}

// stopTimeout bounds chronyd's stop in Close.
const stopTimeout = 30 * time.Second

// Start makes the reference's link and address and runs chronyd on it, and
// returns once chronyd answers chronyc (its first tracking line is
// Tracking's). On error nothing of it is left.
func Start(ctx context.Context, o Options) (s *Server, err error) {
	if o.Tag == "" || len(o.Tag) > MaxTagLen {
		return nil, fmt.Errorf("reference: tag %q: want 1 to %d bytes", o.Tag, MaxTagLen)
	}
	if !o.Addr.IsValid() {
		return nil, errors.New("reference: no address")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	d, err := chrony.New(chrony.Config{Root: o.Root, Kind: chrony.Reference, Address: o.Addr, Stratum: o.Stratum},
		chrony.Options{Binaries: o.Binaries, Log: o.Log})
	if err != nil {
		return nil, err
	}
	link, err := addLink(o.Tag, o.Addr)
	if err != nil {
		return nil, err
	}
	s = &Server{link: link, d: d, errc: make(chan error, 1)}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.errc <- d.Run(runCtx) }()
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	wait, cancelWait := context.WithTimeout(ctx, cmpDuration(o.ReadyTimeout, 20*time.Second))
	defer cancelWait()
	for {
		_, terr := d.Tracking(wait)
		if terr == nil {
			return s, nil
		}
		select {
		case rerr := <-s.errc:
			s.errc <- rerr
			return nil, fmt.Errorf("reference: chronyd stopped: %w", rerr)
		case <-wait.Done():
			return nil, fmt.Errorf("reference: chronyd does not answer: %w", terr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// addLink makes the veth pair <tag>ra/<tag>rb, up, with addr on the first.
func addLink(tag string, addr netip.Addr) (netlink.Link, error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tag + "ra"}, PeerName: tag + "rb"}
	if old, err := netlink.LinkByName(veth.Name); err == nil {
		// An earlier reference of this tag, not stopped (its process
		// killed): ours by name.
		if err := netlink.LinkDel(old); err != nil {
			return nil, fmt.Errorf("reference: removing the leftover link %s: %w", veth.Name, err)
		}
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("reference: adding link %s: %w", veth.Name, err)
	}
	fail := func(err error) (netlink.Link, error) {
		netlink.LinkDel(veth)
		return nil, fmt.Errorf("reference: link %s: %w", veth.Name, err)
	}
	for _, name := range []string{veth.Name, veth.PeerName} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			return fail(err)
		}
	}
	ipnet := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: ipnet, Flags: syscall.IFA_F_NODAD}); err != nil {
		return fail(err)
	}
	return veth, nil
}

// Tracking is chronyd's tracking line (chrony.Daemon.Tracking).
func (s *Server) Tracking(ctx context.Context) (string, error) { return s.d.Tracking(ctx) }

// Close stops chronyd and removes the link. It may be called more than
// once.
func (s *Server) Close() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	var err error
	select {
	case err = <-s.errc:
	case <-time.After(stopTimeout):
		err = fmt.Errorf("reference: chronyd did not stop within %s", stopTimeout)
	}
	if lerr := netlink.LinkDel(s.link); lerr != nil {
		err = errors.Join(err, fmt.Errorf("reference: removing link %s: %w", s.link.Attrs().Name, lerr))
	}
	return err
}
