package api

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// checkVersionHeader applies the api-version rules. A request without the
// header is served (for curl users; upstream's servers refuse it, and every
// generated client sends it). A header that is there must be one semantic
// version, written as the semver crate (which dropshot uses) accepts it:
// not empty, no leading zeros. It must be Version itself: a newer version is
// one this server does not know, and an older one would be answered in this
// version's shapes, which an older client may misread; upstream serves older
// versions in their own shapes, this server only the newest. Build metadata
// (+…) does not count, as in semver; a pre-release of Version is older.
func checkVersionHeader(h http.Header) error {
	values := h.Values("api-version")
	switch {
	case len(values) == 0:
		return nil
	case len(values) > 1:
		return fmt.Errorf("bad value for header \"api-version\": %d values; send one, %s", len(values), Version)
	}
	v := values[0]
	got, err := parseSemver(v)
	if err != nil {
		return fmt.Errorf("bad value for header \"api-version\": %q is not a semantic version like %s: %v", v, Version, err)
	}
	want, _ := parseSemver(Version)
	switch c := got.compare(want); {
	case c > 0:
		return fmt.Errorf("server does not support this API version: %s is newer than %s, the version this server serves", v, Version)
	case c < 0:
		return fmt.Errorf("server does not support this API version: %s is older than %s, the only version this server serves", v, Version)
	}
	return nil
}

// semver is a parsed semantic version; build metadata is dropped.
type semver struct {
	core [3]uint64
	pre  []string // pre-release identifiers
}

// parseSemver parses MAJOR.MINOR.PATCH[-PRE][+BUILD] as semver 2.0.0 (and
// Rust's semver crate) define it.
func parseSemver(v string) (semver, error) {
	var out semver
	rest, build, hasBuild := strings.Cut(v, "+")
	if hasBuild {
		if err := identifiers(build, false); err != nil {
			return out, fmt.Errorf("build metadata: %w", err)
		}
	}
	core, pre, hasPre := strings.Cut(rest, "-")
	if hasPre {
		if err := identifiers(pre, true); err != nil {
			return out, fmt.Errorf("pre-release: %w", err)
		}
		out.pre = strings.Split(pre, ".")
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return out, fmt.Errorf("want three numbers separated by dots")
	}
	for i, p := range parts {
		n, err := number(p)
		if err != nil {
			return out, err
		}
		out.core[i] = n
	}
	return out, nil
}

// number parses a numeric part: digits, no leading zero.
func number(p string) (uint64, error) {
	if p == "" {
		return 0, fmt.Errorf("empty number")
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a number", p)
		}
	}
	if len(p) > 1 && p[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", p)
	}
	n, err := strconv.ParseUint(p, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is too large", p)
	}
	return n, nil
}

// identifiers checks dot-separated identifiers of [0-9A-Za-z-]; numeric
// pre-release identifiers may not have leading zeros.
func identifiers(s string, pre bool) error {
	for id := range strings.SplitSeq(s, ".") {
		if id == "" {
			return fmt.Errorf("empty identifier")
		}
		numeric := true
		for _, c := range id {
			switch {
			case '0' <= c && c <= '9':
			case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '-':
				numeric = false
			default:
				return fmt.Errorf("%q has a character other than letters, digits and '-'", id)
			}
		}
		if pre && numeric && len(id) > 1 && id[0] == '0' {
			return fmt.Errorf("%q has a leading zero", id)
		}
	}
	return nil
}

// compare orders versions by semver precedence, as far as this server
// needs it: b is a release (Version), and a pre-release of it is older.
func (a semver) compare(b semver) int {
	for i := range a.core {
		if c := cmp.Compare(a.core[i], b.core[i]); c != 0 {
			return c
		}
	}
	if len(a.pre) > 0 {
		return -1
	}
	return 0
}
