package rules

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/uuid"
)

var (
	systemRouter = uuid.MustParse("5e5e0c5e-0000-4000-8000-000000000001")
	otherRouter  = uuid.MustParse("5e5e0c5e-0000-4000-8000-000000000002")
)

// TestRouterKeys follows omicron illumos-utils/src/opte/port.rs:144-162.
func TestRouterKeys(t *testing.T) {
	v4, v6 := pfx("172.30.0.0/22"), pfx("fd77:e9d2:9cd9:2::/64")
	cases := []struct {
		name   string
		v4, v6 netip.Prefix
		want   []RouterID
	}{
		{"v4", v4, netip.Prefix{}, []RouterID{SystemRouter(7777), CustomRouter(7777, v4)}},
		{"v6", netip.Prefix{}, v6, []RouterID{SystemRouter(7777), CustomRouter(7777, v6)}},
		{"dual stack", v4, v6, []RouterID{SystemRouter(7777), CustomRouter(7777, v4), CustomRouter(7777, v6)}},
	}
	for _, c := range cases {
		if got := RouterKeys(7777, c.v4, c.v6); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if SystemRouter(1).Class() != System || CustomRouter(1, v4).Class() != Custom {
		t.Error("classes of ids")
	}
}

// TestAcceptanceS1S2: GET /vpc-routes after A's port exists, then S2's
// push, then the same push at version 2 (VPC.md §4.3).
func TestAcceptanceS1S2(t *testing.T) {
	rs := NewRouteSets()
	keys := RouterKeys(7777, pfx("172.30.0.0/22"), netip.Prefix{})
	init := rs.AddPort(keys, false)
	if len(init) != 2 || len(init[0].Routes) != 0 || len(init[1].Routes) != 0 {
		t.Fatalf("an instance port starts with %+v, want empty sets", init)
	}
	listed, _ := json.Marshal(rs.List())
	want := `[{"id":{"vni":7777,"kind":{"type":"system"}},"version":null},{"id":{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}},"version":null}]`
	if string(listed) != want {
		t.Errorf("GET /vpc-routes\n got %s\nwant %s", listed, want)
	}

	var sets []RouteSet
	if err := json.Unmarshal([]byte(s2Routes), &sets); err != nil {
		t.Fatal(err)
	}
	res := rs.Ensure(sets)
	if len(res.Deltas) != 1 || res.Deltas[0].ID != SystemRouter(7777) || len(res.Deltas[0].Add) != 3 || len(res.Deltas[0].Del) != 0 {
		t.Fatalf("deltas %+v", res.Deltas)
	}
	st := rs.List()
	if st[0].Version == nil || *st[0].Version != (RouterVersion{RouterID: systemRouter, Version: 3}) || st[1].Version != nil {
		t.Errorf("versions after S2: %+v", st)
	}
	// The port's table after the delta routes A to B's subnet.
	tb, err := NewTable().Apply(System, res.Deltas[0].Del, res.Deltas[0].Add)
	if err != nil {
		t.Fatal(err)
	}
	if f := out("172.30.0.6"); tb.Lookup(&f).Target != SubnetTarget(pfx("172.30.0.0/22")) {
		t.Errorf("A to B: %+v", tb.Lookup(&f))
	}

	// Same body at version 2: skipped, nothing changes.
	sets[0].Version.Version = 2
	sets[0].Routes = sets[0].Routes[:1]
	res = rs.Ensure(sets)
	if len(res.Deltas) != 0 || !slices.Equal(res.Skipped, []RouterID{SystemRouter(7777)}) {
		t.Errorf("version 2 after 3: %+v", res)
	}
	if routes, v, _ := rs.Routes(SystemRouter(7777)); len(routes) != 3 || v.Version != 3 {
		t.Errorf("after the skipped push: %v at %+v", routes, v)
	}
}

// TestVersionGate is vpc_routes_ensure's gate
// (omicron illumos-utils/src/opte/port_manager.rs:594-612) with
// RouterVersion::is_replaced_by (common/src/api/internal/shared/mod.rs:206-208).
func TestVersionGate(t *testing.T) {
	v := func(id uuid.UUID, n uint64) *RouterVersion { return &RouterVersion{RouterID: id, Version: n} }
	cases := []struct {
		name     string
		old, new *RouterVersion
		applied  bool
	}{
		{"no versions", nil, nil, true},
		{"first version", nil, v(systemRouter, 1), true},
		{"version dropped", v(systemRouter, 3), nil, true},
		{"higher version", v(systemRouter, 3), v(systemRouter, 4), true},
		{"same version", v(systemRouter, 3), v(systemRouter, 3), false},
		{"lower version", v(systemRouter, 3), v(systemRouter, 2), false},
		{"other router, lower version", v(systemRouter, 3), v(otherRouter, 1), true},
	}
	r1 := Route{Dest: pfx("10.0.0.0/8"), Target: DropTarget()}
	r2 := Route{Dest: pfx("0.0.0.0/0"), Target: SystemIGW()}
	id := CustomRouter(7777, pfx("172.30.0.0/22"))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := NewRouteSets()
			rs.AddPort([]RouterID{id}, false)
			rs.Ensure([]RouteSet{{ID: id, Version: c.old, Routes: []Route{r1}}})
			res := rs.Ensure([]RouteSet{{ID: id, Version: c.new, Routes: []Route{r2}}})
			routes, ver, _ := rs.Routes(id)
			if c.applied {
				want := Delta{ID: id, Add: []Route{r2}, Del: []Route{r1}}
				if len(res.Deltas) != 1 || !slices.Equal(res.Deltas[0].Add, want.Add) || !slices.Equal(res.Deltas[0].Del, want.Del) || len(res.Skipped) != 0 {
					t.Errorf("result %+v, want the delta %+v", res, want)
				}
				if !slices.Equal(routes, []Route{r2}) || !equalVersion(ver, c.new) {
					t.Errorf("recorded %v at %+v, want %v at %+v", routes, ver, r2, c.new)
				}
			} else {
				if len(res.Deltas) != 0 || !slices.Equal(res.Skipped, []RouterID{id}) {
					t.Errorf("result %+v, want the set skipped", res)
				}
				if !slices.Equal(routes, []Route{r1}) || !equalVersion(ver, c.old) {
					t.Errorf("recorded %v at %+v, want it unchanged", routes, ver)
				}
			}
		})
	}
}

