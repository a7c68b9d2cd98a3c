package zonenet

import (
	"testing"

	"github.com/vishvananda/netlink"
)

// An Inspector says what Inspect says of complete zones and of a zone made
// after its look; a part lost after its look, the next look sees.
func TestInspector(t *testing.T) {
	e := newEnv(t)
	plain, nic, later := e.config(false), e.config(true), e.config(false)
	mustEnsure(t, plain)
	mustEnsure(t, nic)
	in, err := NewInspector()
	if err != nil {
		t.Fatal(err)
	}
	// The zones it saw are complete in its view alone, with no second look.
	for _, c := range []Config{plain, nic} {
		if p, err := inspect(c, &in.view); err != nil || !p.Complete() {
			t.Errorf("view of %s: %v, %v; want complete", c.Netns, p, err)
		}
	}
	mustEnsure(t, later)
	for _, c := range []Config{plain, nic, later} {
		p, err := in.Inspect(c)
		if err != nil || !p.Complete() {
			t.Errorf("Inspector on %s: %v, %v; want complete", c.Netns, p, err)
		}
	}

	// The host route of plain goes.
	up, _ := pairs(plain.Tag, plain.ZoneID)
	hl := hostLink(t, up.host)
	if err := netlink.RouteDel(hostRouteTo(hl, plain.Underlay)); err != nil {
		t.Fatal(err)
	}
	want, err := Inspect(plain)
	if err != nil || want.Route || want.Complete() {
		t.Fatalf("Inspect after the route went: %+v, %v", want, err)
	}
	if in, err = NewInspector(); err != nil {
		t.Fatal(err)
	}
	if got, err := in.Inspect(plain); err != nil || got != want {
		t.Errorf("Inspector after the route went: %+v, %v; want %+v", got, err, want)
	}
	if got, err := in.Inspect(nic); err != nil || !got.Complete() {
		t.Errorf("Inspector on the other zone: %+v, %v; want complete", got, err)
	}
	if _, err := in.Inspect(Config{Netns: "../x"}); err == nil {
		t.Error("Inspector accepted an invalid config")
	}
}
