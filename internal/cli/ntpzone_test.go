package cli

import (
	"strings"
	"testing"
)

// The ntp-zone command refuses a zone root it cannot serve, before it
// listens or starts anything.
func TestNTPZoneRefuses(t *testing.T) {
	sled(t, "ntp-zone", "--listen", "127.0.0.1:0").failed(t, "root")
	sled(t, "ntp-zone", "--root", t.TempDir()).failed(t, "listen")
	sled(t, "ntp-zone", "--listen", "127.0.0.1:0", "--root", t.TempDir()).failed(t, "reading the zone's mark")
}

func TestNTPZoneIsHidden(t *testing.T) {
	r := sled(t, "--help").ok(t)
	if strings.Contains(r.stdout, "ntp-zone") {
		t.Errorf("help lists the hidden ntp-zone command:\n%s", r.stdout)
	}
	r = sled(t, "ntp-zone", "--help").ok(t)
	for _, f := range []string{"--listen", "--root", "--tag", "--no-clock"} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("ntp-zone --help lacks %s:\n%s", f, r.stdout)
		}
	}
}
