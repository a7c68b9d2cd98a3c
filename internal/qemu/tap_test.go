package qemu

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet/zonenettest"
)

// The service makes a NIC's tap, owned by QEMU's user, in place of one
// left behind; QEMU, unprivileged and in another namespace, is given it;
// the tap goes when QEMU does. A link of the name that is not a tap is
// left, and said.
func TestOpenTap(t *testing.T) {
	needQEMU(t)
	uid, gid := nobody(t)
	ns := zonenettest.Netns(t, "qtap-")
	const name = "vntest0"

	// Left behind: a persistent tap of root's, as a crashed service or
	// another tool might leave.
	if err := zonenet.RunIn(ns, func() error {
		return netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI})
	}); err != nil {
		t.Fatal(err)
	}
	if l, ok := zonenettest.Link(t, ns, name).(*netlink.Tuntap); !ok || l.NonPersist || l.Owner == uid {
		t.Fatalf("left-behind tap %+v", zonenettest.Link(t, ns, name))
	}

	m := tcgMachine(t)
	m.Descriptors, m.Sandbox = true, true
	m.NICs = []NIC{{ID: "net0", Kind: VirtioNet, PCI: PCIPath{0, 8, 0}, MAC: "a8:40:25:f0:00:07", Tap: name}}
	if err := zonenet.RunIn(ns, func() error {
		var err error
		m.NICs[0].File, err = OpenTap(name, uid, gid)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tap, ok := zonenettest.Link(t, ns, name).(*netlink.Tuntap)
	if !ok {
		t.Fatalf("link %s: %+v, want a tap", name, zonenettest.Link(t, ns, name))
	}
	if tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Owner != uid || tap.Group != gid || !tap.NonPersist ||
		tap.Flags&netlink.TUNTAP_VNET_HDR != 0 || tap.Flags&netlink.TUNTAP_NO_PI == 0 {
		t.Errorf("tap: mode %d, owner %d, group %d, not persistent %v, flags %#x; want a tap of %d:%d, not persistent, no vnet_hdr, no_pi",
			tap.Mode, tap.Owner, tap.Group, tap.NonPersist, tap.Flags, uid, gid)
	}
	if tap.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("tap flags %v: want it up, for the data path's packet socket", tap.Attrs().Flags)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, m, startAs(uid, gid))
	m.NICs[0].File.Close() // QEMU holds the tap alone now
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(context.Background()) })
	var info string
	if err := p.Monitor().Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info network"}, &info); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "net0: index=0,type=tap,fd=") || !strings.Contains(info, "macaddr=a8:40:25:f0:00:07") {
		t.Errorf("info network: %q", info)
	}
	if zonenettest.Link(t, ns, name) == nil {
		t.Fatal("the tap went while QEMU runs")
	}
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); zonenettest.Link(t, ns, name) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tap outlived QEMU")
		}
	}
	if err := zonenet.RunIn(ns, func() error {
		if gone, err := RemoveTap(name); gone || err != nil {
			t.Errorf("RemoveTap of no tap = %v, %v", gone, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A veth of the name is no tap of ours.
	if err := zonenet.RunIn(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			return err
		}
		if f, err := OpenTap(name, uid, gid); err == nil || !strings.Contains(err.Error(), "a veth link of that name is in the way") {
			f.Close()
			t.Errorf("OpenTap over a veth = %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := zonenettest.Link(t, ns, name).(*netlink.Veth); !ok {
		t.Errorf("the veth was not left")
	}
}
