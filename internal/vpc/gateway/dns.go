package gateway

import (
	"errors"
	"fmt"
	"strings"
)

// DomainName is a DNS name as OPTE's opte_api::DomainName takes it: the
// string as given (which options 12 and 15 carry), and its RFC 1035 §3.1
// label encoding (which options 119, DHCPv6 24 and 39 carry).
type DomainName struct {
	name    string
	encoded []byte
}

// ErrDomainName is wrapped by the errors of ParseDomainName.
var ErrDomainName = errors.New("invalid domain name")

// ParseDomainName validates s as OPTE does: 1 to 253 bytes, not starting with
// a dot, every label (trailing dots aside) 1 to 63 bytes. Labels are not
// restricted to letters, digits and hyphens, as upstream's are not.
func ParseDomainName(s string) (DomainName, error) {
	if len(s) == 0 || len(s) > 253 {
		return DomainName{}, fmt.Errorf("%w: %q: empty or longer than 253 bytes", ErrDomainName, s)
	}
	if strings.HasPrefix(s, ".") {
		return DomainName{}, fmt.Errorf("%w: %q starts with a dot", ErrDomainName, s)
	}
	enc := make([]byte, 0, len(s)+2)
	for label := range strings.SplitSeq(strings.TrimRight(s, "."), ".") {
		if len(label) == 0 || len(label) > 63 {
			return DomainName{}, fmt.Errorf("%w: %q: a label is empty or longer than 63 bytes", ErrDomainName, s)
		}
		enc = append(enc, byte(len(label)))
		enc = append(enc, label...)
	}
	enc = append(enc, 0)
	return DomainName{name: s, encoded: enc}, nil
}

// MustDomainName is ParseDomainName for names known to be valid.
func MustDomainName(s string) DomainName {
	n, err := ParseDomainName(s)
	if err != nil {
		panic(err)
	}
	return n
}

// String is the name as given.
func (n DomainName) String() string { return n.name }

// IsZero reports whether n is the zero value (no name).
func (n DomainName) IsZero() bool { return n.encoded == nil }

// Encoded is the name's label encoding, ending in the root label.
func (n DomainName) Encoded() []byte { return n.encoded }
