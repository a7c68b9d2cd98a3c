// Package zonenet builds and removes the network plumbing of Linux zones: a named network namespace, veth links, addresses and routes, through netlink only.
//
// A zone's plumbing is:
//
//   - a named network namespace, bind-mounted at /run/netns/<name> as
//     `ip netns add` does, so `ip netns list` shows it;
//   - an underlay veth pair (none for a zone without an underlay address,
//     a probe's, which is its NIC alone): the host end (LinkNames) in the calling thread's
//     network namespace (the global one in production), up, holding fe80::1/64
//     and a /128 route to the zone's underlay address; the zone end
//     "underlay0" in the namespace, up, holding <underlay>/128 and a default
//     route via fe80::1;
//   - optionally a NIC veth pair (the OPTE-port analog): host end up, zone end
//     "opte0" holding the NIC's private addresses and MAC.
//
// Routes carry the protocol RouteProtocol, theirs. A route to a zone's
// underlay address that is not ours is never replaced or removed: Ensure
// refuses the zone (ErrForeignRoute) and changes nothing.
//
// Host ends carry the alias "<tag>:<zoneID>:<role>", the ownership mark that
// survives an agent restart. Nothing without the mark is ever deleted, with one
// exception written down at owns: a host end that has our exact name, no alias
// yet, and is paired with the zone end inside the zone's own namespace (a crash
// between creating the pair and setting its alias leaves exactly that).
//
// Every function works on the network namespace of the calling OS thread as
// "the host", which in the agent is the global one. Goroutines that enter a
// zone's namespace are locked to their thread and never unlock, so the thread
// is discarded rather than reused in the wrong namespace.
package zonenet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Names of the zone ends inside a zone's namespace, and link roles.
const (
	UnderlayIfName = "underlay0"
	NICIfName      = "opte0"

	RoleUnderlay = "underlay"
	RoleNIC      = "nic"
)

// loopbackIndex is the index of every network namespace's loopback.
const loopbackIndex = 1

// hostLinkLocal is the host end's address and the zone's default gateway.
var hostLinkLocal = netip.MustParsePrefix("fe80::1/64")

var (
	// ErrInvalid is wrapped by every validation failure. Retrying cannot help.
	ErrInvalid = errors.New("zonenet: invalid argument")
	// ErrNotOwned is wrapped when a link has one of this zone's names but not
	// its ownership mark: it is left alone, and Ensure cannot proceed.
	ErrNotOwned = errors.New("link has the zone's name but not its ownership mark")
	// ErrNoNetns is wrapped when a namespace that must exist does not.
	ErrNoNetns = errors.New("namespace does not exist")
)

// Config is what Ensure builds for one zone.
type Config struct {
	Netns  string // namespace name (/run/netns/<Netns>): 1–128 bytes of [A-Za-z0-9_.-], no leading dot
	Tag    string // ownership tag: 1–20 bytes of [a-z0-9-]
	ZoneID string // zone UUID, 36-character hyphenated form (compared in lower case)
	// Underlay is the zone's underlay IPv6 address. A zone without one
	// (the zero Addr), a probe's, has no underlay pair: only its NIC,
	// which it must then have.
	Underlay netip.Addr
	NIC      *NIC // optional second link: the OPTE-port analog
	// GZ, if set, is an address of the global zone (the host) in the zone's
	// /64: an internal DNS zone's gz_address. It is put, as a /64, on the
	// host end of the underlay pair, so it lives exactly as long as the
	// zone's link.
	GZ netip.Addr
}

// NIC is the zone's private-network interface.
type NIC struct {
	Addrs []netip.Prefix   // private IP(s), e.g. 172.30.2.9/32 (OPTE's model) or /24
	MAC   net.HardwareAddr // may be nil: the kernel picks one
	// Gateway, if set, is the NIC's IPv4 gateway, as OPTE's gives a zone
	// a /32: a route to it on the link and the default IPv4 route through
	// it (omicron's opte-interface-setup). The link's transmit offloads
	// are then off too, so that the data path reading its host end gets
	// whole frames.
	Gateway netip.Addr
}

// Link is a host-side link that carries a tag's ownership mark.
type Link struct {
	Name   string
	ZoneID string
	Role   string // RoleUnderlay or RoleNIC
}

// NetnsPath is where the namespace called name is bind-mounted.
func NetnsPath(name string) string { return netnsDir + "/" + name }

