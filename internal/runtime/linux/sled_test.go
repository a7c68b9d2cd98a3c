package linux_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/runtime/linux"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/supervise"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// sibling is a runtime of another sled with e's tag, namespace prefix and
// run dir, and a data dir of its own: what a second agent pointed at another
// data dir is. e's cleanup removes whatever it leaves.
func (e *env) sibling(t *testing.T) *env {
	t.Helper()
	s := &env{t: t, tag: e.tag, prefix: e.prefix, run: e.run, dir: t.TempDir(), sled: uuid.NewString()}
	rt, err := linux.New(linux.Options{DataDir: s.dir, RunDir: s.run, Tag: s.tag, Sled: s.sled, NetnsPrefix: s.prefix})
	if err != nil {
		t.Fatal(err)
	}
	s.rt = rt
	return s
}

// zoneParts is what of a zone's can be seen from outside its root: its
// namespace, its underlay link, and the PIDs of its supervisor and service.
type zoneParts struct {
	netns, link bool
	runsv, svc  int
}

func partsOf(t *testing.T, e *env, s zone.Spec) zoneParts {
	t.Helper()
	u, _ := zonenet.LinkNames(e.tag, s.ID)
	_, links, err := zonenet.List(e.prefix, e.tag)
	if err != nil {
		t.Fatal(err)
	}
	p := zoneParts{
		netns: zonenet.NetnsExists(e.prefix + s.Name),
		link:  slices.ContainsFunc(links, func(l zonenet.Link) bool { return l.Name == u }),
	}
	svc := serviceDir(t, e, s)
	if st, err := supervise.Status(svc); err == nil && st.Up {
		p.svc = st.PID
	}
	if r, found, err := supervise.Find(svc); err == nil && found {
		p.runsv = r.PID
		r.Close()
	}
	return p
}

