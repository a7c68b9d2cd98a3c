package vpcd

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A port whose link is down (a guest's tap before anything set it up)
// waits, saying why, and attaches once the link is up: a packet socket
// bound to a link that is down reads only ENETDOWN.
func TestPortWaitsForItsLinkToComeUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes links in a namespace of its own")
	}
	d := lonelyDataPath(t)
	if d.opts.Netns == "" {
		t.Skip("needs ip(8) for a namespace of its own")
	}
	ns := strings.TrimPrefix(d.opts.Netns, "/run/netns/")
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "vnd0", "type", "veth", "peer", "name", "vnd1").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	g := guest{link: "vnd0", mac: "a8:40:25:f0:0d:01", ip: "172.30.0.5"}
	if err := d.EnsurePort("p", portSpec(t, g)); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		for _, p := range d.State().Ports {
			return p.Status
		}
		return ""
	}
	waitStatus := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(status(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("port status %q, want %q", status(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitStatus("network is down")
	for _, l := range []string{"vnd1", "vnd0"} {
		if out, err := exec.Command("ip", "-n", ns, "link", "set", l, "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set up: %v: %s", err, out)
		}
	}
	// Up, it is attached, and stays so.
	waitStatus("attached")
	time.Sleep(200 * time.Millisecond)
	if s := status(); s != "attached" {
		t.Fatalf("port status %q after it attached, want attached", s)
	}
}
