package agent

import (
	"log/slog"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/claims"
	"github.com/sled-agent/sled-agent/internal/configstore"
)

// sledClaims returns the sled's claims with its own underlay address
// claimed by the sled: no zone or VMM may take it.
func sledClaims(underlay netip.Addr) *claims.Set {
	s := claims.New()
	s.Claim("sled", []claims.Claim{{Key: claims.Addr(underlay), Holder: "the sled", As: "underlay address"}})
	return s
}

// useClaims has the config store hold the ledgered config's claims, before
// the API serves and before VMMs are resumed; a collision already ledgered
// is reported (the config stays).
func useClaims(store *configstore.Store, c *claims.Set, log *slog.Logger) {
	for _, ce := range store.UseClaims(c) {
		log.Error("the ledgered sled config collides with the sled", "err", ce)
	}
}
