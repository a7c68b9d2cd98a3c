package configstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/configstore"
	"github.com/sled-agent/sled-agent/internal/ledger"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// vmmAt claims id and addr for a VMM in c.
func vmmAt(t *testing.T, c *claims.Set, id, addr string) error {
	t.Helper()
	h := "VMM " + id
	_, err := c.Claim("vmm "+id, []claims.Claim{
		{Key: claims.ID(id), Holder: h, As: "id"},
		{Key: claims.Addr(netip.MustParseAddr(addr)), Holder: h, As: "propolis_addr"},
	})
	return err
}

func TestPutCollidingWithAVMMChangesNothing(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound}
	s := configstore.Open(l, nil, nil, configstore.Options{})
	c := claims.New()
	s.UseClaims(c)
	ctx := context.Background()
	if err := s.Put(ctx, doc(2, 1)); err != nil { // zone 0 at fd00:1122:3344:101::10
		t.Fatal(err)
	}
	if err := vmmAt(t, c, sledconfigtest.ZoneID(1), "fd00:1122:3344:101::99"); err != nil {
		t.Fatal(err)
	}
	err := s.Put(ctx, doc(3, 2)) // zone 1's id is the VMM's
	if !errors.Is(err, configstore.ErrInvalid) || !strings.Contains(err.Error(), "is the id of VMM "+sledconfigtest.ZoneID(1)) {
		t.Fatalf("a zone with a VMM's id: %v", err)
	}
	if got := l.committed(); fmt.Sprint(got) != "[2]" || s.Current().Generation != 2 {
		t.Fatalf("commits %v, current %d", got, s.Current().Generation)
	}
	// What the refused config claimed on top of the ledgered one is free
	// again; the ledgered one still holds its own.
	if err := vmmAt(t, c, "00000000-3333-4000-8000-000000000000", "fd00:1122:3344:101::11"); err != nil {
		t.Fatalf("the refused config's address stayed claimed: %v", err)
	}
	if err := vmmAt(t, c, "00000000-4444-4000-8000-000000000000", "fd00:1122:3344:101::10"); err == nil {
		t.Fatal("the ledgered config's zone lost its address")
	}
}

func TestPutNotLedgeredReleasesItsClaims(t *testing.T) {
	l := &fakeLedger{readErr: ledger.ErrNotFound, commitErr: fmt.Errorf("disk gone: %w", ledger.ErrNoCopyWritten)}
	s := configstore.Open(l, nil, nil, configstore.Options{})
	c := claims.New()
	s.UseClaims(c)
	if err := s.Put(context.Background(), doc(1, 1)); !errors.Is(err, configstore.ErrUnavailable) {
		t.Fatalf("err %v", err)
	}
	if err := vmmAt(t, c, sledconfigtest.ZoneID(0), "fd00:1122:3344:101::10"); err != nil {
		t.Fatalf("a config that was not ledgered kept its claims: %v", err)
	}
}

func TestUseClaimsTakesTheLedgeredConfigs(t *testing.T) {
	l := &fakeLedger{rec: ledger.Record{Generation: 7, Data: doc(7, 2)}}
	s := configstore.Open(l, nil, nil, configstore.Options{})
	c := claims.New()
	// The sled holds zone 1's address already: a collision ledgered before
	// collisions were checked is reported, and the rest is claimed.
	c.Claim("sled", []claims.Claim{{Key: claims.Addr(netip.MustParseAddr("fd00:1122:3344:101::11")), Holder: "the sled", As: "underlay address"}})
	conflicts := s.UseClaims(c)
	if len(conflicts) != 1 || !strings.Contains(conflicts[0].Error(), "is the underlay address of the sled") {
		t.Fatalf("conflicts %v", conflicts)
	}
	if err := vmmAt(t, c, sledconfigtest.ZoneID(0), "fd00:1122:3344:101::99"); err == nil {
		t.Fatal("the ledgered config's zone id is not claimed")
	}
	if s.Current().Generation != 7 {
		t.Fatal("the ledgered config was dropped")
	}
}
