package configstore

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Claims is the sled's record of who holds which id and underlay address
// (internal/claims.Set): the ledgered config's zones hold theirs, and a
// config whose zone would take a VMM's or the sled's is refused.
type Claims interface {
	Claim(owner string, cs []claims.Claim) (undo func(), err error)
	ClaimFree(owner string, cs []claims.Claim) []*claims.ConflictError
	Keep(owner string, cs []claims.Claim)
}

// claimsOwner is the config's name as an owner of claims.
const claimsOwner = "sled config"

// UseClaims makes the store hold in c the ids and underlay addresses
// (gz_address included) of the ledgered config's zones, and refuse
// (ErrInvalid) a config with a zone that collides with what another owner
// holds. It claims the current config's at once: call it before the API
// serves. What of them another owner holds already (a config ledgered
// before collisions were checked) is returned, to be reported; the config
// stays as it is.
func (s *Store) UseClaims(c Claims) []*claims.ConflictError {
	s.commit <- struct{}{} // no Put yet can hold it long: none is served
	defer func() { <-s.commit }()
	s.claims = c
	if cur := s.current.Load(); cur != nil {
		return c.ClaimFree(claimsOwner, configClaims(cur))
	}
	return nil
}

// claim takes cfg's ids and addresses on top of the ledgered config's,
// before cfg is committed; settle(true) then leaves the config holding
// cfg's alone, settle(false) its old ones. Called in the commit slot.
func (s *Store) claim(cfg *sledconfig.Config) (settle func(committed bool), err error) {
	if s.claims == nil {
		return func(bool) {}, nil
	}
	cs := configClaims(cfg)
	undo, err := s.claims.Claim(claimsOwner, cs)
	if err != nil {
		return nil, invalidError{fmt.Errorf("invalid sled config: %w", err)}
	}
	return func(committed bool) {
		if committed {
			s.claims.Keep(claimsOwner, cs)
		} else {
			undo()
		}
	}, nil
}

// configClaims lists what cfg's zones hold, zone by zone in id order: the
// id (link names derive from it), the underlay addresses and an internal
// DNS zone's gz_address (host routes and addresses derive from them).
func configClaims(cfg *sledconfig.Config) []claims.Claim {
	zones := slices.SortedFunc(func(yield func(sledconfig.Zone) bool) {
		for _, z := range cfg.Zones {
			if !yield(z) {
				return
			}
		}
	}, func(a, b sledconfig.Zone) int { return cmp.Compare(a.ID, b.ID) })
	out := make([]claims.Claim, 0, 3*len(zones))
	for _, z := range zones {
		holder := "zone " + z.Name() + " (id " + z.ID + ")"
		out = append(out, claims.Claim{Key: claims.ID(z.ID), Holder: holder, As: "id"})
		for _, a := range z.UnderlayAddrs() {
			out = append(out, claims.Claim{Key: claims.Addr(a), Holder: holder, As: "underlay address"})
		}
		if z.ZoneType.Type == "internal_dns" {
			if a, err := netip.ParseAddr(z.ZoneType.GZAddress); err == nil {
				out = append(out, claims.Claim{Key: claims.Addr(a), Holder: holder, As: "gz_address"})
			}
		}
	}
	return out
}
