package openapitest

import (
	"fmt"
	"regexp"
	"strings"
)

// Upstream's documents hold two patterns with lookaround, which Go's
// regexp lacks: Name's leading "not a UUID" (^(?!uuid$)^name$) and
// Hostname's labels that do not end in '-' ([...\-]*(?<!-)). compilePattern
// checks them exactly: a leading negative lookahead becomes a second
// expression that must not match, and that lookbehind a rewrite that means
// the same. Any other pattern Go cannot compile is an error, never skipped.
func compilePattern(expr string) (matcher, error) {
	if re, err := regexp.Compile(expr); err == nil {
		return re, nil
	}
	var m lookaround
	rest := expr
	if strings.HasPrefix(rest, "^(?!") {
		end := closingParen(rest, 1)
		if end < 0 {
			return nil, fmt.Errorf("pattern %q: unbalanced lookahead", expr)
		}
		not, err := regexp.Compile("^(?:" + rest[len("^(?!"):end] + ")")
		if err != nil {
			return nil, fmt.Errorf("pattern %q: lookahead: %w", expr, err)
		}
		m.not = not
		rest = rest[end+1:]
	}
	rest = strings.ReplaceAll(rest, `[a-zA-Z0-9\-]*(?<!-)`, `(?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?`)
	re, err := regexp.Compile(rest)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", expr, err)
	}
	m.must = re
	return m, nil
}

type matcher interface{ MatchString(string) bool }

// lookaround matches what must matches and not, if set, does not.
type lookaround struct{ must, not *regexp.Regexp }

func (l lookaround) MatchString(s string) bool {
	return l.must.MatchString(s) && (l.not == nil || !l.not.MatchString(s))
}

// closingParen returns the index of the parenthesis closing the one at
// open, or -1.
func closingParen(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}
