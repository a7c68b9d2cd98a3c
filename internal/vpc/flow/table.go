// Package flow holds the VPC data path's flow tables, as OPTE keeps them: a
// table from a flow key to a layer's per-flow state that forgets idle flows,
// a TCP connection tracker whose state sets how long a TCP flow may idle, and
// the port's unified flow table, a cache of compiled per-flow transforms that
// a port epoch invalidates. Nothing here does I/O; time comes from a clock the
// caller injects.
package flow

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultTTL is how long a flow may idle before it expires, OPTE's
	// FLOW_DEF_EXPIRE_SECS (lib/opte/src/engine/flow_table.rs:38).
	DefaultTTL = 60 * time.Second

	// DefaultLimit is OPTE's default number of entries a flow table holds,
	// FLOW_TABLE_DEF_MAX_ENTRIES (lib/opte/src/engine/flow_table.rs:41).
	DefaultLimit = 8192

	// PortLimit is the number of entries xde gives a port's firewall layer,
	// its unified flow tables and its TCP flow table, FW_FT_LIMIT
	// (xde/src/xde.rs:334, applied at :3259 and :3275): 2^19. It is larger
	// than the NAT layer's need of one entry per port number and family
	// (lib/oxide-vpc/src/cfg.rs:207).
	PortLimit = 524288
)

// ErrFull is the decision a full table makes about a new flow when no entry
// may be evicted: OPTE's OpteError::MaxCapacity. The flow's packet is dropped.
var ErrFull = errors.New("flow table full")

// FullError says which table was full; it matches ErrFull.
type FullError struct {
	Limit int
}

func (e *FullError) Error() string {
	return fmt.Sprintf("flow table full: %d entries, none evictable", e.Limit)
}

// Unwrap makes errors.Is(err, ErrFull) hold.
func (e *FullError) Unwrap() error { return ErrFull }

// Priority is how eligible an entry is to be evicted from a full table to
// make room for a new flow, OPTE's EvictionPriority
// (lib/opte/src/engine/flow_table.rs:72): Protected entries never are; among
// the others a higher number goes first, and at equal numbers the entry idle
// longest.
type Priority uint16

const (
	// Protected entries are never evicted.
	Protected Priority = 0
	// MinEvictable is the least eligible evictable priority.
	MinEvictable Priority = 1
	// MaxEvictable is the most eligible.
	MaxEvictable Priority = 65535
)

// Config sets up a Table. The zero value is OPTE's default table: 8192
// entries, 60 s idle, nothing evictable, the wall clock.
type Config[V any] struct {
	// Limit is the most entries the table holds (DefaultLimit if 0).
	Limit int
	// TTL is how long an entry may idle (DefaultTTL if 0), unless TTLOf is set.
	TTL time.Duration
	// TTLOf, if set, gives each entry its own idle limit from its value,
	// read at every sweep: TCP flows use it to follow their connection state.
	// A flow that entries of other tables still depend on (a layer's flow
	// under a live TCP flow) returns a TTL that keeps it, as OPTE keeps a
	// flow with live children (flow_table.rs:309-321); when they go, Inherit
	// passes their last hit on. It must be safe to call while other
	// goroutines use the value.
	TTLOf func(v V) time.Duration
	// Evict, if set, gives an entry's eviction priority from its value and
	// how long it has idled. If nil, nothing is evicted and a full table
	// refuses new flows with a *FullError.
	Evict func(v V, idle time.Duration) Priority
	// Now is the clock (time.Now if nil). Tests run in a synctest bubble.
	Now func() time.Time
}

// Entry is a snapshot of one flow: what the table reports when it gives an
// entry up (expired, evicted, replaced, removed or cleared), so that the
// caller can give back what the flow held, such as a NAT port.
type Entry[K comparable, V any] struct {
	Key     K
	Value   V
	LastHit time.Time
	Hits    uint64
}

// Table maps flow keys to per-flow state, with OPTE's expiry and capacity.
//
// A Table is safe for concurrent use: a port's two directions, its sweeper
// and the control plane (which clears a layer's table when its rules change)
// may share it. The map is split in shards by a hash of the key, each under
// its own read-write lock, so that lookups from two cores rarely touch the
// same lock; a lookup takes its shard's read lock and records the hit with
// atomics. Every change also holds the table's writer lock, so changes are
// serialised as OPTE's are under its port lock, and the limit and eviction
// are exact. Expire scans shard by shard under read locks and takes the
// writer lock only to delete what it found. Lock order: mu, then a shard's.
// A value's own fields are the caller's to guard (TCPEntry guards its own).
type Table[K comparable, V any] struct {
	limit int
	ttl   time.Duration
	ttlOf func(V) time.Duration
	evict func(V, time.Duration) Priority
	now   func() time.Time
	base  time.Time // instant 0 of the entries' hit times
	seed  maphash.Seed

	afterScan func() // tests: runs between Expire's scan and its deletions

	mu     sync.Mutex // held by every change
	n      int        // entries; guarded by mu
	shards [shardCount]shard[K, V]
}

