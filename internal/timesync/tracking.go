// Package timesync decides whether a sled's time is synchronized: the rule
// applied to chronyd's tracking report, ntp-admin's GET /timesync inside an
// NTP zone, and the host's watcher of it that gates the start of zones that
// need synchronized time.
package timesync

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// The sync rule's limits: upstream's, in omicron's ntp-admin
// (ntp-admin/src/http_entrypoints.rs, TIMESYNC_* and parse_timesync_result).
const (
	// MaxStratum is the highest stratum that counts as synchronized.
	MaxStratum = 9
	// MinRefTime is the reference time (seconds since the epoch) that a
	// real reference must be later than: chronyd reports 0 before its
	// first update.
	MinRefTime = 1234567890.0
	// MaxCorrection is the largest |correction| (seconds) that counts as
	// synchronized.
	MaxCorrection = 0.05
	// MaxMaxError is the largest estimated clock error (seconds) that
	// counts as synchronized. Upstream's reason: CockroachDB stops a node
	// whose clock is more than 400 ms from half its peers; with every
	// sled within 175 ms, two differ by at most 350 ms.
	MaxMaxError = 0.175
)

// Reference ids that say chronyd follows no peer: 0 (no reference yet) and
// 0x7F7F0101 (127.127.1.1, its own clock under the local directive).
const (
	refIDNone  = 0
	refIDLocal = 0x7F7F0101
)

// minFields is how many fields of the line upstream needs (it reads the
// first twelve; chronyc prints fourteen).
const minFields = 12

// Tracking is one `chronyc -c tracking` report. chronyc prints, comma
// separated: reference id (hex), reference name or IP, stratum, reference
// time (epoch seconds with fraction), system time offset (the correction),
// last offset, RMS offset, frequency, residual frequency, skew, root delay,
// root dispersion, update interval and leap status. Frequency, residual
// frequency, skew, update interval and leap status are not kept: upstream
// reads none of them.
type Tracking struct {
	RefID uint32
	// RefName is the second field as chronyc printed it: the reference's
	// IP address, or, when it has none, the text of its reference id
	// (often empty).
	RefName string
	// IPAddr is RefName as an address, or :: when it is not one
	// (upstream's fallback).
	IPAddr  netip.Addr
	Stratum uint8
	RefTime float64
	// Correction is the system clock's offset from NTP time, in seconds.
	Correction     float64
	LastOffset     float64
	RMSOffset      float64
	RootDelay      float64
	RootDispersion float64
}

// ParseError is a tracking line that cannot be read: Field names the field
// (as in ntp-admin's TimeSync, or "line" for the line as a whole).
type ParseError struct {
	Field string
	Value string
	Line  string
	Err   error
}

