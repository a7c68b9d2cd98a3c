package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// InvalidError says which field of an upstream shape is wrong and why.
// Decoding returns it; the API answers 400 with its message.
type InvalidError struct {
	Field  string // e.g. "filter_ports[1]"
	Value  string // the offending text, as received
	Reason string
}

func (e *InvalidError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("%s %s: %s", e.Field, e.Value, e.Reason)
}

func invalid(field, value, reason string) error {
	return &InvalidError{Field: field, Value: value, Reason: reason}
}

// MaxVNI is the largest Geneve VNI (24 bits).
const MaxVNI = 1<<24 - 1

// VNI is upstream Vni: a Geneve virtual network identifier.
type VNI uint32

func (v *VNI) UnmarshalJSON(b []byte) error {
	var n uint32
	if err := json.Unmarshal(b, &n); err != nil {
		return invalid("vni", string(b), "not a 32-bit unsigned integer")
	}
	if n > MaxVNI {
		return invalid("vni", string(b), "larger than 24 bits")
	}
	*v = VNI(n)
	return nil
}

// MAC is a MAC address, written as upstream's MacAddr ("A8:40:25:F0:00:01").
type MAC [6]byte

// ParseMAC reads six colon-separated groups of one or two hex digits.
func ParseMAC(s string) (MAC, error) {
	var m MAC
	parts := strings.Split(s, ":")
	if len(parts) != 6 {
		return m, invalid("mac", s, "not six colon-separated hex octets")
	}
	for i, p := range parts {
		if len(p) < 1 || len(p) > 2 {
			return m, invalid("mac", s, "not six colon-separated hex octets")
		}
		n, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return m, invalid("mac", s, "not six colon-separated hex octets")
		}
		m[i] = byte(n)
	}
	return m, nil
}

// MustMAC is ParseMAC for constants; it panics on a bad address.
func MustMAC(s string) MAC {
	m, err := ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func (m MAC) String() string {
	return fmt.Sprintf("%02X:%02X:%02X:%02X:%02X:%02X", m[0], m[1], m[2], m[3], m[4], m[5])
}

func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m *MAC) UnmarshalText(b []byte) error {
	v, err := ParseMAC(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// decodeStrict decodes one JSON object into v and checks that every field
// named in required was present (and not null).
func decodeStrict(b []byte, v any, what string, required ...string) error {
	var present map[string]json.RawMessage
	if err := json.Unmarshal(b, &present); err != nil {
		return invalid(what, "", "not a JSON object")
	}
	for _, f := range required {
		raw, ok := present[f]
		if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return invalid(what+"."+f, "", "required")
		}
	}
	return json.Unmarshal(b, v)
}

// tagOf reads the "type" tag of an internally or adjacently tagged enum.
func tagOf(b []byte, what string) (string, map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return "", nil, invalid(what, "", "not a JSON object")
	}
	raw, ok := m["type"]
	if !ok {
		return "", nil, invalid(what+".type", "", "required")
	}
	var t string
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", nil, invalid(what+".type", string(raw), "not a string")
	}
	return t, m, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// parsePrefix reads upstream's IpNet. Host bits are kept as sent (oxnet
// keeps them); matching masks them.
func parsePrefix(field string, raw json.RawMessage) (netip.Prefix, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return netip.Prefix{}, invalid(field, string(raw), "not a string")
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, invalid(field, s, "not an IP network (a.b.c.d/n or x::/n)")
	}
	return p, nil
}