// shardCount spreads a table's lock over enough cache lines for the
// goroutines of one port.
const shardCount = 16

type shard[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]*entry[V]   // written with mu and the table's mu held
	_  [64 - 24 - 8]byte // a cache line each: RWMutex 24, map 8
}

func (t *Table[K, V]) shardOf(k K) *shard[K, V] {
	return &t.shards[maphash.Comparable(t.seed, k)%shardCount]
}

type entry[V any] struct {
	val     V
	lastHit atomic.Int64 // nanoseconds since the table's base
	hits    atomic.Uint64
}

// New makes an empty table.
func New[K comparable, V any](cfg Config[V]) *Table[K, V] {
	t := &Table[K, V]{
		limit: cfg.Limit,
		ttl:   cfg.TTL,
		ttlOf: cfg.TTLOf,
		evict: cfg.Evict,
		now:   cfg.Now,
		seed:  maphash.MakeSeed(),
	}
	for i := range t.shards {
		t.shards[i].m = make(map[K]*entry[V])
	}
	if t.limit <= 0 {
		t.limit = DefaultLimit
	}
	if t.ttl <= 0 {
		t.ttl = DefaultTTL
	}
	if t.now == nil {
		t.now = time.Now
	}
	t.base = t.now()
	return t
}

// Limit is the most entries the table holds.
func (t *Table[K, V]) Limit() int { return t.limit }

// Len is the number of entries.
func (t *Table[K, V]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *Table[K, V]) stamp(now time.Time) int64 { return int64(now.Sub(t.base)) }

func (t *Table[K, V]) snapshot(k K, e *entry[V]) Entry[K, V] {
	return Entry[K, V]{
		Key:     k,
		Value:   e.val,
		LastHit: t.base.Add(time.Duration(e.lastHit.Load())),
		Hits:    e.hits.Load(),
	}
}

// Lookup returns k's value and counts a hit on it now.
func (t *Table[K, V]) Lookup(k K) (V, bool) { return t.LookupAt(k, t.now()) }

// LookupAt returns k's value and counts a hit at now, a time the caller read
// from the table's clock once for the whole packet (OPTE's hit_at,
// lib/opte/src/engine/flow_table.rs:622).
func (t *Table[K, V]) LookupAt(k K, now time.Time) (V, bool) {
	e, ok := t.find(k)
	if !ok {
		var zero V
		return zero, false
	}
	e.hits.Add(1)
	e.lastHit.Store(t.stamp(now))
	return e.val, true
}

// find is k's entry, under its shard's read lock.
func (t *Table[K, V]) find(k K) (*entry[V], bool) {
	s := t.shardOf(k)
	s.mu.RLock()
	e, ok := s.m[k]
	s.mu.RUnlock()
	return e, ok
}

// Peek returns k's value without counting a hit.
func (t *Table[K, V]) Peek(k K) (V, bool) {
	e, ok := t.find(k)
	if !ok {
		var zero V
		return zero, false
	}
	return e.val, true
}

// Inherit moves k's last hit forward to at, if that is later: a flow whose
// dependent entries in other tables were used more recently lives as long
// as they did (OPTE's inherit_last_hit, lib/opte/src/engine/flow_table.rs:153).
// It reports whether k was there.
func (t *Table[K, V]) Inherit(k K, at time.Time) bool {
	e, ok := t.find(k)
	if !ok {
		return false
	}
	s := t.stamp(at)
	for {
		old := e.lastHit.Load()
		if old >= s || e.lastHit.CompareAndSwap(old, s) {
			return true
		}
	}
}

// Insert adds k with value v, hit now, or replaces k's entry (OPTE's add
// overwrites, lib/opte/src/engine/flow_table.rs:238). If the table is full it
// first evicts the most eligible entry (flow_table.rs:346-409); if none may
// be evicted it changes nothing and returns a *FullError. When an entry made
// way, the replaced one or the evicted one, Insert returns it and true: what
// it held is the caller's to give back.
func (t *Table[K, V]) Insert(k K, v V) (Entry[K, V], bool, error) {
	return t.InsertAt(k, v, t.now())
}

// InsertAt is Insert with the new entry hit at now, the packet's time.
func (t *Table[K, V]) InsertAt(k K, v V, now time.Time) (Entry[K, V], bool, error) {
	n := &entry[V]{val: v}
	n.lastHit.Store(t.stamp(now))

	s := t.shardOf(k)
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := s.m[k]; ok {
		s.set(k, n)
		return t.snapshot(k, old), true, nil
	}
	if t.n < t.limit {
		s.set(k, n)
		t.n++
		return Entry[K, V]{}, false, nil
	}
	vs, vk, ve, ok := t.evictableLocked(now)
	if !ok {
		return Entry[K, V]{}, false, &FullError{Limit: t.limit}
	}
	vs.del(vk)
	s.set(k, n)
	return t.snapshot(vk, ve), true, nil
}

