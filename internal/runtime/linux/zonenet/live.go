package zonenet

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func (s *session) waitLive(ctx context.Context, hl, zl netlink.Link, underlay netip.Addr) error {
	return WaitLive(ctx, s.host, s.zone, hl, zl, underlay)
}

// WaitLive waits until an underlay pair carries traffic: both ends, hl on
// host and zl on zone, operationally up, and the zone's address underlay
// and the host end's fe80::1 each with their local route. The kernel
// finishes some of this in background work after the netlink calls that
// asked for it have returned; a service started, or a connection attempted,
// before then can lose its first packets and wait out a one-second
// retransmission. Each check is one request, not a dump.
func WaitLive(ctx context.Context, host, zone *netlink.Handle, hl, zl netlink.Link, underlay netip.Addr) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 16*time.Millisecond) {
		what, err := notLive(host, zone, hl, zl, underlay)
		if err != nil {
			return err
		}
		if what == "" {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s not live: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// notLive names the first part of the pair that does not carry traffic yet,
// or returns "".
func notLive(host, zone *netlink.Handle, hl, zl netlink.Link, underlay netip.Addr) (string, error) {
	for _, c := range []struct {
		h *netlink.Handle
		l netlink.Link
	}{{host, hl}, {zone, zl}} {
		l, err := c.h.LinkByIndex(c.l.Attrs().Index)
		if err != nil {
			return "", fmt.Errorf("looking up %s: %w", c.l.Attrs().Name, err)
		}
		if l.Attrs().OperState != netlink.OperUp {
			return c.l.Attrs().Name + " (operationally " + l.Attrs().OperState.String() + ")", nil
		}
	}
	for _, c := range []struct {
		h    *netlink.Handle
		l    netlink.Link
		addr netip.Addr
	}{{zone, zl, underlay}, {host, hl, hostLinkLocal.Addr()}} {
		local, err := isLocal(c.h, c.l, c.addr)
		if err != nil {
			return "", err
		}
		if !local {
			return fmt.Sprintf("%s on %s", c.addr, c.l.Attrs().Name), nil
		}
	}
	return "", nil
}

// isLocal reports whether the kernel routes addr, via l, to this host: its
// local route is in place. One request, not a dump of the table.
func isLocal(h *netlink.Handle, l netlink.Link, addr netip.Addr) (bool, error) {
	rs, err := h.RouteGetWithOptions(addr.AsSlice(), &netlink.RouteGetOptions{OifIndex: l.Attrs().Index})
	if err != nil {
		return false, nil // not routable yet
	}
	for _, r := range rs {
		if r.Type == unix.RTN_LOCAL {
			return true, nil
		}
	}
	return false, nil
}
