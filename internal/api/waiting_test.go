package api_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/zone"
)

// gates hold one zone for its storage and another for time.
type gates struct{ storage, time string }

const (
	storageWhy = "pool oxp_x is not managed"
	timeWhy    = "time not yet synchronized: no NTP zone in the config"
)

func (g gates) ZoneStorage(z *sledconfig.Zone) (zone.Storage, error) {
	if z.ID == g.storage {
		return zone.Storage{}, errors.New(storageWhy)
	}
	return zone.Storage{}, nil
}

func (g gates) ZoneTimeSync(z *sledconfig.Zone) error {
	if z.ID == g.time {
		return errors.New(timeWhy)
	}
	return nil
}

// ownZoneSummary is the ZoneSummary schema of the committed OpenAPI
// document.
func ownZoneSummary(t *testing.T) *openapi3.Schema {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIPath)
	if err != nil {
		t.Fatalf("loading %s: %v", openAPIPath, err)
	}
	ref, ok := doc.Components.Schemas["ZoneSummary"]
	if !ok || ref.Value == nil {
		t.Fatalf("%s has no ZoneSummary schema", openAPIPath)
	}
	return ref.Value
}

// Zones held by a gate read waiting, with why, in our view (GET
// /agent/inventory, GET /agent/zones/{zone}), as the committed document
// says they may; upstream's inventory has them err with the reason, as
// upstream's agent does, and no service of theirs, as none exists yet.
func TestHeldZonesReadWaitingInOurViewErrInUpstreams(t *testing.T) {
	zones := sledconfigtest.Crucibles(3)
	forStorage, forTime, free := zones[0], zones[1], zones[2]
	g := gates{storage: forStorage.ID, time: forTime.ID}
	s := newSledWith(t, sim.Options{}, reconciler.Options{Storage: g, TimeSync: g})
	doc, _ := json.Marshal(sledconfigtest.Config(1, zones...))
	if r := s.put(doc); r.status != http.StatusNoContent {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	waitFor(t, "one zone running and a pass completed", func() bool {
		last := s.rec.Status().Last
		return len(s.rec.RunningZones()) == 1 && last != nil && len(last.Zones) == 3
	})

	schema := ownZoneSummary(t)
	spec := openapitest.Load(t, openapitest.SledAgent)
	r := s.do(http.MethodGet, "/agent/inventory", nil)
	var inv api.AgentInventory
	if err := json.Unmarshal(r.body, &inv); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	var raw struct {
		ZoneStates []any `json:"zone_states"`
	}
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatal(err)
	}
	for i, z := range raw.ZoneStates {
		if err := spec.ValidateValue(schema, z); err != nil {
			t.Errorf("zone_states[%d] does not match the committed document: %v", i, err)
		}
	}
	byID := map[string]api.ZoneSummary{}
	for _, z := range inv.ZoneStates {
		byID[z.ID] = z
	}
	want := map[string]string{forStorage.ID: "storage not ready: " + storageWhy, forTime.ID: timeWhy}
	for id, why := range want {
		z := byID[id]
		if z.State != "waiting" || z.WaitingFor != why || z.Attempts != 0 || z.LastError != "" || z.NextRetry == nil {
			t.Errorf("zone %s in /agent/inventory: %+v; want waiting for %q, no attempt, no error, a next look", id, z, why)
		}
		var d api.ZoneDetail
		if err := json.Unmarshal(s.do(http.MethodGet, "/agent/zones/"+id, nil).body, &d); err != nil || d.State != "waiting" || d.WaitingFor != why {
			t.Errorf("zone %s in /agent/zones: %+v, %v", id, d, err)
		}
	}
	if z := byID[free.ID]; z.State != "running" || z.WaitingFor != "" {
		t.Errorf("free zone: %+v", z)
	}

	up := s.upstreamInventory(spec)
	for id, why := range want {
		if res := up.LastReconciliation.Zones[id]; res.Result != "err" || !strings.HasPrefix(res.Message, why) {
			t.Errorf("zone %s in upstream's last_reconciliation: %+v, want err with %q", id, res, why)
		}
	}
	if res := up.LastReconciliation.Zones[free.ID]; res.Result != "ok" {
		t.Errorf("free zone in upstream's last_reconciliation: %+v", res)
	}
	if svcs := up.SMFServices.Value.Services; len(svcs) != 0 {
		t.Errorf("services not online of zones not yet created: %+v", svcs)
	}
}
