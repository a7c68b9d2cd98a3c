// Package zonenettest gives tests network namespaces of their own.
package zonenettest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
)

// Netns makes an empty network namespace named prefix plus random hex,
// removed with whatever is left in it when the test ends, and returns its
// name (for zonenet.RunIn and StartIn). It needs root and iproute2.
func Netns(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name
}

// Link is the link name in the network namespace ns, or nil if there is
// none; any other error fails the test.
func Link(t testing.TB, ns, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	err := zonenet.RunIn(ns, func() error {
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}
