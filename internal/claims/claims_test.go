package claims_test

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/claims"
)

var (
	zoneID = "6A2A4A2E-57C3-4E3C-8C3B-1B4F0D6E8A01"
	addr   = netip.MustParseAddr("fd00:1122:3344:101::10")
	other  = netip.MustParseAddr("fd00:1122:3344:101::11")
)

func zone(id string, a netip.Addr) []claims.Claim {
	h := "zone oxz_crucible_" + id
	return []claims.Claim{{Key: claims.ID(id), Holder: h, As: "id"}, {Key: claims.Addr(a), Holder: h, As: "underlay address"}}
}

func vmm(id string, a netip.Addr) []claims.Claim {
	h := "VMM " + id
	return []claims.Claim{{Key: claims.ID(id), Holder: h, As: "id"}, {Key: claims.Addr(a), Holder: h, As: "propolis_addr"}}
}

func TestConflictsNameBothSidesAndChangeNothing(t *testing.T) {
	s := claims.New()
	if _, err := s.Claim("config", zone(zoneID, addr)); err != nil {
		t.Fatal(err)
	}
	// The id in another letter case is the same id.
	_, err := s.Claim("vmm", vmm("6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01", other))
	var ce *claims.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("claiming a held id: %v", err)
	}
	want := "VMM 6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01: id 6a2a4a2e-57c3-4e3c-8c3b-1b4f0d6e8a01 is the id of zone oxz_crucible_" + zoneID
	if err.Error() != want {
		t.Fatalf("got %q\nwant %q", err, want)
	}
	if _, _, ok := s.Holder(claims.Addr(other)); ok {
		t.Fatal("a refused claim took the key it did not collide on")
	}
	if _, err := s.Claim("vmm", vmm("00000000-0000-4000-8000-000000000001", addr)); err == nil || !errors.As(err, &ce) || ce.Held.As != "underlay address" {
		t.Fatalf("claiming a held address: %v", err)
	}
	// An owner never collides with itself.
	if _, err := s.Claim("config", zone(zoneID, addr)); err != nil {
		t.Fatal(err)
	}
}

func TestUndoKeepAndRelease(t *testing.T) {
	s := claims.New()
	old := zone(zoneID, addr)
	if _, err := s.Claim("config", old); err != nil {
		t.Fatal(err)
	}
	// A new config on top of the old one, then undone: the old one only.
	next := zone("00000000-0000-4000-8000-000000000002", other)
	undo, err := s.Claim("config", next)
	if err != nil {
		t.Fatal(err)
	}
	undo()
	if _, _, ok := s.Holder(claims.Addr(other)); ok {
		t.Fatal("undo left the new claim")
	}
	if o, _, ok := s.Holder(claims.Addr(addr)); !ok || o != "config" {
		t.Fatal("undo dropped the old claim")
	}
	// Again, and settled on the new one.
	if _, err := s.Claim("config", next); err != nil {
		t.Fatal(err)
	}
	s.Keep("config", next)
	if _, _, ok := s.Holder(claims.Addr(addr)); ok {
		t.Fatal("Keep left a claim of the old set")
	}
	if _, err := s.Claim("vmm", vmm(zoneID, addr)); err != nil {
		t.Fatalf("what the old set held is free again: %v", err)
	}
	s.Release("vmm")
	if _, _, ok := s.Holder(claims.ID(zoneID)); ok {
		t.Fatal("Release left a claim")
	}
}

func TestClaimFreeTakesWhatIsFree(t *testing.T) {
	s := claims.New()
	s.Claim("sled", []claims.Claim{{Key: claims.Addr(addr), Holder: "the sled", As: "underlay address"}})
	conflicts := s.ClaimFree("config", zone(zoneID, addr))
	if len(conflicts) != 1 || conflicts[0].Held.Holder != "the sled" {
		t.Fatalf("conflicts %v", conflicts)
	}
	if o, _, _ := s.Holder(claims.ID(zoneID)); o != "config" {
		t.Fatal("the free key was not claimed")
	}
}

// Claims racing for one key: exactly one wins, every time.
func TestRacingClaimsOneWins(t *testing.T) {
	for i := range 200 {
		s := claims.New()
		a := netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
		var wg sync.WaitGroup
		wins := make(chan string, 8)
		for j := range 8 {
			wg.Go(func() {
				owner := fmt.Sprint("owner", j)
				if _, err := s.Claim(owner, vmm(fmt.Sprintf("%08x-0000-4000-8000-000000000000", j), a)); err == nil {
					wins <- owner
				}
			})
		}
		wg.Wait()
		close(wins)
		if n := len(wins); n != 1 {
			t.Fatalf("try %d: %d owners won one address", i, n)
		}
	}
}
