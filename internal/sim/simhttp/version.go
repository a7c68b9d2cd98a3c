package simhttp

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// CheckVersion refuses a missing or malformed api-version v, or one newer
// than newest, as the upstream dropshot servers do.
func CheckVersion(v, newest string) error {
	if v == "" {
		return errors.New(`missing expected header "api-version"`)
	}
	got, ok := parseSemver(v)
	if !ok {
		return fmt.Errorf("api-version %q is not a semantic version", v)
	}
	// A pre-release of a version is older than it, so comparing the cores
	// is enough: 2.0.0-rc1 is served, 2.0.1-rc1 is not.
	want, ok := parseSemver(newest)
	if !ok {
		panic(fmt.Sprintf("simhttp: served version %q is not a semantic version", newest))
	}
	if slices.Compare(got[:], want[:]) > 0 {
		return fmt.Errorf("server does not support this API version: %s", v)
	}
	return nil
}

// parseSemver parses MAJOR.MINOR.PATCH[-PRE][+BUILD] and returns the core.
func parseSemver(v string) (core [3]uint64, ok bool) {
	rest, build, hasBuild := strings.Cut(v, "+")
	if hasBuild && !validIdents(build, false) {
		return core, false
	}
	rest, pre, hasPre := strings.Cut(rest, "-")
	if hasPre && !validIdents(pre, true) {
		return core, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return core, false
	}
	for i, p := range parts {
		if !numeric(p) {
			return core, false
		}
		var n uint64
		for _, c := range p {
			n = n*10 + uint64(c-'0')
		}
		core[i] = n
	}
	return core, true
}

// numeric reports whether p is a number without leading zeros that fits
// comfortably in a uint64.
func numeric(p string) bool {
	if p == "" || len(p) > 18 || (len(p) > 1 && p[0] == '0') {
		return false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validIdents checks dot-separated semver identifiers.
func validIdents(s string, pre bool) bool {
	for id := range strings.SplitSeq(s, ".") {
		if id == "" {
			return false
		}
		allDigits := true
		for _, c := range id {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				allDigits = false
			default:
				return false
			}
		}
		if pre && allDigits && len(id) > 1 && id[0] == '0' {
			return false
		}
	}
	return true
}
