package ntpzonetest

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
	"github.com/sled-agent/sled-agent/internal/timesync/reference"
)

// StartReference runs a reference NTP server for zones to follow
// (internal/timesync/reference): a chronyd that serves its own clock at
// local stratum stratum (-x: it never sets the host's clock) on addr port
// 123, addr being on a link of the test's own (<tag>ra/<tag>rb). Both go
// when the test ends. It returns the reference's first tracking line.
func StartReference(t testing.TB, bins chrony.Binaries, tag string, addr netip.Addr, stratum int) string {
	t.Helper()
	s, err := reference.Start(t.Context(), reference.Options{Binaries: bins, Tag: tag, Addr: addr, Stratum: stratum,
		Root: t.TempDir(), Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("reference: %v", err)
		}
	})
	line, err := s.Tracking(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return line
}
