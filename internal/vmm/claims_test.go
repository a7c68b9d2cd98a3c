package vmm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/simguest"
)

func TestRegisterCollidingWithAZoneIsRefused(t *testing.T) {
	c := claims.New()
	zone := "zone oxz_crucible_" + vmmID + " (id " + vmmID + ")"
	c.Claim("sled config", []claims.Claim{{Key: claims.ID(vmmID), Holder: zone, As: "id"}})
	dir := t.TempDir()
	e := newEnv(t, simguest.Options{}, vmm.Options{Claims: c, RecordDirs: recordDirs(dir)})
	_, err := e.m.Register(vmmID, registration())
	if !errors.Is(err, vmm.ErrCollision) || !strings.Contains(err.Error(), "is the id of "+zone) {
		t.Fatalf("registering with a zone's id: %v", err)
	}
	if _, err := e.m.Get(vmmID); !errors.Is(err, vmm.ErrNotFound) {
		t.Fatalf("a refused VMM is known: %v", err)
	}
	for _, d := range recordDirs(dir) {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Fatalf("a refused VMM left %d files in %s", len(ents), d)
		}
	}
	if _, _, ok := c.Holder(claims.Addr(registration().PropolisAddr.Addr())); ok {
		t.Fatal("a refused VMM holds its address")
	}
}

func TestUnregisterReleasesResumeClaims(t *testing.T) {
	c := claims.New()
	dir := t.TempDir()
	e := newEnv(t, simguest.Options{}, vmm.Options{Claims: c, RecordDirs: recordDirs(dir)})
	e.register()
	addr := claims.Addr(registration().PropolisAddr.Addr())
	if owner, _, ok := c.Holder(addr); !ok || !strings.HasPrefix(owner, "vmm ") {
		t.Fatalf("a registered VMM does not hold its address: %q %v", owner, ok)
	}
	e.waitState("starting")

	// A new manager on the same state dir (an agent restart) claims the
	// VMM again.
	e.m.Close()
	c2 := claims.New()
	m2 := vmm.New(e.rt, vmm.InProcessHost{}, vmm.Options{Claims: c2, RecordDirs: recordDirs(dir), Identity: testIdentity})
	t.Cleanup(m2.Close)
	if n, err := m2.Resume(); n != 1 || err != nil {
		t.Fatalf("Resume: %d, %v", n, err)
	}
	if _, _, ok := c2.Holder(claims.ID(vmmID)); !ok {
		t.Fatal("a resumed VMM does not hold its id")
	}
	if _, err := m2.Unregister(context.Background(), vmmID); err != nil {
		t.Fatal(err)
	}
	for _, k := range []claims.Key{claims.ID(vmmID), addr} {
		if _, _, ok := c2.Holder(k); ok {
			t.Fatalf("%s still held after unregister", k)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "a", vmmID+".json")); !os.IsNotExist(err) {
		t.Fatalf("record after unregister: %v", err)
	}
}
