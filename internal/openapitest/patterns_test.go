package openapitest

import "testing"

// The equivalents of the look-around patterns match what the patterns
// mean.
func TestLookAroundEquivalents(t *testing.T) {
	for _, c := range []struct {
		pattern string
		value   string
		want    bool
	}{
		{namePattern, "nexus", true},
		{namePattern, "net0", true},
		{namePattern, "a", true},
		{namePattern, "a-b-c9", true},
		{namePattern, "a-", false},
		{namePattern, "Nexus", false},
		{namePattern, "9lives", false},
		{namePattern, "", false},
		{namePattern, "deadbeef-dead-beef-dead-beefdeadbeef", false}, // a UUID
		{namePattern, "deadbeef-dead-beef-dead-beefdeadbee", true},   // not quite one
		{hostnamePattern, "vm0", true},
		{hostnamePattern, "a.b-c.d", true},
		{hostnamePattern, "0x", true},
		{hostnamePattern, "a-", false},
		{hostnamePattern, "a-.b", false},
		{hostnamePattern, "-a", false},
		{hostnamePattern, "a..b", false},
		{hostnamePattern, "", false},
	} {
		m, err := compilePattern(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.MatchString(c.value); got != c.want {
			t.Errorf("%.20s… on %q = %v, want %v", c.pattern, c.value, got, c.want)
		}
	}
	if _, err := compilePattern(`^(?=x)y$`); err == nil {
		t.Error("an unknown look-around pattern compiled")
	}
}
