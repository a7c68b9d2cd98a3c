package probes

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// A probe's zone on Linux: its namespace and its NIC's host end, named
// from the sled's prefix and tag; listed by its sled only; made again it
// is kept; removed, nothing is left.
func TestNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and links")
	}
	b := make([]byte, 3)
	rand.Read(b)
	tag := "zt" + hex.EncodeToString(b)
	n := Namespaces{Prefix: tag + "-", Tag: tag}
	other := Namespaces{Prefix: tag + "-", Tag: tag + "x"} // another sled's view of the same names
	z, err := ZoneFor(probe(idA, "172.30.0.9"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Remove(t.Context(), idA) })
	if err := n.Ensure(t.Context(), z); err != nil {
		t.Fatal(err)
	}
	netns, link := n.Where(idA)
	if netns != zonenet.NetnsPath(tag+"-oxz_probe_"+idA) || !zonenet.NetnsExists(tag+"-oxz_probe_"+idA) {
		t.Errorf("the zone's namespace %s", netns)
	}
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatalf("the NIC's host end %s: %v", link, err)
	}
	if ids, err := n.List(t.Context()); err != nil || !slices.Equal(ids, []string{idA}) {
		t.Errorf("List = %v, %v", ids, err)
	}
	if ids, err := other.List(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("another tag's List = %v, %v; want nothing", ids, err)
	}
	if err := n.Ensure(t.Context(), z); err != nil {
		t.Fatal(err)
	}
	if again, err := netlink.LinkByName(link); err != nil || again.Attrs().Index != l.Attrs().Index {
		t.Errorf("Ensure again made the NIC again: %v", err)
	}
	done, err := n.RemoveAll(t.Context())
	if err != nil || len(done) != 1 {
		t.Errorf("RemoveAll = %v, %v", done, err)
	}
	namespaces, links, err := zonenet.List(tag+"-", tag)
	if err != nil || len(namespaces) != 0 || len(links) != 0 {
		t.Errorf("left: %v %v %v", namespaces, links, err)
	}
}
