package linux

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

func TestImagesBothForms(t *testing.T) {
	doc := `{
		"crucible": ["/usr/bin/crucible-downstairs", "run", "--address", "{listen}"],
		"clickhouse": {"command": ["/opt/ch", "--listen", "{listen}"]},
		"nexus": {"command": ["/opt/nexus"], "ready": {"http": {"path": "/healthz", "status": 204}}},
		"oximeter": {"command": ["/opt/ox"], "ready": {"tcp": {}}},
		"cockroach_db": {"command": ["/opt/crdb"], "ready": {"command": ["/opt/probe", "{addr}", "{port}"]}},
		"internal_dns": {"command": ["/opt/dns"], "ready": null}
	}`
	var got Images
	if err := json.Unmarshal([]byte(doc), &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Images{
		"crucible":     {Command: []string{"/usr/bin/crucible-downstairs", "run", "--address", "{listen}"}},
		"clickhouse":   {Command: []string{"/opt/ch", "--listen", "{listen}"}},
		"nexus":        {Command: []string{"/opt/nexus"}, Ready: Ready{HTTP: &HTTPReady{Path: "/healthz", Status: 204}}},
		"oximeter":     {Command: []string{"/opt/ox"}, Ready: Ready{TCP: &TCPReady{}}},
		"cockroach_db": {Command: []string{"/opt/crdb"}, Ready: Ready{Command: []string{"/opt/probe", "{addr}", "{port}"}}},
		"internal_dns": {Command: []string{"/opt/dns"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v\nwant    %+v", got, want)
	}
	// What the agent writes (the crash test does) reads back the same.
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var again Images
	if err := json.Unmarshal(b, &again); err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("round trip of %s: %+v, %v", b, again, err)
	}
}

// A bad image is refused with an error naming the zone type and the field.
func TestImagesBad(t *testing.T) {
	for _, c := range []struct {
		doc  string
		want []string
	}{
		// Shape: refused when the config file is read.
		{`{"crucible": "/usr/bin/x"}`, []string{`"crucible"`}},
		{`{"crucible": [1, 2]}`, []string{`"crucible"`, "command"}},
		{`{"crucible": {"cmd": ["/x"]}}`, []string{`"crucible"`, `unknown field "cmd"`}},
		{`{"crucible": {"command": ["/x"], "ready": {}}}`, []string{`"crucible"`, "ready", "want one of tcp, http, command"}},
		{`{"crucible": {"command": ["/x"], "ready": {"udp": {}}}}`, []string{`"crucible"`, "ready", `unknown field "udp"`}},
		{`{"crucible": {"command": ["/x"], "ready": {"http": {"path": "/", "staus": 200}}}}`, []string{`"crucible"`, "ready", `unknown field "staus"`}},
		{`{"crucible": {"command": ["/x"], "ready": {"tcp": {"port": 1}}}}`, []string{`"crucible"`, "ready", `unknown field "port"`}},
		{`{"crucible": {"command": ["/x"], "ready": {"http": {"status": "200"}}}}`, []string{`"crucible"`, "ready"}},
		// Values: refused when the agent starts.
		{`{"crucible": []}`, []string{`"crucible"`, "command: want a non-empty command"}},
		{`{"crucible": {"ready": {"tcp": {}}}}`, []string{`"crucible"`, "command: want a non-empty command"}},
		{`{"sled_agent": ["/x"]}`, []string{`"sled_agent"`, "not a known zone type"}},
		{`{"crucible": {"command": ["/x"], "ready": {"tcp": {}, "http": {}}}}`, []string{`"crucible"`, "ready: want one of tcp, http, command, not several"}},
		{`{"crucible": {"command": ["/x"], "ready": {"http": {"path": "healthz"}}}}`, []string{`"crucible"`, "ready.http.path", "healthz"}},
		{`{"crucible": {"command": ["/x"], "ready": {"http": {"path": "/a b"}}}}`, []string{`"crucible"`, "ready.http.path"}},
		{`{"crucible": {"command": ["/x"], "ready": {"http": {"status": 42}}}}`, []string{`"crucible"`, "ready.http.status 42"}},
		{`{"crucible": {"command": ["/x"], "ready": {"command": []}}}`, []string{`"crucible"`, "ready.command: want a non-empty command"}},
		{`{"crucible": {"command": ["/x"], "ready": {"command": ["probe", "{addr}"]}}}`, []string{`"crucible"`, `ready.command[0] "probe"`, "absolute path"}},
		{`{"crucible": {"command": ["/x"], "ready": {"command": ["/probe", "a\u0000b"]}}}`, []string{`"crucible"`, "ready.command[1]", "NUL"}},
	} {
		var m Images
		err := json.Unmarshal([]byte(c.doc), &m)
		if err == nil {
			err = m.Validate()
		}
		if err == nil {
			t.Errorf("%s: accepted", c.doc)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.doc, err, w)
			}
		}
	}
}

// NTP zones run ntp-zone by default, with --no-clock when the runtime says
// so, unless Images gives their kind another image; other kinds are not
// affected.
func TestNTPImage(t *testing.T) {
	ntp := func(kind string) zone.Spec {
		z := sledconfigtest.Crucible(3)
		z.ZoneType = sledconfig.ZoneType{Type: kind, Address: "[fd00:1122:3344:101::21]:123"}
		return zone.SpecFor(&z)
	}
	addr := netip.MustParseAddrPort("[fd00:1122:3344:101::21]:123")
	want := []string{"/agent", "ntp-zone", "--listen", "[fd00:1122:3344:101::21]:123", "--root", "/root", "--tag", "zt1"}
	for _, c := range []struct {
		opts Options
		kind string
		want []string
	}{
		{Options{}, "boundary_ntp", want},
		{Options{}, "internal_ntp", want},
		{Options{NTPNoClock: true}, "internal_ntp", append(slices.Clone(want), "--no-clock")},
		{Options{NTPNoClock: true, Images: map[string]Image{"boundary_ntp": {Command: []string{"/opt/ntp", "{tag}"}}}}, "boundary_ntp", []string{"/opt/ntp", "zt1"}},
		{Options{NTPNoClock: true}, "crucible", nil},
	} {
		r := &Runtime{opts: c.opts}
		s := ntp(c.kind)
		img := r.imageFor(s)
		got, err := img.expand(s, addr, "/agent", "/root", "zt1")
		if err != nil {
			t.Fatal(err)
		}
		if c.want == nil {
			if got[1] != "zone-service" {
				t.Errorf("%s: %q, want the default image", c.kind, got)
			}
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %+v: %q, want %q", c.kind, c.opts, got, c.want)
		}
		if _, override := c.opts.Images[c.kind]; !override && !img.Ready.zoneService {
			t.Errorf("%s: NTPImage is not ready on the zone service's health", c.kind)
		}
	}
	if NTPImage.Command[len(NTPImage.Command)-1] == "--no-clock" {
		t.Error("NTPNoClock changed NTPImage itself")
	}
}
