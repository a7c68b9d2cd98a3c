package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// faultedSled is a sled over the sim with two disks in its machine and a
// running NTP zone, so that every member of the fault map shows.
type faultedSled struct {
	*sled
	disks [2]storage.DiskIdentity
	ntp   http.RoundTripper
}

func newFaultedSled(t *testing.T) *faultedSled {
	t.Helper()
	s := &faultedSled{sled: newSled(t, sim.Options{})}
	for i := range s.disks {
		s.disks[i] = storage.DiskIdentity{Vendor: "synthetic-vendor", Model: "synthetic-model-U2", Serial: "fault-serial-" + string(rune('a'+i))}
	}
	if err := s.rt.AddDisks(s.disks[:]...); err != nil {
		t.Fatal(err)
	}
	// The second disk holds a pool, for ensure faults to show on.
	if err := s.rt.CreatePool(t.Context(), s.disks[1], sledconfigtest.Pool(7)); err != nil {
		t.Fatal(err)
	}
	ntp := sledconfigtest.InternalNTP(0)
	if err := s.rt.Ensure(t.Context(), zone.SpecFor(&ntp)); err != nil {
		t.Fatal(err)
	}
	s.ntp = s.rt.NTPAdmin(func(netip.Addr) (string, bool) { return ntp.Name(), true })
	return s
}

func (s *faultedSled) putFaults(body string) response {
	s.t.Helper()
	return s.do(http.MethodPut, "/debug/sim/faults", []byte(body))
}

// present lists the serials of the disks in the simulated machine.
func (s *faultedSled) present() map[string]bool {
	s.t.Helper()
	disks, err := s.rt.Disks(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, d := range disks {
		out[d.Identity.Serial] = true
	}
	return out
}

// synced says what the NTP zone's ntp-admin answers.
func (s *faultedSled) synced() bool {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://[fd00::1]:10123/timesync", nil)
	req.Header.Set("api-version", timesync.APIVersion)
	resp, err := s.ntp.RoundTrip(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ Sync bool }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		s.t.Fatal(err)
	}
	return v.Sync
}

// ensureFails says whether a call on the second disk's pool fails with the
// injected fault.
func (s *faultedSled) ensureFails() bool {
	s.t.Helper()
	_, err := s.rt.OpenPool(context.Background(), s.disks[1], sledconfigtest.Pool(7))
	if err != nil && !errors.Is(err, sim.ErrInjected) {
		s.t.Fatalf("opening the pool: %v", err)
	}
	return err != nil
}

// Every member of the fault map may come alone, as the docs show them,
// and takes effect; the whole map is replaced each time.
func TestSimFaultsEachMemberAlone(t *testing.T) {
	s := newFaultedSled(t)
	a, b := s.disks[0], s.disks[1]
	if !s.synced() || !s.present()[a.Serial] || !s.present()[b.Serial] {
		t.Fatalf("before any fault: synced %v, present %v", s.synced(), s.present())
	}

	if r := s.putFaults(`{"timesync": {"synced": false}}`); r.status != http.StatusNoContent {
		t.Fatalf("timesync alone: %d %s", r.status, r.body)
	}
	if s.synced() {
		t.Errorf("timesync synced false: the NTP zone says synchronized")
	}

	if r := s.putFaults(`{"disks": {"` + a.Serial + `": {"present": false}, "` + b.Serial + `": {"ensure": "fail"}}}`); r.status != http.StatusNoContent {
		t.Fatalf("disks alone: %d %s", r.status, r.body)
	}
	if p := s.present(); p[a.Serial] || !p[b.Serial] {
		t.Errorf("disk %s pulled: present %v", a.Serial, p)
	}
	if !s.ensureFails() {
		t.Errorf("disk %s ensure fail: a pool call on it succeeded", b.Serial)
	}
	if !s.synced() {
		t.Errorf("a map without timesync: the NTP zone is still held unsynchronized")
	}

	id := sledconfigtest.ZoneID(1)
	if r := s.putFaults(`{"zones": {"` + id + `": {"start": "fail"}}}`); r.status != http.StatusNoContent {
		t.Fatalf("zones alone: %d %s", r.status, r.body)
	}
	if p := s.present(); !p[a.Serial] {
		t.Errorf("a map without disks: disk %s still out of the machine", a.Serial)
	}
	crucible := sledconfigtest.Crucible(1)
	if !s.startFails(crucible) {
		t.Errorf("zones alone, start fail: zone %s started", crucible.Name())
	}

	if r := s.putFaults(`{}`); r.status != http.StatusNoContent {
		t.Fatalf("empty map: %d %s", r.status, r.body)
	}
	if s.startFails(crucible) {
		t.Errorf("an empty map: zone %s still fails to start", crucible.Name())
	}
}

// startFails says whether the runtime's start of z fails with the injected
// fault; one that starts is destroyed again.
func (s *faultedSled) startFails(z sledconfig.Zone) bool {
	s.t.Helper()
	spec := zone.SpecFor(&z)
	err := s.rt.Ensure(context.Background(), spec)
	if err != nil && !errors.Is(err, sim.ErrInjected) {
		s.t.Fatalf("starting %s: %v", z.Name(), err)
	}
	if err == nil {
		if err := s.rt.Destroy(context.Background(), spec.Name); err != nil {
			s.t.Fatalf("destroying %s: %v", z.Name(), err)
		}
	}
	return err != nil
}

// An unknown member or a bad value, at any depth, is a 400 naming it, and
// the map in force stays as it was.
func TestSimFaultsRefusedChangeNothing(t *testing.T) {
	s := newFaultedSled(t)
	a, b := s.disks[0], s.disks[1]
	if r := s.putFaults(`{"disks": {"` + a.Serial + `": {"present": false}}, "timesync": {"synced": false}}`); r.status != http.StatusNoContent {
		t.Fatalf("valid map: %d %s", r.status, r.body)
	}
	id := sledconfigtest.ZoneID(1)
	for _, tc := range []struct {
		name, body string
		names      []string
	}{
		{"unknown member", `{"zone": {}}`, []string{"zone"}},
		{"unknown member beside good ones", `{"disks": {}, "timesinc": {"synced": true}}`, []string{"timesinc"}},
		{"unknown disk member", `{"disks": {"` + b.Serial + `": {"ensur": "hang"}}}`, []string{"ensur"}},
		{"unknown timesync member", `{"timesync": {"sync": true}}`, []string{"sync"}},
		{"bad ensure", `{"disks": {"` + b.Serial + `": {"ensure": "sometimes"}}}`, []string{b.Serial, "ensure", "sometimes"}},
		{"bad present", `{"disks": {"` + b.Serial + `": {"present": "no"}}}`, []string{"present"}},
		{"empty serial", `{"disks": {" ": {"present": false}}}`, []string{"disk serial"}},
		{"bad synced", `{"timesync": {"synced": "no"}}`, []string{"synced"}},
		{"timesync not an object", `{"timesync": true}`, []string{"timesync"}},
		{"bad health", `{"zones": {"` + id + `": {"health": "slow"}}}`, []string{"health"}},
		{"bad zone id beside good disks", `{"zones": {"nope": {}}, "disks": {}}`, []string{"nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, s.putFaults(tc.body), http.StatusBadRequest, tc.names...)
			if p := s.present(); p[a.Serial] || !p[b.Serial] {
				t.Errorf("after a refused map, present %v; want only %s", p, b.Serial)
			}
			if s.ensureFails() {
				t.Errorf("after a refused map, disk %s fails its calls", b.Serial)
			}
			if s.synced() {
				t.Errorf("after a refused map, the NTP zone says synchronized")
			}
		})
	}
}
