package ntpzone

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/timesync/chrony"
)

// ErrBadZone: the zone root's mark does not describe an NTP zone this
// service can run; the error says why. Restarting does not help.
var ErrBadZone = errors.New("not an NTP zone this service can run")

// markFile is the Linux zone runtime's ownership mark in the zone root
// (internal/runtime/linux, owner): JSON whose members id, name, tag and
// config (the zone's sledconfig.Zone) are read here.
const markFile = "zone.json"

// mark is what the zone runtime wrote of the zone.
type mark struct {
	Tag    string          `json:"tag"`
	ID     string          `json:"id"`
	Name   string          `json:"name"`
	Config sledconfig.Zone `json:"config"`
}

// zoneInfo is what the service runs from: the zone's identity and the
// chrony config it starts with (the servers are filled in later).
type zoneInfo struct {
	id, name, kind string
	// addr is the zone's underlay service address ([addr]:123): NTP is
	// served on it (boundary), ntp-admin on its address at AdminPort.
	addr netip.AddrPort
	base chrony.Config
	// literals are the ntp_servers that are addresses; names the rest,
	// resolved with dns (a boundary zone's dns_servers, port 53).
	literals []netip.Addr
	names    []string
	dns      []netip.AddrPort
}

// rackPrefix is the length of a rack's underlay prefix (upstream's
// RACK_PREFIX): a boundary zone serves time to the rack's zones, as
// upstream's sled-agent sets chrony-setup's allow.
const rackPrefix = 56

// readZone reads the mark in root and checks that it is an NTP zone of the
// agent tagged tag. The error wraps ErrBadZone when the mark says what this
// service cannot run.
func readZone(root, tag string, setClock bool) (zoneInfo, error) {
	data, err := os.ReadFile(filepath.Join(root, markFile))
	if err != nil {
		return zoneInfo{}, fmt.Errorf("ntp zone: reading the zone's mark: %w", err)
	}
	var m mark
	if err := json.Unmarshal(data, &m); err != nil {
		return zoneInfo{}, fmt.Errorf("%w: %s: %v", ErrBadZone, filepath.Join(root, markFile), err)
	}
	return zoneFromMark(m, root, tag, setClock)
}

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadZone, fmt.Sprintf(format, a...))
}

func zoneFromMark(m mark, root, tag string, setClock bool) (zoneInfo, error) {
	if m.Tag != tag {
		return zoneInfo{}, bad("the zone's mark is tagged %q, this service runs for %q", m.Tag, tag)
	}
	if _, err := uuid.Parse(m.ID); err != nil || len(m.ID) != 36 {
		return zoneInfo{}, bad("zone id %q is not a UUID", m.ID)
	}
	id := strings.ToLower(m.ID)
	if !strings.EqualFold(m.Config.ID, id) {
		return zoneInfo{}, bad("the mark's id %s and its config's %q differ", id, m.Config.ID)
	}
	t := m.Config.ZoneType
	z := zoneInfo{id: id, name: m.Name, kind: t.Type}
	var kind chrony.Kind
	switch t.Type {
	case "boundary_ntp":
		kind = chrony.Boundary
	case "internal_ntp":
		kind = chrony.Internal
	default:
		return zoneInfo{}, bad("zone %s is a %q zone, not boundary_ntp or internal_ntp", id, t.Type)
	}
	addr, ok := m.Config.ServiceAddr()
	if !ok || !addr.Addr().Is6() || addr.Addr().Is4In6() || addr.Addr().Zone() != "" {
		return zoneInfo{}, bad("zone %s has no underlay IPv6 address (%q)", id, t.Address)
	}
	z.addr = addr
	z.base = chrony.Config{
		Root:      root,
		Kind:      kind,
		SetClock:  setClock,
		SocketDir: chrony.SocketDir(tag, id),
	}
	if kind == chrony.Boundary {
		z.base.Address = addr.Addr()
		z.base.Port = addr.Port()
		z.base.Allow = []netip.Prefix{netip.PrefixFrom(addr.Addr(), rackPrefix).Masked()}
		if len(t.NTPServers) == 0 {
			return zoneInfo{}, bad("boundary NTP zone %s has no ntp_servers", id)
		}
		for i, s := range t.NTPServers {
			if a, err := netip.ParseAddr(s); err == nil {
				if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
					return zoneInfo{}, bad("ntp_servers[%d] %q is not a unicast address", i, s)
				}
				z.literals = appendNew(z.literals, a.Unmap())
				continue
			}
			if !validName(s) {
				return zoneInfo{}, bad("ntp_servers[%d] %q is neither an address nor a DNS name", i, s)
			}
			if !containsFold(z.names, s) {
				z.names = append(z.names, s)
			}
		}
		for i, s := range t.DNSServers {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return zoneInfo{}, bad("dns_servers[%d] %q is not an address", i, s)
			}
			z.dns = append(z.dns, netip.AddrPortFrom(a.Unmap(), 53))
		}
		if len(z.names) > 0 && len(z.dns) == 0 {
			return zoneInfo{}, bad("boundary NTP zone %s has names in ntp_servers and no dns_servers to resolve them", id)
		}
	}
	if _, _, err := chrony.Render(withPlaceholderServer(z.base)); err != nil {
		return zoneInfo{}, fmt.Errorf("%w: %w", ErrBadZone, err)
	}
	return z, nil
}

// withPlaceholderServer is c with a server, so that a boundary config can
// be checked before its servers are known.
func withPlaceholderServer(c chrony.Config) chrony.Config {
	if c.Kind == chrony.Boundary {
		c.Servers = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	}
	return c
}

func appendNew(as []netip.Addr, a netip.Addr) []netip.Addr {
	for _, x := range as {
		if x == a {
			return as
		}
	}
	return append(as, a)
}

func containsFold(ss []string, s string) bool {
	for _, x := range ss {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