// set and del change the shard's map; the table's mu is held.
func (s *shard[K, V]) set(k K, e *entry[V]) {
	s.mu.Lock()
	s.m[k] = e
	s.mu.Unlock()
}

func (s *shard[K, V]) del(k K) {
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

// evictableLocked finds the entry with the highest eviction priority, the
// one idle longest among equals (flow_table.rs:364-409). t.mu is held, so
// no map changes under the scan.
func (t *Table[K, V]) evictableLocked(now time.Time) (*shard[K, V], K, *entry[V], bool) {
	var (
		bestS    *shard[K, V]
		bestK    K
		bestE    *entry[V]
		bestPrio Priority
		bestHit  int64
	)
	if t.evict == nil {
		return nil, bestK, nil, false
	}
	st := t.stamp(now)
	for i := range t.shards {
		s := &t.shards[i]
		for k, e := range s.m {
			hit := e.lastHit.Load()
			p := t.evict(e.val, idle(st, hit))
			if p == Protected {
				continue
			}
			if bestE == nil || p > bestPrio || (p == bestPrio && hit < bestHit) {
				bestS, bestK, bestE, bestPrio, bestHit = s, k, e, p, hit
			}
		}
	}
	return bestS, bestK, bestE, bestE != nil
}

// idle is how long since hit, never negative: a hit may be stamped with a
// time read before a later sweep's (OPTE saturates the same way, ddi/time.rs:66).
func idle(now, hit int64) time.Duration {
	if now <= hit {
		return 0
	}
	return time.Duration(now - hit)
}

// Remove deletes k's entry and returns it.
func (t *Table[K, V]) Remove(k K) (Entry[K, V], bool) {
	s := t.shardOf(k)
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := s.m[k]
	if !ok {
		return Entry[K, V]{}, false
	}
	s.del(k)
	t.n--
	return t.snapshot(k, e), true
}

// removeIf deletes k's entry if it is still e.
func (t *Table[K, V]) removeIf(k K, e *entry[V]) {
	s := t.shardOf(k)
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.m[k] == e {
		s.del(k)
		t.n--
	}
}

// Clear empties the table and returns what it held: a layer's rules changed,
// so its flows must be decided again (OPTE's set_rules,
// lib/opte/src/engine/layer.rs:1545).
func (t *Table[K, V]) Clear() []Entry[K, V] {
	var old [shardCount]map[K]*entry[V]
	t.mu.Lock()
	out := make([]Entry[K, V], 0, t.n)
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		old[i] = s.m
		s.m = make(map[K]*entry[V])
		s.mu.Unlock()
	}
	t.n = 0
	t.mu.Unlock()
	for _, m := range old {
		for k, e := range m {
			out = append(out, t.snapshot(k, e))
		}
	}
	return out
}

// Entries returns a snapshot of every entry, in no order.
func (t *Table[K, V]) Entries() []Entry[K, V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Entry[K, V], 0, t.n)
	for i := range t.shards {
		for k, e := range t.shards[i].m {
			out = append(out, t.snapshot(k, e))
		}
	}
	return out
}

// Expire removes every entry idle for at least its TTL (OPTE's Ttl::is_expired
// is now - last_hit >= ttl, flow_table.rs:59) and returns them, so that the
// caller can give back what they held. OPTE sweeps every port once a second
// (xde/src/xde.rs:1140-1147).
func (t *Table[K, V]) Expire() []Entry[K, V] { return t.ExpireAt(t.now()) }

// ExpireAt is Expire as of now.
func (t *Table[K, V]) ExpireAt(now time.Time) []Entry[K, V] {
	s := t.stamp(now)
	type found struct {
		k K
		e *entry[V]
	}
	var cands []found
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for k, e := range sh.m {
			if t.expired(e, s) {
				cands = append(cands, found{k, e})
			}
		}
		sh.mu.RUnlock()
	}
	if len(cands) == 0 {
		return nil
	}
	if t.afterScan != nil {
		t.afterScan()
	}
	out := make([]Entry[K, V], 0, len(cands))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cands {
		// Between the scan and now the flow may have been hit, replaced
		// or removed: only what is still there and still idle goes.
		sh := t.shardOf(c.k)
		if sh.m[c.k] != c.e || !t.expired(c.e, s) {
			continue
		}
		sh.del(c.k)
		t.n--
		out = append(out, t.snapshot(c.k, c.e))
	}
	return out
}

func (t *Table[K, V]) expired(e *entry[V], now int64) bool {
	ttl := t.ttl
	if t.ttlOf != nil {
		ttl = t.ttlOf(e.val)
	}
	return idle(now, e.lastHit.Load()) >= ttl
}