func (e *ParseError) Error() string {
	if e.Field == "line" {
		return fmt.Sprintf("chronyc tracking line %q: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("chronyc tracking line %q: bad %s %q: %v", e.Line, e.Field, e.Value, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// ParseTracking reads one line of `chronyc -c tracking`. Surrounding space
// (the line's newline) is ignored. Like upstream, it needs the first twelve
// fields, reads those the rule and /timesync use, takes a reference name
// that is not an address for ::, and ignores the rest. Unlike upstream, it
// refuses numbers that are not finite (NaN, Inf): JSON cannot carry them,
// and chronyc never prints them.
func ParseTracking(line string) (Tracking, error) {
	line = strings.TrimSpace(line)
	bad := func(field, value string, err error) (Tracking, error) {
		return Tracking{}, &ParseError{Field: field, Value: value, Line: line, Err: err}
	}
	if strings.ContainsAny(line, "\r\n") {
		return bad("line", "", fmt.Errorf("more than one line"))
	}
	v := strings.Split(line, ",")
	if len(v) < minFields {
		return bad("line", "", fmt.Errorf("%d fields, want at least %d", len(v), minFields))
	}
	var t Tracking
	id, err := strconv.ParseUint(v[0], 16, 32)
	if err != nil {
		return bad("ref_id", v[0], err)
	}
	t.RefID = uint32(id)
	t.RefName = v[1]
	t.IPAddr = netip.IPv6Unspecified()
	if a, err := netip.ParseAddr(v[1]); err == nil && a.Zone() == "" {
		t.IPAddr = a
	}
	stratum, err := strconv.ParseUint(v[2], 10, 8)
	if err != nil {
		return bad("stratum", v[2], err)
	}
	t.Stratum = uint8(stratum)
	floats := []struct {
		field string
		index int
		dst   *float64
	}{
		{"ref_time", 3, &t.RefTime},
		{"correction", 4, &t.Correction},
		{"last_offset", 5, &t.LastOffset},
		{"rms_offset", 6, &t.RMSOffset},
		{"root_delay", 10, &t.RootDelay},
		{"root_dispersion", 11, &t.RootDispersion},
	}
	for _, f := range floats {
		x, err := strconv.ParseFloat(v[f.index], 64)
		if err != nil {
			return bad(f.field, v[f.index], err)
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return bad(f.field, v[f.index], fmt.Errorf("not a finite number"))
		}
		*f.dst = x
	}
	return t, nil
}

// MaxError is the largest error the system clock may have, in seconds:
// |correction| + root delay / 2 + root dispersion (upstream's
// compute_max_error, after chronyc's documentation of the tracking report).
func (t Tracking) MaxError() float64 {
	return math.Abs(t.Correction) + t.RootDelay/2 + t.RootDispersion
}

// PeerSync reports whether chronyd follows a peer, as `chronyc waitsync`
// and upstream decide it: the reference has an address, or its id is
// neither 0 nor the local clock's. chronyd gives its local reference no
// address (chronyc prints an empty name), so a printed address is a real
// NTP source.
func (t Tracking) PeerSync() bool {
	return t.hasAddr() || (t.RefID != refIDNone && t.RefID != refIDLocal)
}

// Synced applies upstream's rule: stratum ≤ 9, a reference time after
// MinRefTime, a peer (not the local clock, not none), |correction| ≤ 0.05 s
// and MaxError ≤ 0.175 s. When it is not synced, the string says every
// condition that fails, for operators.
func (t Tracking) Synced() (bool, string) {
	var why []string
	if t.Stratum > MaxStratum {
		why = append(why, fmt.Sprintf("stratum %d > %d", t.Stratum, MaxStratum))
	}
	if !(t.RefTime > MinRefTime) {
		why = append(why, "no reference time yet (ref time "+strconv.FormatFloat(t.RefTime, 'f', -1, 64)+")")
	}
	if !t.PeerSync() {
		switch t.RefID {
		case refIDLocal:
			why = append(why, "the reference is the local clock, not a peer")
		default:
			why = append(why, "no reference peer")
		}
	}
	if c := math.Abs(t.Correction); !(c <= MaxCorrection) {
		why = append(why, fmt.Sprintf("|correction| %.6f s > %g s", c, MaxCorrection))
	}
	if e := t.MaxError(); !(e <= MaxMaxError) {
		why = append(why, fmt.Sprintf("max error %.6f s > %g s", e, MaxMaxError))
	}
	if len(why) > 0 {
		return false, strings.Join(why, "; ")
	}
	return true, ""
}

// Source names the reference for operators: its address, else the text of
// its reference id, else its id in hex.
func (t Tracking) Source() string {
	switch {
	case t.hasAddr():
		return t.IPAddr.String()
	case t.RefName != "":
		return t.RefName
	default:
		return fmt.Sprintf("%08X", t.RefID)
	}
}

// hasAddr reports whether the reference has an address (neither :: nor
// 0.0.0.0, nor none at all).
func (t Tracking) hasAddr() bool { return t.IPAddr.IsValid() && !t.IPAddr.IsUnspecified() }