// Two sleds with one tag, one after the other on a host (or a teardown
// pointed at the other's data dir): neither's Sweep, Destroy or Owned
// touches or claims the other's zones.
func TestSweepAndDestroyLeaveAnotherSledsZonesAlone(t *testing.T) {
	a := newEnv(t, nil)
	b := a.sibling(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	za, zb := spec(0x61), spec(0x62)
	a.ensure(za)
	b.ensure(zb)
	before := map[string]zoneParts{za.Name: partsOf(t, a, za), zb.Name: partsOf(t, b, zb)}
	for name, p := range before {
		if !p.netns || !p.link || p.runsv == 0 || p.svc == 0 {
			t.Fatalf("zone %s is not whole: %+v", name, p)
		}
	}

	for _, e := range []*env{b, a} {
		if lines, err := e.rt.Sweep(ctx); len(lines) != 0 || err != nil {
			t.Errorf("sled %s's Sweep: %q, %v", e.sled, lines, err)
		}
	}
	// Each destroys the other's zone by name: it has no root there, and
	// the zone's claim names the other sled.
	if err := b.rt.Destroy(ctx, za.Name); err != nil {
		t.Errorf("Destroy of the other sled's zone: %v", err)
	}
	if err := a.rt.Destroy(ctx, zb.Name); err != nil {
		t.Errorf("Destroy of the other sled's zone: %v", err)
	}
	for _, c := range []struct {
		e *env
		s zone.Spec
	}{{a, za}, {b, zb}} {
		if now := partsOf(t, c.e, c.s); now != before[c.s.Name] {
			t.Errorf("zone %s was %+v, is %+v", c.s.Name, before[c.s.Name], now)
		}
		healthy(t, c.s)
		owned, err := c.e.rt.Owned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(owned.Zones) != 1 || owned.Zones[0].Name != c.s.Name ||
			!slices.Equal(owned.Namespaces, []string{c.e.prefix + c.s.Name}) ||
			len(owned.Links) != 1 || owned.Links[0].ZoneID != c.s.ID ||
			len(owned.Processes) != 1 || owned.Processes[0].PID != before[c.s.Name].svc {
			t.Errorf("sled %s owns %+v, want only zone %s", c.e.sled, owned, c.s.Name)
		}
	}

	// Its own zone, each destroys.
	if err := b.rt.Destroy(ctx, zb.Name); err != nil {
		t.Fatal(err)
	}
	if p := partsOf(t, b, zb); p != (zoneParts{}) {
		t.Errorf("zone %s left %+v", zb.Name, p)
	}
	if now := partsOf(t, a, za); now != before[za.Name] {
		t.Errorf("zone %s was %+v, is %+v", za.Name, before[za.Name], now)
	}
}

// Parts that no claim proves ours (the previous version wrote none) are
// left alone unless a root in our own data dir says they are ours; such a
// zone gets its claim, so that the other sled then knows it is not its own.
func TestSweepGoesByLocationWithoutClaims(t *testing.T) {
	a := newEnv(t, nil)
	b := a.sibling(t)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	old, litter := spec(0x63), spec(0x64)
	// A zone of a's made by the previous version: a mark without a sled,
	// its namespace and link, no claim.
	writeFile(t, filepath.Join(rootOf(a, old), "zone.json"),
		`{"tag": "`+a.tag+`", "id": "`+old.ID+`", "name": "`+old.Name+`", "netns": "`+a.prefix+old.Name+`"}`)
	ensureNet(t, ctx, a.prefix+old.Name, a.tag, old)
	// Parts of a zone whose root is nowhere, without a claim: no one's we
	// can prove, such as the previous version of another sled's.
	ensureNet(t, ctx, a.prefix+litter.Name, a.tag, litter)
	strayDir := filepath.Join(a.run, a.tag, spec(0x65).Name)
	straySleep := startSleep(t, supervise.MarkerEnv+"="+strayDir)

	for _, e := range []*env{a, b, a} {
		if lines, err := e.rt.Sweep(ctx); len(lines) != 0 || err != nil {
			t.Errorf("sled %s's Sweep: %q, %v", e.sled, lines, err)
		}
	}
	for _, s := range []zone.Spec{old, litter} {
		if p := partsOf(t, a, s); !p.netns || !p.link {
			t.Errorf("zone %s's parts were removed: %+v", s.Name, p)
		}
	}
	if !running(straySleep) {
		t.Errorf("process %d, which no claim proves ours, was killed", straySleep)
	}
	if o, ok := a.observed(old.Name); !ok {
		t.Errorf("List does not show the zone of the previous version's mark: %+v", o)
	}
	// a's sweep claimed the old zone as a's.
	var c struct {
		Sled string `json:"sled_id"`
	}
	raw, err := os.ReadFile(filepath.Join(a.run, a.tag, old.Name, linux.ClaimFile))
	if err == nil {
		err = json.Unmarshal(raw, &c)
	}
	if err != nil || c.Sled != a.sled {
		t.Errorf("claim of %s: %s, %v; want sled %s", old.Name, raw, err, a.sled)
	}
	if _, err := os.Stat(filepath.Join(a.run, a.tag, litter.Name)); err == nil {
		t.Errorf("a claim was written for %s, which no root proves ours", litter.Name)
	}
	owned, err := b.rt.Owned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(owned.Zones)+len(owned.Namespaces)+len(owned.Links)+len(owned.Processes) != 0 {
		t.Errorf("sled b owns %+v", owned)
	}
	// The litter goes with the test, as another agent's would go with
	// its own teardown.
	t.Cleanup(func() { zonenet.Remove(context.Background(), a.prefix+litter.Name, a.tag, litter.ID) })
	// Destroy goes by the root: a's old zone goes.
	if err := a.rt.Destroy(ctx, old.Name); err != nil {
		t.Fatal(err)
	}
	if p := partsOf(t, a, old); p.netns || p.link {
		t.Errorf("zone %s left %+v", old.Name, p)
	}
}
