package flow

import (
	"sync/atomic"
	"time"
)

// Epoch is a port's rule generation: every change to a layer's rules, or to
// a mapping the layers read, bumps it, and any cached transform computed
// under an older one is stale (OPTE's port epoch,
// lib/opte/src/engine/port/mod.rs:780-792, bumped by add_rule, remove_rule
// and set_rules at :938, :1710, :1751, :1772). It is safe for concurrent use.
// The zero value is ready, at epoch 1 as a new OPTE port starts (:359).
type Epoch struct {
	n atomic.Uint64 // the epoch minus 1
}

// Load is the current epoch.
func (e *Epoch) Load() uint64 { return e.n.Load() + 1 }

// Bump moves to the next epoch and returns it.
func (e *Epoch) Bump() uint64 { return e.n.Add(1) + 1 }

// Cache is a port's unified flow table for one direction: from a flow key
// to the transform its first packet compiled through every layer, valid only
// in the epoch it was compiled in (OPTE's UftEntry,
// lib/opte/src/engine/port/mod.rs:548-568). Its entries idle out like any
// flow's. Safe for concurrent use, as Table is.
type Cache[K comparable, T any] struct {
	epoch *Epoch
	t     *Table[K, cached[T]]
}

type cached[T any] struct {
	epoch uint64
	val   T
}

// NewCache makes an empty cache invalidated by epoch. cfg is as for a
// Table of the transforms (OPTE's UFTs use the default TTL and PortLimit).
func NewCache[K comparable, T any](epoch *Epoch, cfg Config[T]) *Cache[K, T] {
	ttl, ttlOf, evict := cfg.TTL, cfg.TTLOf, cfg.Evict
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	// Stale entries go at the next sweep, and first when the cache is
	// full: OPTE leaves them until a lookup or their TTL, holding slots.
	c := Config[cached[T]]{
		Limit: cfg.Limit,
		Now:   cfg.Now,
		TTLOf: func(v cached[T]) time.Duration {
			switch {
			case v.epoch != epoch.Load():
				return 0
			case ttlOf != nil:
				return ttlOf(v.val)
			}
			return ttl
		},
		Evict: func(v cached[T], idle time.Duration) Priority {
			switch {
			case v.epoch != epoch.Load():
				return MaxEvictable
			case evict != nil:
				return evict(v.val, idle)
			}
			return Protected
		},
	}
	return &Cache[K, T]{epoch: epoch, t: New[K](c)}
}

// Lookup returns k's transform if it was compiled in the current epoch,
// and counts a hit. An entry from an older epoch is removed and reported as
// a miss: the caller runs the layers again (port/mod.rs:1356-1432).
func (c *Cache[K, T]) Lookup(k K) (T, bool) { return c.LookupAt(k, c.t.now()) }

// LookupAt is Lookup with a hit at now.
func (c *Cache[K, T]) LookupAt(k K, now time.Time) (T, bool) {
	cur := c.epoch.Load()
	e, ok := c.t.find(k)
	var zero T
	if !ok {
		return zero, false
	}
	if e.val.epoch != cur {
		c.t.removeIf(k, e)
		return zero, false
	}
	e.hits.Add(1)
	e.lastHit.Store(c.t.stamp(now))
	return e.val.val, true
}

// Insert caches v for k as compiled in epoch, the epoch the caller read
// before it ran the layers: if the rules changed meanwhile, the entry is
// already stale and the next lookup drops it. It fails, as Table.Insert
// does, only when the cache is full and nothing may be evicted.
func (c *Cache[K, T]) Insert(k K, v T, epoch uint64) error {
	return c.InsertAt(k, v, epoch, c.t.now())
}

// InsertAt is Insert with the entry hit at now, the packet's time.
func (c *Cache[K, T]) InsertAt(k K, v T, epoch uint64, now time.Time) error {
	_, _, err := c.t.InsertAt(k, cached[T]{epoch: epoch, val: v}, now)
	return err
}

// Remove drops k's entry (a TCP flow closed under it) and reports whether
// there was one.
func (c *Cache[K, T]) Remove(k K) bool {
	_, ok := c.t.Remove(k)
	return ok
}

// Expire drops entries idle past their TTL, and those of older epochs, and
// returns how many went.
func (c *Cache[K, T]) Expire() int { return len(c.t.Expire()) }

// Clear drops every entry.
func (c *Cache[K, T]) Clear() { c.t.Clear() }

// Len is the number of entries, stale ones included until looked up or expired.
func (c *Cache[K, T]) Len() int { return c.t.Len() }
