package flow

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A port starts at epoch 1 and every change bumps it (port/mod.rs:359, :938).
func TestEpoch(t *testing.T) {
	var e Epoch
	if e.Load() != 1 {
		t.Fatalf("new epoch %d, want 1", e.Load())
	}
	if e.Bump() != 2 || e.Bump() != 3 || e.Load() != 3 {
		t.Fatalf("after two bumps: %d", e.Load())
	}
}

// A cached transform serves only in the epoch it was compiled in; a lookup
// in a later epoch drops it and misses (port/mod.rs:1356-1432).
func TestCacheEpoch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		compiled func(e *Epoch) uint64 // epoch the entry is stamped with
		bump     bool                  // a rule change after the insert
		hit      bool
	}{
		{"same epoch hits", (*Epoch).Load, false, true},
		{"a rule change invalidates", (*Epoch).Load, true, false},
		{"compiled while rules changed", func(e *Epoch) uint64 { old := e.Load(); e.Bump(); return old }, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ep Epoch
				c := NewCache[key, string](&ep, Config[string]{})
				if err := c.Insert(k(1), "xform", tc.compiled(&ep)); err != nil {
					t.Fatal(err)
				}
				if tc.bump {
					ep.Bump()
				}
				v, ok := c.Lookup(k(1))
				if ok != tc.hit || (ok && v != "xform") {
					t.Fatalf("lookup = %q, %v; want hit %v", v, ok, tc.hit)
				}
				if want := map[bool]int{true: 1, false: 0}[tc.hit]; c.Len() != want {
					t.Fatalf("%d entries after lookup, want %d", c.Len(), want)
				}
				// Recompiled in the current epoch, it serves again.
				c.Insert(k(1), "xform2", ep.Load())
				if v, ok := c.Lookup(k(1)); !ok || v != "xform2" {
					t.Fatalf("after recompiling: %q, %v", v, ok)
				}
			})
		})
	}
}

// Entries idle out as any flow's, and stale ones go at the next sweep and
// first when the cache is full.
func TestCacheExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ep Epoch
		c := NewCache[key, int](&ep, Config[int]{Limit: 2})
		c.Insert(k(1), 1, ep.Load())
		time.Sleep(30 * time.Second)
		c.Insert(k(2), 2, ep.Load())
		if err := c.Insert(k(3), 3, ep.Load()); !errors.Is(err, ErrFull) {
			t.Fatalf("full cache of live entries: %v", err)
		}
		time.Sleep(30 * time.Second)
		if n := c.Expire(); n != 1 || c.Len() != 1 {
			t.Fatalf("expired %d, %d left; want 1, 1", n, c.Len())
		}
		c.Insert(k(1), 1, ep.Load())
		ep.Bump()
		if err := c.Insert(k(3), 3, ep.Load()); err != nil {
			t.Fatalf("full cache with stale entries: %v", err)
		}
		if n := c.Expire(); n != 1 || c.Len() != 1 {
			t.Fatalf("stale sweep expired %d, %d left; want 1, 1", n, c.Len())
		}
		if _, ok := c.Lookup(k(3)); !ok {
			t.Fatal("current entry swept")
		}
		if !c.Remove(k(3)) || c.Remove(k(3)) {
			t.Fatal("remove")
		}
		c.Insert(k(4), 4, ep.Load())
		c.Clear()
		if c.Len() != 0 {
			t.Fatal("clear left entries")
		}
	})
}
