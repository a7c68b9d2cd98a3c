package backoff

import (
	"testing"
	"time"
)

func TestDelayDoublesAndIsCapped(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 10 * time.Second}
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for n, w := range want {
		if got := b.Delay(n); got != w {
			t.Errorf("Delay(%d) = %s, want %s", n, got, w)
		}
	}
	if got := (Backoff{Initial: time.Second, Max: time.Minute}).Delay(1000); got != time.Minute {
		t.Errorf("Delay(1000) = %s: must not overflow past the cap", got)
	}
}
