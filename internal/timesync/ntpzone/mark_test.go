package ntpzone

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

const testID = "3c3a8e4b-6d4f-4c6e-9a51-2c0f3e2b9a11"

func boundaryMark() mark {
	return mark{Tag: "sled-agent", ID: testID, Name: "oxz_ntp_" + testID, Config: sledconfig.Zone{
		ID: testID,
		ZoneType: sledconfig.ZoneType{
			Type:       "boundary_ntp",
			Address:    "[fd00:1122:3344:101::21]:123",
			NTPServers: []string{"0.pool.ntp.org", "192.0.2.10", "ntp.example.com", "0.POOL.ntp.org", "2001:db8::7b", "192.0.2.10"},
			DNSServers: []string{"1.1.1.1", "2001:db8::53"},
		},
	}}
}

func writeMark(t *testing.T, m mark) string {
	t.Helper()
	root := t.TempDir()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, markFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestReadZoneBoundary(t *testing.T) {
	root := writeMark(t, boundaryMark())
	z, err := readZone(root, "sled-agent", false)
	if err != nil {
		t.Fatal(err)
	}
	if z.id != testID || z.kind != "boundary_ntp" || z.name != "oxz_ntp_"+testID || z.addr.String() != "[fd00:1122:3344:101::21]:123" {
		t.Errorf("zone %+v", z)
	}
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::7b")}; !slices.Equal(z.literals, want) {
		t.Errorf("literals %v, want %v", z.literals, want)
	}
	if want := []string{"0.pool.ntp.org", "ntp.example.com"}; !slices.Equal(z.names, want) {
		t.Errorf("names %v, want %v", z.names, want)
	}
	if want := []netip.AddrPort{netip.MustParseAddrPort("1.1.1.1:53"), netip.MustParseAddrPort("[2001:db8::53]:53")}; !slices.Equal(z.dns, want) {
		t.Errorf("dns %v, want %v", z.dns, want)
	}
	b := z.base
	if b.Kind != chrony.Boundary || b.Root != root || b.SetClock || b.Address != netip.MustParseAddr("fd00:1122:3344:101::21") || b.Port != 123 ||
		b.SocketDir != chrony.SocketDir("sled-agent", testID) || !slices.Equal(b.Allow, []netip.Prefix{netip.MustParsePrefix("fd00:1122:3344:100::/56")}) {
		t.Errorf("chrony config %+v", b)
	}
}

func TestReadZoneInternal(t *testing.T) {
	m := mark{Tag: "zt1", ID: strings.ToUpper(testID), Name: "oxz_ntp_" + testID, Config: sledconfig.Zone{
		ID: testID, ZoneType: sledconfig.ZoneType{Type: "internal_ntp", Address: "[fd00:1122:3344:101::22]:123"},
	}}
	z, err := readZone(writeMark(t, m), "zt1", true)
	if err != nil {
		t.Fatal(err)
	}
	if z.id != testID || z.base.Kind != chrony.Internal || !z.base.SetClock || z.base.Address.IsValid() || len(z.names)+len(z.literals) != 0 ||
		z.base.SocketDir != "/run/sled-agent-ntp/zt1-"+testID {
		t.Errorf("zone %+v", z)
	}
}

// What the service cannot run is refused with a reason, as ErrBadZone.
func TestReadZoneRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*mark)
		tag  string
		want string
	}{
		{"another agent's", func(*mark) {}, "other", `tagged "sled-agent"`},
		{"not NTP", func(m *mark) { m.Config.ZoneType.Type = "crucible" }, "", `"crucible" zone`},
		{"bad id", func(m *mark) { m.ID = "x" }, "", "not a UUID"},
		{"ids differ", func(m *mark) { m.Config.ID = "5e9c1a2b-8f3d-4b6e-a7c1-0d2e4f6a8b9c" }, "", "differ"},
		{"IPv4 address", func(m *mark) { m.Config.ZoneType.Address = "192.0.2.1:123" }, "", "no underlay IPv6"},
		{"no servers", func(m *mark) { m.Config.ZoneType.NTPServers = nil }, "", "no ntp_servers"},
		{"bad server", func(m *mark) { m.Config.ZoneType.NTPServers = []string{"a b"} }, "", `"a b" is neither`},
		{"multicast server", func(m *mark) { m.Config.ZoneType.NTPServers = []string{"ff02::101"} }, "", "not a unicast"},
		{"names, no DNS", func(m *mark) { m.Config.ZoneType.DNSServers = nil }, "", "no dns_servers"},
		{"bad DNS server", func(m *mark) { m.Config.ZoneType.DNSServers = []string{"dns.example"} }, "", `dns_servers[0] "dns.example"`},
	} {
		m := boundaryMark()
		c.edit(&m)
		_, err := readZone(writeMark(t, m), cmpOr(c.tag, "sled-agent"), true)
		if !errors.Is(err, ErrBadZone) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrBadZone saying %q", c.name, err, c.want)
		}
	}
	if _, err := readZone(t.TempDir(), "sled-agent", true); err == nil || errors.Is(err, ErrBadZone) {
		t.Errorf("no mark: %v, want an error that is not ErrBadZone", err)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
