package ntpzone

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

// The sources file chrony writes (what the agent sets from the host) reads
// back as its servers and port.
func TestReadSourcesOfChronyWrite(t *testing.T) {
	for port, want := range map[uint16]uint16{0: 0, 123: 0, 4123: 4123} {
		servers := []netip.Addr{netip.MustParseAddr("fd00:1122:3344:101::21"), netip.MustParseAddr("192.0.2.1")}
		c := chrony.Config{Root: t.TempDir(), Kind: chrony.Internal, Servers: servers, ServerPort: port, Poll: &chrony.Poll{Min: -2, Max: 0}}
		if err := chrony.Write(c); err != nil {
			t.Fatal(err)
		}
		got, gotPort, err := readSources(c.Paths().Sources)
		if err != nil || !slices.Equal(got, servers) || gotPort != want {
			t.Errorf("port %d: readSources = %v, %d, %v; want %v, %d", port, got, gotPort, err, servers, want)
		}
	}
}

func TestReadSourcesMissingAndBad(t *testing.T) {
	got, port, err := readSources(t.TempDir() + "/none")
	if got != nil || port != 0 || err != nil {
		t.Errorf("missing file: %v, %d, %v", got, port, err)
	}
	path := t.TempDir() + "/s"
	os.WriteFile(path, []byte("# c\nserver fd00::1 iburst port 4123\nserver nope\nserver fd00::2 port 5\nserver fd00::3 port x\npool p\nserver fd00::4 port 4123\n"), 0o644)
	got, port, err = readSources(path)
	if want := []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::4")}; !slices.Equal(got, want) || port != 4123 {
		t.Errorf("readSources = %v, %d; want %v, 4123", got, port, want)
	}
	for _, s := range []string{":3: not an address", ":4: a port unlike", ":5: bad port"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v, want it to say %q", err, s)
		}
	}
}