func equalVersion(a, b *RouterVersion) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func TestEnsureIdsAndDeltas(t *testing.T) {
	rs := NewRouteSets()
	id := SystemRouter(7777)
	rs.AddPort([]RouterID{id}, false)
	a := Route{Dest: pfx("10.0.0.0/8"), Target: DropTarget()}
	b := Route{Dest: pfx("0.0.0.0/0"), Target: SystemIGW()}
	c := Route{Dest: pfx("::/0"), Target: SystemIGW()}
	rs.Ensure([]RouteSet{{ID: id, Routes: []Route{a, b}}})

	// Ids the sled has no port for are ignored (port_manager.rs:584-587).
	other := SystemRouter(8888)
	res := rs.Ensure([]RouteSet{{ID: other, Routes: []Route{a}}})
	if !slices.Equal(res.Ignored, []RouterID{other}) || len(res.Deltas) != 0 {
		t.Errorf("unknown id: %+v", res)
	}
	if _, _, ok := rs.Routes(other); ok {
		t.Error("an ignored id was recorded")
	}
	// Full replace: the delta is the difference, duplicates in the sent
	// list count once.
	res = rs.Ensure([]RouteSet{{ID: id, Routes: []Route{b, c, c}}})
	if len(res.Deltas) != 1 || !slices.Equal(res.Deltas[0].Add, []Route{c}) || !slices.Equal(res.Deltas[0].Del, []Route{a}) {
		t.Errorf("replace: %+v", res.Deltas)
	}
	// The same set again: no delta.
	if res = rs.Ensure([]RouteSet{{ID: id, Routes: []Route{c, b}}}); len(res.Deltas) != 0 {
		t.Errorf("same set: %+v", res.Deltas)
	}
	// An id twice in one call: one delta, to its final routes.
	res = rs.Ensure([]RouteSet{{ID: id, Routes: []Route{a}}, {ID: id, Routes: []Route{a, b}}})
	if len(res.Deltas) != 1 || !slices.Equal(res.Deltas[0].Add, []Route{a}) || !slices.Equal(res.Deltas[0].Del, []Route{c}) {
		t.Errorf("id twice: %+v", res.Deltas)
	}
}

// TestServicePort: a service port's new ids start with the system IGW
// routes, custom ids included (port_manager.rs:478-557), so its table
// routes everywhere before Nexus pushes anything (VPC.md §4.3 S7).
func TestServicePort(t *testing.T) {
	rs := NewRouteSets()
	keys := RouterKeys(100, pfx("172.30.3.0/24"), netip.Prefix{})
	init := rs.AddPort(keys, true)
	tb := NewTable()
	for _, kr := range init {
		if !slices.Equal(kr.Routes, InitialRoutes(true)) {
			t.Errorf("%s starts with %v", kr.ID, kr.Routes)
		}
		var err error
		if tb, err = tb.Apply(kr.ID.Class(), nil, kr.Routes); err != nil {
			t.Fatal(err)
		}
	}
	for _, dst := range []string{"198.51.100.1", "2001:db8::1"} {
		f := out(dst)
		if got := tb.Lookup(&f); got.Action != Allow || got.Target != SystemIGW() || tb.Entries()[got.Entry].Class != Custom {
			t.Errorf("%s: %+v", dst, got)
		}
	}
	if len(tb.Entries()) != 4 {
		t.Errorf("entries %v", tb.Entries())
	}
	// An instance port in the same VPC later finds the sets as they are.
	if again := rs.AddPort(keys, false); len(again[0].Routes) != 2 {
		t.Errorf("second port: %+v", again)
	}
	if len(InitialRoutes(false)) != 0 {
		t.Error("instance ports start with routes")
	}
}

// TestRemovePort: an id is forgotten, version and all, when its last port
// goes (port_manager.rs:1180-1207).
func TestRemovePort(t *testing.T) {
	rs := NewRouteSets()
	keys := RouterKeys(7777, pfx("172.30.0.0/22"), netip.Prefix{})
	rs.AddPort(keys, false)
	rs.AddPort(keys[:1], false)
	rs.Ensure([]RouteSet{{ID: keys[0], Version: &RouterVersion{RouterID: systemRouter, Version: 3}, Routes: []Route{{Dest: pfx("0.0.0.0/0"), Target: SystemIGW()}}}})
	rs.RemovePort(keys)
	if got := rs.List(); len(got) != 1 || got[0].ID != keys[0] || got[0].Version.Version != 3 {
		t.Errorf("after one of two ports: %+v", got)
	}
	rs.RemovePort(keys[:1])
	rs.RemovePort(keys[:1])
	if got := rs.List(); len(got) != 0 {
		t.Errorf("after both ports: %+v", got)
	}
	// A new port starts over.
	rs.AddPort(keys[:1], false)
	if _, v, _ := rs.Routes(keys[0]); v != nil {
		t.Errorf("a forgotten id kept version %+v", v)
	}
}
