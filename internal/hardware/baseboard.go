package hardware

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

// DMIDir is where Linux shows the firmware's SMBIOS (DMI) identity.
const DMIDir = "/sys/class/dmi/id"

// What a sled reports when the firmware does not say. Upstream's sleds that
// are not Oxide's (its "PC" baseboards, sled-hardware's get_pc_baseboard)
// report the device tree's root node name as the model, which is "i86pc" on
// every x86 PC, and the host name as the serial. We do the same, so that
// the control plane sees such a sled as upstream's would show it. Upstream
// falls back to a random UUID when there is no host name; a serial that
// changes at every start would make the sled a new baseboard each time, so
// we report upstream's Baseboard::unknown() identifier instead, and the
// operator can give the truth with --baseboard-serial.
const (
	PCPart        = "i86pc"
	UnknownSerial = "unknown"
)

// dmiSource is one SMBIOS structure's name, version and serial attributes.
type dmiSource struct {
	name, version, serial string
}

// The sled is the whole machine: SMBIOS type 1 (system) names it as it was
// sold and racked, the way an Oxide sled's VPD names the sled; type 2 (the
// main board) names a replaceable part inside it. Upstream, on sleds that are
// not Oxide's, reads type 1 too (smbios -t 1: Product and Serial Number, for
// a4x2). So the part, revision and serial come from type 1 (product_name,
// product_version, product_serial), and each from type 2 (board_name,
// board_version, board_serial) only when type 1 leaves it out or holds a
// placeholder.
var (
	dmiSystem = dmiSource{"product_name", "product_version", "product_serial"}
	dmiBoard  = dmiSource{"board_name", "board_version", "board_serial"}
)

// baseboardNotes say, per field, what could not be read and what is
// reported instead ("" when the field was read).
type baseboardNotes struct {
	Part, Serial, Revision string
}

// readBaseboard reads the baseboard from a DMI directory. Nothing here is an
// error: what cannot be read is replaced as documented above, and the notes
// say what was replaced and why.
func readBaseboard(dir string, hostname func() (string, error)) (Baseboard, baseboardNotes) {
	var b Baseboard
	var notes baseboardNotes
	var versionOf dmiSource
	var tried []string // what could not be used, for the notes
	for _, src := range []dmiSource{dmiSystem, dmiBoard} {
		v, why := readDMI(dir, src.name)
		if why == "" {
			b.Part, versionOf = v, src
			break
		}
		tried = append(tried, src.name+" "+why)
	}
	if b.Part == "" {
		b.Part = PCPart
		notes.Part = fmt.Sprintf("baseboard part: %s; reporting %q, as upstream's PC sleds do (--baseboard-part gives it)", strings.Join(tried, ", "), PCPart)
	}
	tried = nil
	for _, src := range []dmiSource{dmiSystem, dmiBoard} {
		v, why := readDMI(dir, src.serial)
		if why == "" {
			b.Serial = v
			break
		}
		tried = append(tried, src.serial+" "+why)
	}
	if b.Serial == "" {
		host, err := hostname()
		host = strings.TrimSpace(host)
		switch {
		case err == nil && host != "":
			b.Serial = host
			notes.Serial = fmt.Sprintf("baseboard serial: %s; reporting the host name %q, as upstream's PC sleds do (--baseboard-serial gives it)", strings.Join(tried, ", "), host)
		default:
			b.Serial = UnknownSerial
			nohost := "the host name is empty"
			if err != nil {
				nohost = fmt.Sprintf("no host name (%v)", err)
			}
			notes.Serial = fmt.Sprintf("baseboard serial: %s, and %s; reporting %q (--baseboard-serial gives it)", strings.Join(tried, ", "), nohost, UnknownSerial)
		}
	}
	// The revision is the part's: read from the structure the part came from.
	if versionOf.version == "" {
		notes.Revision = "baseboard revision: no part in DMI; reporting 0, as upstream's PC sleds do (--baseboard-revision gives it)"
		return b, notes
	}
	v, why := readDMI(dir, versionOf.version)
	if why != "" {
		notes.Revision = fmt.Sprintf("baseboard revision: %s %s; reporting 0 (--baseboard-revision gives it)", versionOf.version, why)
		return b, notes
	}
	rev, ok := parseRevision(v)
	if !ok {
		notes.Revision = fmt.Sprintf("baseboard revision: %s %q is not a number; reporting 0 (--baseboard-revision gives it)", versionOf.version, v)
	}
	b.Revision = rev
	return b, notes
}

// readDMI reads one DMI attribute. It returns the value, or "" and why it
// cannot be used: missing (a VM or a machine without SMBIOS), unreadable
// (the serials are readable by root only), or a placeholder.
func readDMI(dir, name string) (value, why string) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", "is missing"
	case errors.Is(err, os.ErrPermission):
		return "", "is not readable by this user (the serials are root's only)"
	case err != nil:
		return "", fmt.Sprintf("is unreadable (%v)", err)
	}
	v := strings.TrimFunc(string(data), func(r rune) bool { return unicode.IsSpace(r) || r == 0 })
	if v == "" {
		return "", "is empty"
	}
	if isPlaceholder(v) {
		return "", fmt.Sprintf("is a placeholder (%q)", v)
	}
	if strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return "", fmt.Sprintf("holds unprintable characters (%q)", v)
	}
	return v, ""
}

// placeholders are what firmware puts in a field its maker never filled in.
var placeholders = map[string]bool{
	"to be filled by o.e.m.":      true,
	"to be filled by oem":         true,
	"default string":              true,
	"not specified":               true,
	"not applicable":              true,
	"not available":               true,
	"none":                        true,
	"n/a":                         true,
	"na":                          true,
	"unknown":                     true,
	"oem":                         true,
	"o.e.m.":                      true,
	"system product name":         true,
	"super server":                true,
	"system version":              true,
	"system serial number":        true,
	"base board product name":     true,
	"base board version":          true,
	"base board serial number":    true,
	"type2 - board product name1": true,
	"type2 - board version":       true,
	"type2 - board serial number": true,
	"0123456789":                  true,
	"123456789":                   true,
	"1234567890":                  true,
	"x.x":                         true,
}

// isPlaceholder says whether a DMI value is a maker's placeholder: a known
// one, or one character repeated ("00000000", "XXXXXXXX", "........").
func isPlaceholder(v string) bool {
	if placeholders[strings.ToLower(v)] {
		return true
	}
	return len(v) > 1 && strings.Trim(v, v[:1]) == ""
}

// parseRevision reads a revision number from a version string: an integer,
// optionally after "rev", "r", "v" or "version" ("3", "Rev 3", "v3", "R03"),
// and optionally with a fraction of zeros ("1.0", "1.00": still 1). Anything
// else ("1.02", "A1", "pc-q35-8.2") is not a number: 0 and false.
func parseRevision(v string) (uint32, bool) {
	s := strings.ToLower(strings.TrimSpace(v))
	for _, p := range []string{"revision", "version", "rev", "ver", "r", "v"} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			s = strings.TrimLeft(rest, " .:")
			break
		}
	}
	if whole, frac, ok := strings.Cut(s, "."); ok {
		if frac == "" || strings.Trim(frac, "0") != "" {
			return 0, false
		}
		s = whole
	}
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}
