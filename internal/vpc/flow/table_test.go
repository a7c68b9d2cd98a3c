package flow

import (
	"errors"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"
)

// key is a 5-tuple like OPTE's InnerFlowId, to key the tests' tables.
type key struct {
	proto            uint8
	src, dst         netip.Addr
	srcPort, dstPort uint16
}

func k(port uint16) key {
	return key{
		proto:   6,
		src:     netip.MustParseAddr("172.30.0.5"),
		dst:     netip.MustParseAddr("76.76.21.21"),
		srcPort: port,
		dstPort: 443,
	}
}

func ports(es []Entry[key, string]) []uint16 {
	var out []uint16
	for _, e := range es {
		out = append(out, e.Key.srcPort)
	}
	slices.Sort(out)
	return out
}

// An entry expires once idle for its TTL, counted from its last hit: OPTE's
// Ttl::is_expired is now - last_hit >= ttl (flow_table.rs:58-61), 60 s by
// default (flow_table.rs:38).
func TestExpiry(t *testing.T) {
	type step struct {
		after   time.Duration // sleep, then
		hit     bool          // look the flow up, or
		expired bool          // sweep and expect it to go (or stay)
	}
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		steps []step
	}{
		{"default TTL, just short", 0, []step{{after: DefaultTTL - time.Millisecond}}},
		{"default TTL, exactly", 0, []step{{after: DefaultTTL, expired: true}}},
		{"hit restarts the clock", 0, []step{
			{after: 30 * time.Second, hit: true},
			{after: 59 * time.Second},
			{after: time.Second, expired: true},
		}},
		{"configured TTL", 10 * time.Second, []step{
			{after: 9 * time.Second},
			{after: time.Second, expired: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tb := New[key](Config[string]{TTL: tc.ttl})
				if _, _, err := tb.Insert(k(1), "a"); err != nil {
					t.Fatal(err)
				}
				for i, s := range tc.steps {
					time.Sleep(s.after)
					if s.hit {
						if v, ok := tb.Lookup(k(1)); !ok || v != "a" {
							t.Fatalf("step %d: lookup = %q, %v", i, v, ok)
						}
						continue
					}
					gone := tb.Expire()
					if got := len(gone) == 1; got != s.expired {
						t.Fatalf("step %d: expired %v, want %v", i, gone, s.expired)
					}
					if _, ok := tb.Peek(k(1)); ok == s.expired {
						t.Fatalf("step %d: still there = %v", i, ok)
					}
				}
			})
		})
	}
}

// A sweep reports what went, with its value and last hit, so that NAT can
// give back the ports its flows held (OPTE's expire_flows returns them,
// flow_table.rs:301-340); what was hit stays.
func TestExpireReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](Config[string]{})
		start := time.Now()
		for p := uint16(1); p <= 3; p++ {
			tb.Insert(k(p), "v")
		}
		time.Sleep(40 * time.Second)
		tb.Lookup(k(2))
		tb.Lookup(k(2))
		time.Sleep(20 * time.Second)
		gone := tb.Expire()
		if got := ports(gone); !slices.Equal(got, []uint16{1, 3}) {
			t.Fatalf("expired %v, want ports 1 and 3", got)
		}
		for _, e := range gone {
			if !e.LastHit.Equal(start) || e.Value != "v" || e.Hits != 0 {
				t.Errorf("expired %+v, want last hit at the start, no hits", e)
			}
		}
		es := tb.Entries()
		if len(es) != 1 || es[0].Hits != 2 || !es[0].LastHit.Equal(start.Add(40*time.Second)) {
			t.Fatalf("left %+v, want port 2 with 2 hits at 40 s", es)
		}
		if got := tb.Expire(); got != nil {
			t.Fatalf("second sweep expired %v", got)
		}
	})
}

// A flow hit or replaced between a sweep's scan and its deletions stays.
func TestExpireRace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		between func(tb *Table[key, string])
		left    string
	}{
		{"untouched goes", func(*Table[key, string]) {}, ""},
		{"hit stays", func(tb *Table[key, string]) { tb.Lookup(k(1)) }, "old"},
		{"replaced stays", func(tb *Table[key, string]) { tb.Insert(k(1), "new") }, "new"},
		{"removed is not reported", func(tb *Table[key, string]) { tb.Remove(k(1)) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tb := New[key](Config[string]{})
				tb.Insert(k(1), "old")
				time.Sleep(DefaultTTL)
				tb.afterScan = func() { tc.between(tb) }
				gone := tb.Expire()
				v, _ := tb.Peek(k(1))
				if v != tc.left || (len(gone) == 1) != (tc.name == "untouched goes") {
					t.Fatalf("left %q, expired %+v", v, gone)
				}
			})
		})
	}
}

