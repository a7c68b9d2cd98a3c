package sledconfig

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a sled config.
type Problem struct {
	// Path is the JSON path of the offending value, e.g.
	// zones["470fbf4d-…"].zone_type.nic.mac; empty for the document itself.
	Path    string
	Message string
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// ValidationError is what Validate returns: every problem it found.
type ValidationError struct {
	Problems []Problem
	// malformed counts the problems with the document itself (a missing
	// field, a value that does not parse, a generation upstream cannot
	// hold), as opposed to values that are well formed but that no runtime
	// can realise (a loopback address, port 0, an address two zones share).
	malformed int
}

// WellFormed reports whether every problem is a well-formed value that no
// runtime can realise: the document itself means something definite, and
// the zones without problems can be realised. A config ledgered before a
// rule was added may fail it this way (see configstore).
func (e *ValidationError) WellFormed() bool { return e.malformed == 0 }

// maxProblemsInMessage bounds how many problems Error spells out.
const maxProblemsInMessage = 50

// Error joins the problems into one message: "invalid sled config: 2
// problems: <path>: <message>; <path>: <message>". Past the first
// maxProblemsInMessage it only counts them.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid sled config: ")
	if len(e.Problems) == 1 {
		b.WriteString("1 problem: ")
	} else {
		fmt.Fprintf(&b, "%d problems: ", len(e.Problems))
	}
	for i, p := range e.Problems {
		if i == maxProblemsInMessage {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// ValidateOptions say what Validate knows of the sled beyond the config.
type ValidateOptions struct {
	// SledUnderlay is the sled's own underlay address, which no zone may
	// hold and no internal DNS zone may take as its gz_address (the agent
	// would take it off the sled with the zone); zones' addresses must be
	// ones upstream allocates to this sled (subnet.go). Zero: not checked.
	SledUnderlay netip.Addr
}

// Validate is ValidateWith without knowledge of the sled.
func Validate(c *Config) error { return ValidateWith(c, ValidateOptions{}) }

// ValidateWith checks what a config means, as far as this agent can tell
// without looking at the sled beyond opts: ids, the generation, zone types
// and their fields, addresses (which must be ones a zone can hold, not shared,
// not the sled's, and in the sled's subnet or, for internal DNS, the
// internal DNS subnets), NICs, pool names, image sources, disks and datasets
// (see validate_storage.go). It returns nil or a
// *ValidationError listing every problem found, in a stable order.
func ValidateWith(c *Config, opts ValidateOptions) error {
	var v validator
	if c == nil {
		v.add("", "config is missing")
		return v.err()
	}
	v.requiredTopLevel(c)
	v.generation(c.Generation)
	v.disks(c.diskItems())
	v.datasets(c.datasetItems())
	keys := c.sortedZoneKeys()
	// The addresses of every zone, read once for the checks across zones
	// below.
	addrs := make([]zoneAddrs, len(keys))
	var underlay []netip.Addr
	for i, key := range keys {
		z := c.Zones[key]
		v.zone(key, &z)
		start := len(underlay)
		underlay = appendUnderlayAddrs(underlay, &z.ZoneType)
		addrs[i] = zoneAddrs{key: key, underlay: underlay[start:len(underlay):len(underlay)]}
		addrs[i].gz, addrs[i].hasGZ = gzAddress(&z)
	}
	v.zoneCaseDuplicates(keys)
	owner := v.sharedUnderlay(c.Zones, addrs, len(underlay))
	v.gzAddresses(c.Zones, addrs, owner)
	if opts.SledUnderlay.IsValid() {
		v.sledUnderlay(c.Zones, addrs, opts.SledUnderlay)
		v.sledSubnet(c.Zones, addrs, opts.SledUnderlay)
	}
	return v.err()
}

// sortedZoneKeys returns the keys of c.Zones, sorted: the ones Parse
// found, if they are still its keys.
func (c *Config) sortedZoneKeys() []string {
	if len(c.zoneKeys) == len(c.Zones) {
		same := true
		for _, key := range c.zoneKeys {
			if _, ok := c.Zones[key]; !ok {
				same = false
				break
			}
		}
		if same {
			return c.zoneKeys
		}
	}
	return slices.Sorted(maps.Keys(c.Zones))
}

// zoneAddrs are the addresses of a zone the checks across zones compare.
type zoneAddrs struct {
	key string
	// underlay are the zone's UnderlayAddrs.
	underlay []netip.Addr
	// gz is an internal DNS zone's gz_address, if it has one that parses.
	gz    netip.Addr
	hasGZ bool
}

type validator struct {
	problems  []Problem
	malformed int
}

// add records a problem with the document itself.
func (v *validator) add(path, format string, args ...any) {
	v.problems = append(v.problems, Problem{Path: path, Message: fmt.Sprintf(format, args...)})
	v.malformed++
}

// unrealisable records a well-formed value that no runtime can realise.
func (v *validator) unrealisable(path, format string, args ...any) {
	v.problems = append(v.problems, Problem{Path: path, Message: fmt.Sprintf(format, args...)})
}

func (v *validator) err() error {
	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: v.problems, malformed: v.malformed}
}

// MaxGeneration is the largest generation upstream accepts: omicron's
// Generation is kept in a signed 64-bit database column, so it refuses to
// deserialize anything above i64::MAX. A config at MaxGeneration can never
// be followed by another, as upstream's Generation::next would overflow.
const MaxGeneration = math.MaxInt64

// generation checks the generation against upstream's bound. It counts as
// malformed: upstream would not even decode such a config, and a config
// ledgered above the bound could never be replaced by one the control plane
// can send.
func (v *validator) generation(g uint64) {
	if g > MaxGeneration {
		v.add("generation", "%d is larger than the largest generation, %d (upstream keeps generations in a signed 64-bit integer)", g, uint64(MaxGeneration))
	}
}

func zonePath(key string) string { return keyPath("zones", key) }

// keyPath is the path of a member of an id-keyed map: field["key"], the key
// quoted as %q quotes it.
func keyPath(field, key string) string {
	for i := range len(key) {
		if c := key[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return field + "[" + strconv.Quote(key) + "]"
		}
	}
	return field + "[\"" + key + "\"]"
}

// requiredTopLevel checks that a parsed document had the fields upstream
// requires. A config built in code cannot tell absent from empty, so it is
// not checked.
func (v *validator) requiredTopLevel(c *Config) {
	for _, f := range c.missing {
		v.add(f, "is required")
	}
}

func (v *validator) zone(key string, z *Zone) {
	w := where{field: "zones", key: key}
	switch {
	case z.ID == "":
		v.add(w.at(".id"), "is required")
	case !isUUID(z.ID):
		v.add(w.at(".id"), "%q is not a UUID (want the 36-character hyphenated form)", z.ID)
	case z.ID != key:
		v.add(w.at(".id"), "%q does not match its key %q", z.ID, key)
	}
	if z.FilesystemPool != nil {
		v.zpool(w, ".filesystem_pool", *z.FilesystemPool)
	}
	if is := z.ImageSource; is != nil {
		v.imageSource(w.in(".image_source"), is)
	}
	v.zoneType(w.in(".zone_type"), &z.ZoneType)
}

// zoneCaseDuplicates reports zone keys that differ only in letter case:
// zone names use the lowercased id, so such zones would share a name.
func (v *validator) zoneCaseDuplicates(keys []string) {
	v.caseDuplicates("zones", len(keys), func(i int) string { return keys[i] }, func(prev, lower string) string {
		return fmt.Sprintf("zone id differs from zone %q only in letter case (both would be named oxz_…_%s)", prev, lower)
	})
}

// caseDuplicates reports each key of the id-keyed map field (n keys,
// distinct and sorted, key(i) the ith) that differs from an earlier one
// only in letter case, saying what why says of it (prev: the earlier key;
// lower: both lowercased).
func (v *validator) caseDuplicates(field string, n int, key func(int) string, why func(prev, lower string) string) {
	fold := false
	for i := 0; i < n && !fold; i++ {
		fold = mayFold(key(i))
	}
	if !fold {
		return
	}
	first := make(map[string]string, n)
	for i := range n {
		k := key(i)
		lower := strings.ToLower(k)
		if prev, ok := first[lower]; ok {
			v.add(keyPath(field, k), "%s", why(prev, lower))
			continue
		}
		first[lower] = k
	}
}

// sharedUnderlay reports underlay addresses held by more than one zone
// (addrs: the zones', in key order, n underlay addresses in all), and
// returns the zone (key) that holds each first.
func (v *validator) sharedUnderlay(zones map[string]Zone, addrs []zoneAddrs, n int) map[netip.Addr]string {
	owner := make(map[netip.Addr]string, n)
	for i := range addrs {
		z := &addrs[i]
		for _, a := range z.underlay {
			if prev, ok := owner[a]; ok {
				v.unrealisable(zonePath(z.key)+".zone_type."+underlayField(zones[z.key].ZoneType, a),
					"underlay address %s is also used by zone %q", a, prev)
				continue
			}
			owner[a] = z.key
		}
	}
	return owner
}

// gzAddresses reports an internal DNS zone's gz_address that is a zone's
// underlay address (its own or another's; owner: the zone holding each
// first) or another DNS zone's gz_address: the agent puts it on the host
// end of the zone's link and takes it away with the zone, so the other
// holder would lose it.
func (v *validator) gzAddresses(zones map[string]Zone, addrs []zoneAddrs, owner map[netip.Addr]string) {
	var gzOwner map[netip.Addr]string
	for i := range addrs {
		z := &addrs[i]
		if !z.hasGZ {
			continue
		}
		gz := z.gz
		path := zonePath(z.key) + ".zone_type.gz_address"
		switch prev, shared := owner[gz]; {
		case shared && prev == z.key:
			v.unrealisable(path, "%s is also this zone's own %s", gz, underlayField(zones[z.key].ZoneType, gz))
		case shared:
			v.unrealisable(path, "%s is the underlay address of zone %q", gz, prev)
		}
		if prev, ok := gzOwner[gz]; ok {
			v.unrealisable(path, "%s is also the gz_address of zone %q", gz, prev)
			continue
		}
		if gzOwner == nil {
			gzOwner = make(map[netip.Addr]string)
		}
		gzOwner[gz] = z.key
	}
}

// sledUnderlay reports zones that would take the sled's own underlay
// address: as an underlay address, or as an internal DNS zone's gz_address.
func (v *validator) sledUnderlay(zones map[string]Zone, addrs []zoneAddrs, sled netip.Addr) {
	for i := range addrs {
		z := &addrs[i]
		for _, a := range z.underlay {
			if a == sled {
				v.unrealisable(zonePath(z.key)+".zone_type."+underlayField(zones[z.key].ZoneType, a),
					"underlay address %s is the sled's own underlay address", a)
			}
		}
		if z.hasGZ && z.gz == sled {
			v.unrealisable(zonePath(z.key)+".zone_type.gz_address", "%s is the sled's own underlay address", z.gz)
		}
	}
}

// gzAddress is an internal DNS zone's gz_address, if it parses.
func gzAddress(z *Zone) (netip.Addr, bool) {
	if z.ZoneType.Type != "internal_dns" || z.ZoneType.GZAddress == "" {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(z.ZoneType.GZAddress)
	return a, err == nil && a.Is6() && !a.Is4In6() && a.Zone() == ""
}

// underlayField names the field of t holding underlay address a, in the order
// UnderlayAddrs looks at them.
func underlayField(t ZoneType, a netip.Addr) string {
	for _, f := range []struct{ name, value string }{
		{"address", t.Address},
		{"internal_address", t.InternalAddress},
		{"http_address", t.HTTPAddress},
		{"dns_address", t.DNSAddress},
	} {
		if ap, err := netip.ParseAddrPort(f.value); err == nil && ap.Addr() == a {
			return f.name
		}
	}
	return "address"
}

// zoneFields lists every field of ZoneType other than type, in the order
// zoneType reports them.
var zoneFields = [...]string{
	"address", "dataset", "dns_servers", "domain", "ntp_servers", "snat_cfg", "nic",
	"dns_address", "http_address", "gz_address", "gz_address_index", "internal_address",
	"lockstep_port", "external_ip", "external_tls", "external_dns_servers",
}

// fieldsPresent has bit i set if t has zoneFields[i]. (Plain code, not a
// function per field: calling through a function value would move every
// zone validated to the heap.)
func fieldsPresent(t *ZoneType) uint32 {
	present := [...]bool{
		t.Address != "",
		t.Dataset != nil,
		t.DNSServers != nil,
		t.Domain != nil,
		t.NTPServers != nil,
		t.SNAT != nil,
		t.NIC != nil,
		t.DNSAddress != "",
		t.HTTPAddress != "",
		t.GZAddress != "",
		t.GZAddressIndex != nil,
		t.InternalAddress != "",
		t.LockstepPort != nil,
		t.ExternalIP != "",
		t.ExternalTLS != nil,
		t.ExternalDNSServers != nil,
	}
	// As many as zoneFields (and in its order): a field added to one list
	// and not the other does not compile.
	var _ [len(zoneFields)]bool = present
	var set uint32
	for i, p := range present {
		if p {
			set |= 1 << i
		}
	}
	return set
}

// zoneVariant lists the fields one zone type requires and the ones it may have.
type zoneVariant struct {
	required, optional []string
}

// zoneVariants follows upstream OmicronZoneType (sled-agent API 48.0.0).
var zoneVariants = map[string]zoneVariant{
	"boundary_ntp": {
		required: []string{"address", "dns_servers", "nic", "ntp_servers", "snat_cfg"},
		optional: []string{"domain"},
	},
	"clickhouse":        {required: []string{"address", "dataset"}},
	"clickhouse_keeper": {required: []string{"address", "dataset"}},
	"clickhouse_server": {required: []string{"address", "dataset"}},
	"cockroach_db":      {required: []string{"address", "dataset"}},
	"crucible":          {required: []string{"address", "dataset"}},
	"crucible_pantry":   {required: []string{"address"}},
	"external_dns":      {required: []string{"dataset", "dns_address", "http_address", "nic"}},
	"internal_dns": {
		required: []string{"dataset", "dns_address", "gz_address", "gz_address_index", "http_address"},
	},
	"internal_ntp": {required: []string{"address"}},
	"nexus": {
		required: []string{"external_dns_servers", "external_ip", "external_tls", "internal_address", "nic"},
		optional: []string{"lockstep_port"},
	},
	"oximeter": {required: []string{"address"}},
}

// variantFields is a zoneVariant as sets of indexes of zoneFields (bit i
// for zoneFields[i]), which zoneType tests without searching the lists.
type variantFields struct{ required, optional uint32 }

var zoneVariantFields = func() map[string]variantFields {
	bits := func(names []string) (set uint32) {
		for _, name := range names {
			i := slices.Index(zoneFields[:], name)
			if i < 0 {
				panic("sledconfig: zone variant names unknown field " + name)
			}
			set |= 1 << i
		}
		return set
	}
	m := make(map[string]variantFields, len(zoneVariants))
	for typ, variant := range zoneVariants {
		m[typ] = variantFields{required: bits(variant.required), optional: bits(variant.optional)}
	}
	return m
}()

func (v *validator) zoneType(w where, t *ZoneType) {
	variant, known := zoneVariantFields[t.Type]
	switch {
	case t.Type == "":
		v.add(w.at(".type"), "is required")
	case !known:
		v.add(w.at(".type"), "unknown zone type %q", t.Type)
	default:
		present := fieldsPresent(t)
		for i, name := range zoneFields {
			switch bit := uint32(1) << i; {
			case variant.required&bit != 0:
				if present&bit == 0 {
					v.add(w.at("."+name), "is required for zone type %s", t.Type)
				}
			case present&bit != 0 && variant.optional&bit == 0:
				v.add(w.at("."+name), "is not a field of zone type %s", t.Type)
			}
		}
	}

	// Check the values of whichever fields are present.
	if t.Address != "" {
		v.underlayAddrPort(w, ".address", t.Address)
	}
	if t.Dataset != nil {
		v.zpool(w, ".dataset.pool_name", t.Dataset.PoolName)
	}
	v.ipList(w, ".dns_servers", t.DNSServers)
	for i, s := range t.NTPServers {
		if strings.TrimSpace(s) == "" {
			v.add(w.at(fmt.Sprintf(".ntp_servers[%d]", i)), "is empty")
		}
	}
	if t.SNAT != nil {
		v.ip(w, ".snat_cfg.ip", t.SNAT.IP)
		if t.SNAT.FirstPort > t.SNAT.LastPort {
			v.add(w.at(".snat_cfg"), "first_port %d is after last_port %d", t.SNAT.FirstPort, t.SNAT.LastPort)
		}
	}
	if t.NIC != nil {
		v.nic(w.in(".nic"), t.NIC)
	}
	if t.DNSAddress != "" {
		if t.Type == "external_dns" {
			// An external address of either family.
			switch ap, err := netip.ParseAddrPort(t.DNSAddress); {
			case err != nil || ap.Addr().Zone() != "":
				v.add(w.at(".dns_address"), "%q is not an address like \"192.0.2.1:53\" or \"[2001:db8::1]:53\"", t.DNSAddress)
			case ap.Port() == 0:
				v.unrealisable(w.at(".dns_address"), "%q has port 0; the service needs a fixed port", t.DNSAddress)
			}
		} else {
			v.underlayAddrPort(w, ".dns_address", t.DNSAddress)
		}
	}
	if t.HTTPAddress != "" {
		v.underlayAddrPort(w, ".http_address", t.HTTPAddress)
	}
	if t.GZAddress != "" {
		switch a, err := netip.ParseAddr(t.GZAddress); {
		case err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "":
			v.add(w.at(".gz_address"), "%q is not an IPv6 address", t.GZAddress)
		case !a.IsGlobalUnicast():
			v.unrealisable(w.at(".gz_address"), "%s is %s; a gz_address must be a global or unique-local unicast address", a, addrKind(a))
		}
	}
	if t.LockstepPort != nil && *t.LockstepPort == 0 {
		v.unrealisable(w.at(".lockstep_port"), "is 0; the service needs a fixed port")
	}
	if t.InternalAddress != "" {
		v.underlayAddrPort(w, ".internal_address", t.InternalAddress)
	}
	if t.ExternalIP != "" {
		v.ip(w, ".external_ip", t.ExternalIP)
	}
	v.ipList(w, ".external_dns_servers", t.ExternalDNSServers)
}

// underlayAddrPort checks an underlay socket address, "[ipv6]:port".
func (v *validator) underlayAddrPort(w where, sub, s string) {
	ap, err := netip.ParseAddrPort(s)
	switch {
	case err != nil || !ap.Addr().Is6():
		v.add(w.at(sub), "%q is not an IPv6 socket address like \"[fd00:1122:3344:101::5]:32345\"", s)
	case ap.Addr().Is4In6():
		v.add(w.at(sub), "%q is an IPv4-mapped address, not an underlay IPv6 address", s)
	case ap.Addr().Zone() != "":
		v.add(w.at(sub), "%q has a scope zone; underlay addresses have none", s)
	case !ap.Addr().IsGlobalUnicast():
		v.unrealisable(w.at(sub), "%q: %s is %s; a zone's underlay address must be a global or unique-local unicast address", s, ap.Addr(), addrKind(ap.Addr()))
	case ap.Port() == 0:
		v.unrealisable(w.at(sub), "%q has port 0; the service needs a fixed port", s)
	}
}

// addrKind says why a is not a unicast address a zone or NIC can hold.
func addrKind(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsMulticast():
		return "a multicast address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	return "not a unicast address"
}

// ip checks an IP address of either family.
func (v *validator) ip(w where, sub, s string) {
	if s == "" {
		v.add(w.at(sub), "is required")
		return
	}
	if a, err := netip.ParseAddr(s); err != nil || a.Zone() != "" {
		v.add(w.at(sub), "%q is not an IP address", s)
	}
}

func (v *validator) ipList(w where, sub string, list []string) {
	for i, s := range list {
		v.ip(w, fmt.Sprintf("%s[%d]", sub, i), s)
	}
}

// isZpoolName reports whether s is upstream's ZpoolName: an external (oxp_)
// or internal (oxi_) pool named by a lowercase version-4 UUID.
func isZpoolName(s string) bool {
	return len(s) == len("oxp_")+36 && (strings.HasPrefix(s, "oxp_") || strings.HasPrefix(s, "oxi_")) &&
		isLowerUUID(s[len("oxp_"):], true)
}

// isLowerUUID reports whether s is a UUID in the 36-character hyphenated
// form in lowercase ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12});
// with v4, a version-4 one (4 first in the third group, one of 8, 9, a, b
// first in the fourth).
func isLowerUUID(s string, v4 bool) bool {
	return hyphenated(s, false) && (!v4 || s[14] == '4' && strings.IndexByte("89ab", s[19]) >= 0)
}

// uuidWindows are the eight-byte windows hyphenated tests a UUID in: all
// 36 bytes (the last two overlap), each with a mask of the bytes in it
// that are hyphens.
var uuidWindows = [...]struct {
	at      int
	hyphens uint64
}{{0, 0}, {8, 0xff | 0xff<<40}, {16, 0xff<<16 | 0xff<<56}, {24, 0}, {28, 0}}

// hyphenated reports whether s has the form of a hyphenated UUID,
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, each x a hex digit: 0-9 or a-f,
// or A-F too if upper. (Eight bytes at a time: this is called for every id
// and pool name of a config, thousands of times.)
func hyphenated(s string, upper bool) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	for _, win := range uuidWindows {
		w := load64(s[win.at : win.at+8])
		w = w&^win.hyphens | win.hyphens&(ones*'0') // the hyphens, checked above, as digits
		if w&tops != 0 {
			return false // a byte that is not ASCII
		}
		// With every byte below 0x80, adding 0x80-c to each sets the
		// top bit of those from c up, without carrying into the next.
		digits := (w+ones*(0x80-'0'))&^(w+ones*(0x80-'9'-1)) |
			(w+ones*(0x80-'a'))&^(w+ones*(0x80-'f'-1))
		if upper {
			digits |= (w + ones*(0x80-'A')) &^ (w + ones*(0x80-'F'-1))
		}
		if digits&tops != tops {
			return false
		}
	}
	return true
}

func (v *validator) zpool(w where, sub, s string) {
	if !isZpoolName(s) {
		v.add(w.at(sub), "%q is not a zpool name like oxp_<uuid> or oxi_<uuid> (lowercase version-4 UUID)", s)
	}
}

// isArtifactHash reports whether s is a SHA-256 hash: 64 hex digits.
func isArtifactHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func (v *validator) imageSource(w where, is *ImageSource) {
	switch is.Type {
	case "install_dataset":
		if is.Hash != "" {
			v.add(w.at(".hash"), "is not a field of image source install_dataset")
		}
	case "artifact":
		if !isArtifactHash(is.Hash) {
			v.add(w.at(".hash"), "%q is not a SHA-256 hash (64 hex digits)", is.Hash)
		}
	case "":
		v.add(w.at(".type"), "is required")
	default:
		v.add(w.at(".type"), "unknown image source %q (want install_dataset or artifact)", is.Type)
	}
}

// maxVNI is the largest Geneve VNI (24 bits).
const maxVNI = 1<<24 - 1

func (v *validator) nic(w where, n *NIC) {
	v.uuid(w, ".id", n.ID)
	switch n.Kind.Type {
	case "instance", "service", "probe":
	case "":
		v.add(w.at(".kind.type"), "is required")
	default:
		v.add(w.at(".kind.type"), "unknown NIC kind %q (want instance, service or probe)", n.Kind.Type)
	}
	v.uuid(w, ".kind.id", n.Kind.ID)
	if msg := checkName(n.Name); msg != "" {
		v.add(w.at(".name"), "%q %s", n.Name, msg)
	}
	switch hw, ok := parseMAC(n.MAC); {
	case !ok:
		v.add(w.at(".mac"), "%q is not an EUI-48 MAC address like \"A8:40:25:FF:80:05\"", n.MAC)
	case hw[0]&1 != 0:
		v.unrealisable(w.at(".mac"), "%q is a multicast MAC address; a NIC needs a unicast one", n.MAC)
	case bytes.Equal(hw, make([]byte, 6)):
		v.unrealisable(w.at(".mac"), "%q is the all-zero MAC address; a NIC needs a unicast one", n.MAC)
	}
	v.ipConfig(w.in(".ip_config"), &n.IPConfig)
	if n.VNI > maxVNI {
		v.add(w.at(".vni"), "%d is larger than the largest VNI, %d", n.VNI, maxVNI)
	}
}

func (v *validator) ipConfig(w where, c *IPConfig) {
	val := &c.Value
	switch c.Type {
	case "v4", "v6":
		if val.V4 != nil {
			v.add(w.at(".value.v4"), "is not a field of ip_config type %s", c.Type)
		}
		if val.V6 != nil {
			v.add(w.at(".value.v6"), "is not a field of ip_config type %s", c.Type)
		}
		v.privateIP(w.in(".value"), &PrivateIP{IP: val.IP, Subnet: val.Subnet, TransitIPs: val.TransitIPs}, c.Type == "v6")
	case "dual_stack":
		if val.IP != "" || val.Subnet != "" || val.TransitIPs != nil {
			v.add(w.at(".value"), "ip, subnet and transit_ips of ip_config type dual_stack go in v4 and v6")
		}
		if val.V4 == nil {
			v.add(w.at(".value.v4"), "is required for ip_config type dual_stack")
		} else {
			v.privateIP(w.in(".value.v4"), val.V4, false)
		}
		if val.V6 == nil {
			v.add(w.at(".value.v6"), "is required for ip_config type dual_stack")
		} else {
			v.privateIP(w.in(".value.v6"), val.V6, true)
		}
	case "":
		v.add(w.at(".type"), "is required")
	default:
		v.add(w.at(".type"), "unknown ip_config type %q (want v4, v6 or dual_stack)", c.Type)
	}
}

// privateIP checks upstream PrivateIpv4Config or (v6) PrivateIpv6Config.
func (v *validator) privateIP(w where, p *PrivateIP, v6 bool) {
	family, ofFamily := "IPv4", func(a netip.Addr) bool { return a.Is4() }
	if v6 {
		family, ofFamily = "IPv6", func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }
	}
	ip, err := netip.ParseAddr(p.IP)
	ipOK := err == nil && ofFamily(ip) && ip.Zone() == ""
	switch {
	case p.IP == "":
		v.add(w.at(".ip"), "is required")
	case !ipOK:
		v.add(w.at(".ip"), "%q is not an %s address", p.IP, family)
	case !ip.IsGlobalUnicast():
		v.unrealisable(w.at(".ip"), "%s is %s; a NIC needs a unicast address", ip, addrKind(ip))
		ipOK = false // nothing more to say about it
	}
	subnet, err := netip.ParsePrefix(p.Subnet)
	switch {
	case p.Subnet == "":
		v.add(w.at(".subnet"), "is required")
	case err != nil || !ofFamily(subnet.Addr()):
		v.add(w.at(".subnet"), "%q is not an %s prefix", p.Subnet, family)
	case ipOK && !subnet.Contains(ip):
		v.add(w.at(".subnet"), "%s does not contain ip %s", p.Subnet, p.IP)
	case ipOK && !v6 && subnet.Bits() < 31 && ip == lastAddr(subnet):
		v.unrealisable(w.at(".ip"), "%s is the broadcast address of subnet %s; a NIC needs a unicast address", ip, p.Subnet)
	}
	if v6 && p.TransitIPs == nil {
		// Upstream PrivateIpv6Config requires it (the IPv4 one defaults it).
		v.add(w.at(".transit_ips"), "is required")
	}
	for i, s := range p.TransitIPs {
		if pfx, err := netip.ParsePrefix(s); err != nil || !ofFamily(pfx.Addr()) {
			v.add(w.at(fmt.Sprintf(".transit_ips[%d]", i)), "%q is not an %s prefix", s, family)
		}
	}
}

// lastAddr is the last address of an IPv4 prefix: its broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

func (v *validator) uuid(w where, sub, s string) {
	switch {
	case s == "":
		v.add(w.at(sub), "is required")
	case !isUUID(s):
		v.add(w.at(sub), "%q is not a UUID (want the 36-character hyphenated form)", s)
	}
}

// isUUID reports whether s is a UUID in the 36-character hyphenated form
// (either letter case): what uuid.Parse takes of that length, checked
// without decoding it.
func isUUID(s string) bool { return hyphenated(s, true) }

var namePattern = regexp.MustCompile(`^[a-z]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)

// checkName checks upstream Name and says what is wrong, or returns "".
func checkName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > 63:
		return "is longer than 63 characters"
	case isUUID(s):
		return "is a UUID; names may contain one but not be one"
	case !namePattern.MatchString(s):
		return "is not a name: it must start with a lowercase letter, hold only letters, digits and '-', and not end with '-'"
	}
	return ""
}

// parseMAC parses an EUI-48 MAC address in the colon-separated form
// upstream uses.
func parseMAC(s string) (net.HardwareAddr, bool) {
	if len(s) != len("A8:40:25:FF:80:05") {
		return nil, false
	}
	for i := 2; i < len(s); i += 3 {
		if s[i] != ':' {
			return nil, false
		}
	}
	hw, err := net.ParseMAC(s)
	return hw, err == nil && len(hw) == 6
}

// NICProblems checks a NIC given outside a sled config (a VMM's
// local_config.nics, a probe's interface, a firewall rule's targets) by
// the rules a zone's NIC is checked by; each problem's path starts with at.
func NICProblems(at string, n *NIC) []Problem {
	var v validator
	v.nic(where{}, n)
	for i := range v.problems {
		v.problems[i].Path = at + strings.TrimPrefix(v.problems[i].Path, `[""]`)
	}
	return v.problems
}
