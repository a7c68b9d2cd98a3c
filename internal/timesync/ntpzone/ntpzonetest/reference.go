package ntpzonetest

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

// StartReference runs a reference NTP server for zones to follow: a
// chronyd that serves its own clock at local stratum stratum (-x: it never
// sets the host's clock) on addr port 123, addr being on a link of the
// test's own (a veth pair named <tag>ra/<tag>rb with both ends on the host:
// the kernel may have no dummy links). Both go when the test ends. It
// returns the reference's first tracking line.
func StartReference(t testing.TB, bins chrony.Binaries, tag string, addr netip.Addr, stratum int) string {
	t.Helper()
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tag + "ra"}, PeerName: tag + "rb"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(link) })
	for _, name := range []string{link.Name, link.PeerName} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ipnet := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipnet, Flags: syscall.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	d, err := chrony.New(chrony.Config{Root: t.TempDir(), Kind: chrony.Reference, Address: addr, Stratum: stratum},
		chrony.Options{Binaries: bins, Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("reference chronyd: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("reference chronyd did not stop")
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		line, err := d.Tracking(t.Context())
		if err == nil {
			return line
		}
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("reference chronyd stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("reference chronyd does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