// The clock is the one the table is given.
func TestInjectedClock(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tb := New[key](Config[string]{TTL: time.Minute, Now: func() time.Time { return now }})
	tb.Insert(k(1), "v")
	now = now.Add(time.Minute - 1)
	if len(tb.Expire()) != 0 {
		t.Fatal("expired early")
	}
	now = now.Add(1)
	if gone := tb.Expire(); len(gone) != 1 || !gone[0].LastHit.Equal(now.Add(-time.Minute)) {
		t.Fatalf("expired %+v", gone)
	}
	// A packet's own time, read once, stamps what it inserts and hits.
	at := now.Add(time.Hour)
	tb.InsertAt(k(2), "v", at)
	if len(tb.ExpireAt(at.Add(time.Minute-1))) != 0 || len(tb.ExpireAt(at.Add(time.Minute))) != 1 {
		t.Fatal("InsertAt did not stamp the entry with its time")
	}
}

// A full table refuses a new flow with a typed error and changes nothing
// (flow_table.rs:233-237, 355); replacing a flow it has needs no room.
func TestFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](Config[string]{Limit: 3})
		for p := uint16(1); p <= 3; p++ {
			if _, replaced, err := tb.Insert(k(p), "v"); err != nil || replaced {
				t.Fatalf("insert %d: %v, %v", p, replaced, err)
			}
		}
		_, _, err := tb.Insert(k(4), "v")
		var full *FullError
		if !errors.Is(err, ErrFull) || !errors.As(err, &full) || full.Limit != 3 {
			t.Fatalf("insert into full table: %v", err)
		}
		if _, ok := tb.Peek(k(4)); ok || tb.Len() != 3 {
			t.Fatalf("full table changed: %d entries", tb.Len())
		}
		old, replaced, err := tb.Insert(k(2), "w")
		if err != nil || !replaced || old.Value != "v" || old.Key != k(2) {
			t.Fatalf("replace in full table: %+v, %v, %v", old, replaced, err)
		}
		if v, _ := tb.Peek(k(2)); v != "w" {
			t.Fatalf("replaced value = %q", v)
		}
		if New[key](Config[int]{}).Limit() != DefaultLimit || DefaultLimit != 8192 || PortLimit != 1<<19 {
			t.Fatal("limits differ from OPTE's (flow_table.rs:41, xde.rs:334)")
		}
	})
}

// A full table evicts the entry of highest priority, and among equals the
// one idle longest; protected entries never go (flow_table.rs:359-409 and
// its tests eviction_basics and eviction_selects_highest_prio, :943-1055).
func TestEviction(t *testing.T) {
	prio := map[uint16]Priority{1: MinEvictable, 2: 16, 3: 16, 4: Protected}
	for _, tc := range []struct {
		name   string
		evict  bool
		hit    uint16 // hit after the others were inserted
		want   uint16 // evicted, or 0 for a refusal
		policy map[uint16]Priority
	}{
		{name: "no policy refuses", want: 0},
		{name: "highest priority, oldest first", evict: true, policy: prio, want: 2},
		{name: "a recent hit spares the older", evict: true, policy: prio, hit: 2, want: 3},
		{name: "all protected refuses", evict: true, policy: map[uint16]Priority{}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config[uint16]{Limit: 4}
				if tc.evict {
					cfg.Evict = func(v uint16, _ time.Duration) Priority { return tc.policy[v] }
				}
				tb := New[key](cfg)
				for p := uint16(1); p <= 4; p++ {
					tb.Insert(k(p), p)
					time.Sleep(time.Second)
				}
				if tc.hit != 0 {
					tb.Lookup(k(tc.hit))
				}
				gone, evicted, err := tb.Insert(k(5), 5)
				if tc.want == 0 {
					if !errors.Is(err, ErrFull) || evicted || tb.Len() != 4 {
						t.Fatalf("got %+v, %v, %v; want a refusal", gone, evicted, err)
					}
					return
				}
				if err != nil || !evicted || gone.Key != k(tc.want) || gone.Value != tc.want {
					t.Fatalf("got %+v, %v, %v; want %d evicted", gone, evicted, err, tc.want)
				}
				if _, ok := tb.Peek(k(5)); !ok || tb.Len() != 4 {
					t.Fatal("new flow not in, or table grew")
				}
			})
		})
	}
}

