package openapitest

import (
	"fmt"
	"regexp"

	"github.com/getkin/kin-openapi/openapi3"
)

// Two patterns of the upstream documents use look-around, which Go's
// regexp does not have; the validator would then refuse every value they
// apply to (a NIC's name, a VMM's hostname). Each is matched here by an
// equivalent without look-around. Any other pattern Go cannot compile stays
// an error, so nothing goes unchecked silently.
const (
	// Name: not a UUID, and a lower-case letter followed by letters, digits
	// and dashes, not ending in a dash.
	namePattern = `^(?![0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)^[a-z]([a-zA-Z0-9-]*[a-zA-Z0-9]+)?$`
	// Hostname: dot-separated labels of letters, digits and dashes, each
	// beginning with a letter or digit and not ending in a dash (the (?<!-)
	// after each label).
	hostnamePattern = `^([a-zA-Z0-9]+[a-zA-Z0-9\-]*(?<!-))(\.[a-zA-Z0-9]+[a-zA-Z0-9\-]*(?<!-))*$`
)

var lookAround = map[string]openapi3.RegexMatcher{
	namePattern: notAnd{
		not:  regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`),
		must: regexp.MustCompile(`^[a-z]([a-zA-Z0-9-]*[a-zA-Z0-9]+)?$`),
	},
	hostnamePattern: regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)*$`),
}

// notAnd matches what must matches and not does not.
type notAnd struct{ not, must *regexp.Regexp }

func (m notAnd) MatchString(s string) bool { return !m.not.MatchString(s) && m.must.MatchString(s) }

// compilePattern is the validator's regexp compiler: Go's, or one of the
// equivalents above.
func compilePattern(expr string) (openapi3.RegexMatcher, error) {
	if m, ok := lookAround[expr]; ok {
		return m, nil
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", expr, err)
	}
	return re, nil
}
