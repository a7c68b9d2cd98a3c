package standin

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestMain(m *testing.M) {
	RunIfAsked()
	os.Exit(m.Run())
}

// randomMAC is a guest MAC of upstream's range no other test uses, so the
// tap names (vn<mac>) are this test's own.
func randomMAC(t *testing.T) net.HardwareAddr {
	b := make([]byte, 3)
	rand.Read(b)
	return net.HardwareAddr{0xa8, 0x40, 0x25, 0xf0 | b[0]&0x0f, b[1], b[2]}
}

func tapName(mac net.HardwareAddr) string { return "vn" + strings.ReplaceAll(mac.String(), ":", "") }

// A stand-in guest's NICs are veth pairs: the host end named as the tap,
// up, with no IPv6 of its own; the guest end eth<i> with the NIC's MAC, up,
// in a namespace of the guest's own. Close leaves nothing: no host end,
// no holder process.
func TestAttachAndClose(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes links and a network namespace")
	}
	macs := []net.HardwareAddr{randomMAC(t), randomMAC(t)}
	nics := []NIC{{Tap: tapName(macs[0]), MAC: macs[0]}, {Tap: tapName(macs[1]), MAC: macs[1]}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := Attach(ctx, nics)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			n.Close()
		}
	})
	for _, nic := range nics {
		l, err := netlink.LinkByName(nic.Tap)
		if err != nil {
			t.Fatalf("host end %s: %v", nic.Tap, err)
		}
		if l.Attrs().OperState == netlink.OperDown || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("host end %s is not up: %v", nic.Tap, l.Attrs().Flags)
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + nic.Tap + "/disable_ipv6"); err == nil && strings.TrimSpace(string(b)) != "1" {
			t.Errorf("host end %s has IPv6", nic.Tap)
		}
	}
	ns, err := netns.GetFromPath(n.NetnsPath())
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	for i, nic := range nics {
		name := "eth" + string(rune('0'+i))
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("guest end %s: %v", name, err)
		}
		if l.Attrs().HardwareAddr.String() != nic.MAC.String() || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("guest end %s: MAC %s, flags %v; want %s, up", name, l.Attrs().HardwareAddr, l.Attrs().Flags, nic.MAC)
		}
	}
	h.Close()
	ns.Close()

	// A second guest with a NIC of the same tap name is refused.
	if _, err := Attach(ctx, nics[:1]); err == nil || !strings.Contains(err.Error(), "is there already") {
		t.Errorf("a second Attach of %s: %v", nics[0].Tap, err)
	}

	pid := n.PID()
	closed = true
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, nic := range nics {
		if _, err := netlink.LinkByName(nic.Tap); err == nil {
			t.Errorf("host end %s left after Close", nic.Tap)
		}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("the holder (pid %d) runs after Close", pid)
	}
}