// LinkNames returns the host-side link names of a zone: 15 bytes each,
// derived from (tag, zoneID) alone so a restarted agent finds them again.
func LinkNames(tag, zoneID string) (underlay, nic string) {
	sum := sha256.Sum256([]byte(tag + "/" + strings.ToLower(zoneID)))
	h := hex.EncodeToString(sum[:6])
	return "ozu" + h, "ozn" + h
}

func alias(tag, zoneID, role string) string {
	return tag + ":" + strings.ToLower(zoneID) + ":" + role
}

// parseAlias splits an ownership mark; ok is false if s is not one.
func parseAlias(s string) (tag, zoneID, role string, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 || validTag(parts[0]) != nil || validZoneID(parts[1]) != nil {
		return "", "", "", false
	}
	if parts[2] != RoleUnderlay && parts[2] != RoleNIC {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

func (c Config) validate() error {
	if err := validNetns(c.Netns); err != nil {
		return err
	}
	if err := validTag(c.Tag); err != nil {
		return err
	}
	if err := validZoneID(c.ZoneID); err != nil {
		return err
	}
	u := c.Underlay
	switch {
	case !u.IsValid() && c.NIC == nil:
		return fmt.Errorf("%w: a zone without an underlay address needs a NIC", ErrInvalid)
	case !u.IsValid() && c.GZ.IsValid():
		return fmt.Errorf("%w: a global zone address needs the zone's underlay address", ErrInvalid)
	case u.IsValid() && (!u.Is6() || u.Is4In6() || u.Zone() != "" || !u.IsGlobalUnicast()):
		return fmt.Errorf("%w: underlay address %v is not a global or unique-local IPv6 unicast address", ErrInvalid, u)
	}
	if g := c.GZ; g.IsValid() && (!g.Is6() || g.Is4In6() || g.Zone() != "" || !g.IsGlobalUnicast() || g == u) {
		return fmt.Errorf("%w: global zone address %v is not a global or unique-local IPv6 unicast address other than the zone's", ErrInvalid, g)
	}
	if c.NIC == nil {
		return nil
	}
	if len(c.NIC.Addrs) == 0 {
		return fmt.Errorf("%w: NIC has no addresses", ErrInvalid)
	}
	seen := map[netip.Prefix]bool{}
	for _, p := range c.NIC.Addrs {
		a := p.Addr()
		if !p.IsValid() || a.Is4In6() || a.Zone() != "" || !a.IsGlobalUnicast() {
			return fmt.Errorf("%w: NIC address %v is not a unicast address with a prefix length", ErrInvalid, p)
		}
		if seen[p] {
			return fmt.Errorf("%w: NIC address %v given twice", ErrInvalid, p)
		}
		seen[p] = true
	}
	if m := c.NIC.MAC; m != nil && (len(m) != 6 || m[0]&1 != 0 || string(m) == "\x00\x00\x00\x00\x00\x00") {
		return fmt.Errorf("%w: NIC MAC %v is not a unicast Ethernet address", ErrInvalid, m)
	}
	return nil
}

func validNetns(s string) error {
	if len(s) == 0 || len(s) > 128 || s[0] == '.' || !only(s, "_.-", true) {
		return fmt.Errorf("%w: namespace name %q: want 1–128 bytes of [A-Za-z0-9_.-], not starting with a dot", ErrInvalid, s)
	}
	return nil
}

// validNetnsPrefix accepts "" (every namespace) or the start of a valid name.
func validNetnsPrefix(s string) error {
	if s == "" {
		return nil
	}
	return validNetns(s)
}

func validTag(s string) error {
	if len(s) == 0 || len(s) > 20 || !only(s, "-", false) {
		return fmt.Errorf("%w: tag %q: want 1–20 bytes of [a-z0-9-]", ErrInvalid, s)
	}
	return nil
}

func validZoneID(s string) error {
	ok := len(s) == 36
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			ok = c == '-'
		default:
			ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
		}
	}
	if !ok {
		return fmt.Errorf("%w: zone ID %q is not a UUID in the 36-character hyphenated form", ErrInvalid, s)
	}
	return nil
}

// only reports whether s holds nothing but digits, lower-case letters (and
// upper-case ones if upper), and bytes from extra.
func only(s, extra string, upper bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'z':
		case upper && 'A' <= c && c <= 'Z':
		case strings.IndexByte(extra, c) >= 0:
		default:
			return false
		}
	}
	return true
}

// underlayPrefix is the zone's underlay address as it holds it: a /128. The
// rest of the sled's /64 (the sled's own address, other zones) is not on the
// zone's link but behind the host end, so the zone reaches it through its
// default route; with a /64 the zone would look for those neighbours on its
// link, where nobody answers for them.
func underlayPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 128) }
