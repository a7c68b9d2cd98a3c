package bench

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A loop's progress is a line at most every progressEvery, and one at its
// last step, whatever the time.
func TestLoopProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		p := newLoopProgress(&out, "bench x: steps", 5)
		p.done(1) // at once: no line
		time.Sleep(progressEvery)
		p.done(2) // a period later: a line
		time.Sleep(progressEvery / 2)
		p.done(3) // half a period after it: none
		time.Sleep(progressEvery / 2)
		p.done(4) // a period after the last line: a line
		p.done(5) // the last: a line, at once
		got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		want := []string{"bench x: steps: 2/5", "bench x: steps: 4/5", "bench x: steps: 5/5"}
		if !slices.Equal(got, want) {
			t.Errorf("progress = %q, want %q", got, want)
		}
	})
	// No writer: nothing, and no panic.
	newLoopProgress(nil, "bench x", 1).done(1)
}