// Remove and Clear return what they took (a rule change clears the
// firewall layer's table, layer.rs:1545).
func TestRemoveClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](Config[string]{})
		for p := uint16(1); p <= 3; p++ {
			tb.Insert(k(p), "v")
		}
		if e, ok := tb.Remove(k(2)); !ok || e.Key != k(2) {
			t.Fatalf("remove = %+v, %v", e, ok)
		}
		if _, ok := tb.Remove(k(2)); ok {
			t.Fatal("removed twice")
		}
		if _, ok := tb.Lookup(k(2)); ok {
			t.Fatal("removed flow found")
		}
		if got := ports(tb.Clear()); !slices.Equal(got, []uint16{1, 3}) {
			t.Fatalf("clear took %v", got)
		}
		if tb.Len() != 0 {
			t.Fatal("not empty after clear")
		}
		if _, _, err := tb.Insert(k(1), "again"); err != nil {
			t.Fatal(err)
		}
	})
}

// Inherit only moves a last hit forward (flow_table.rs:153-163).
func TestInherit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tb := New[key](Config[string]{})
		start := time.Now()
		tb.Insert(k(1), "v")
		time.Sleep(50 * time.Second)
		if !tb.Inherit(k(1), start.Add(30*time.Second)) {
			t.Fatal("inherit on a present flow said absent")
		}
		tb.Inherit(k(1), start.Add(10*time.Second)) // earlier: ignored
		if tb.Inherit(k(9), time.Now()) {
			t.Fatal("inherit on an absent flow said present")
		}
		time.Sleep(39 * time.Second) // 89 s: 59 s since the inherited hit
		if gone := tb.Expire(); len(gone) != 0 {
			t.Fatalf("expired early: %+v", gone)
		}
		time.Sleep(time.Second)
		if gone := tb.Expire(); len(gone) != 1 || !gone[0].LastHit.Equal(start.Add(30*time.Second)) {
			t.Fatalf("expired %+v, want the flow last hit at 30 s", gone)
		}
	})
}

// A layer's flow lives while flows of other tables depend on it, then
// inherits the last of their hits and idles out from there (OPTE's
// timer_expiry_propagation test, flow_table.rs:908-941).
func TestDependents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type layerFlow struct{ children *atomic.Int32 }
		lft := New[key](Config[layerFlow]{TTLOf: func(v layerFlow) time.Duration {
			if v.children.Load() > 0 {
				return math.MaxInt64
			}
			return DefaultTTL
		}})
		tcp := New[key](TCPConfig(0, nil))
		var children atomic.Int32
		lft.Insert(k(1), layerFlow{&children})
		e, _, _ := NewTCPEntry(Out, ACK, 1, 1)
		tcp.Insert(k(1), e)
		children.Add(1)

		time.Sleep(time.Hour) // the connection idles, its NAT flow with it
		tcp.Lookup(k(1))
		lastHit := time.Now()
		if len(lft.Expire()) != 0 {
			t.Fatal("layer flow expired under a live TCP flow")
		}
		time.Sleep(TCPKeepaliveTTL)
		gone := tcp.Expire()
		if len(gone) != 1 {
			t.Fatal("TCP flow did not expire")
		}
		children.Add(-1)
		lft.Inherit(k(1), gone[0].LastHit)
		if len(lft.ExpireAt(lastHit.Add(DefaultTTL-1))) != 0 {
			t.Fatal("layer flow expired before a TTL past its child's last hit")
		}
		if got := lft.ExpireAt(lastHit.Add(DefaultTTL)); len(got) != 1 || !got[0].LastHit.Equal(lastHit) {
			t.Fatalf("layer flow expired as %+v, want last hit %v", got, lastHit)
		}
	})
}

// A port's two directions, its sweeper and the control plane use one table
// at once; run under -race.
func TestConcurrentUse(t *testing.T) {
	tb := New[key](Config[int]{Limit: 512, TTL: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				p := uint16(i % 600)
				switch (g + i) % 4 {
				case 0:
					tb.Insert(k(p), i)
				case 1:
					tb.Lookup(k(p))
				case 2:
					tb.Remove(k(p))
				default:
					if i%100 == 0 {
						tb.Expire()
						tb.Inherit(k(p), time.Now())
					}
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			tb.Clear()
			tb.Entries()
		}
	})
	wg.Wait()
	if n := tb.Len(); n > 512 {
		t.Fatalf("%d entries, limit 512", n)
	}
}

// Each shard fills one cache line, so two cores' lookups on different
// shards do not share one.
func TestShardSize(t *testing.T) {
	if n := unsafe.Sizeof(shard[key, int]{}); n != 64 {
		t.Fatalf("shard is %d bytes, want 64", n)
	}
}
