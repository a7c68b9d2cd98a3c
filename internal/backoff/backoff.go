// Package backoff chooses the delays between attempts after consecutive
// failures: capped exponential, without jitter.
package backoff

import "time"

// Backoff doubles the delay from Initial after each consecutive failure and
// never exceeds Max. It has no jitter: things fail for their own reasons, at
// their own times, and a deterministic schedule is one an operator can read
// off the status.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// Delay returns the wait after the n-th consecutive failure (n ≥ 1).
func (b Backoff) Delay(n int) time.Duration {
	if n < 1 {
		return 0
	}
	d := b.Initial
	for i := 1; i < n; i++ {
		if d >= b.Max/2 {
			return b.Max
		}
		d *= 2
	}
	return min(d, b.Max)
}
