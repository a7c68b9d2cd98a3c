package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/hardware"
	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
	"github.com/sled-agent/sled-agent/internal/vmm/reservoir"
)

// The upstream Inventory (sled-agent API 48.0.0), written from the upstream
// document, not from the server's types: decoding an answer into these with
// unknown members refused is what a client generated from that document
// does. Configs are the client's own documents, kept raw.
type (
	upInventory struct {
		SledID                string           `json:"sled_id"`
		SledAgentAddress      string           `json:"sled_agent_address"`
		SledRole              string           `json:"sled_role"`
		BaseboardID           upBaseboard      `json:"baseboard_id"`
		UsableHardwareThreads uint32           `json:"usable_hardware_threads"`
		UsablePhysicalRAM     uint64           `json:"usable_physical_ram"`
		CPUFamily             string           `json:"cpu_family"`
		ReservoirSize         uint64           `json:"reservoir_size"`
		Disks                 []upDisk         `json:"disks"`
		Zpools                []upZpool        `json:"zpools"`
		Datasets              []upDataset      `json:"datasets"`
		LedgeredSledConfig    *json.RawMessage `json:"ledgered_sled_config"`
		ReconcilerStatus      upRecStatus      `json:"reconciler_status"`
		LastReconciliation    *upLast          `json:"last_reconciliation"`
		FileSourceResolver    upResolver       `json:"file_source_resolver"`
		SMFServices           upSvcsResult     `json:"smf_services_enabled_not_online"`
		ReferenceMeasurements []struct {
			Path   string   `json:"path"`
			Result upResult `json:"result"`
		} `json:"reference_measurements"`
		FMD struct {
			Ok *struct {
				Cases     []json.RawMessage `json:"cases"`
				Resources []json.RawMessage `json:"resources"`
			} `json:"ok"`
			Err *struct {
				Kind    string `json:"kind"`
				Message string `json:"message"`
			} `json:"err"`
		} `json:"fmd"`
	}
	upBaseboard struct {
		PartNumber   string `json:"part_number"`
		SerialNumber string `json:"serial_number"`
	}
	upDisk struct {
		Identity struct {
			Vendor string `json:"vendor"`
			Model  string `json:"model"`
			Serial string `json:"serial"`
		} `json:"identity"`
		Variant                string    `json:"variant"`
		Slot                   int64     `json:"slot"`
		ActiveFirmwareSlot     uint8     `json:"active_firmware_slot"`
		NextActiveFirmwareSlot *uint8    `json:"next_active_firmware_slot"`
		NumberOfFirmwareSlots  uint8     `json:"number_of_firmware_slots"`
		Slot1IsReadOnly        bool      `json:"slot1_is_read_only"`
		SlotFirmwareVersions   []*string `json:"slot_firmware_versions"`
	}
	upZpool struct {
		ID        string `json:"id"`
		TotalSize uint64 `json:"total_size"`
		Health    string `json:"health"`
	}
	upDataset struct {
		ID          *string `json:"id"`
		Name        string  `json:"name"`
		Available   uint64  `json:"available"`
		Used        uint64  `json:"used"`
		Quota       *uint64 `json:"quota"`
		Reservation *uint64 `json:"reservation"`
		Compression string  `json:"compression"`
	}
	upDuration struct {
		Secs  uint64 `json:"secs"`
		Nanos uint32 `json:"nanos"`
	}
	upRecStatus struct {
		Status      string           `json:"status"`
		Config      *json.RawMessage `json:"config"`
		StartedAt   *time.Time       `json:"started_at"`
		RunningFor  *upDuration      `json:"running_for"`
		CompletedAt *time.Time       `json:"completed_at"`
		RanFor      *upDuration      `json:"ran_for"`
	}
	upResult struct {
		Result  string `json:"result"`
		Message string `json:"message"`
	}
	upStringResult struct {
		Ok  *json.RawMessage `json:"ok"`
		Err *string          `json:"err"`
	}
	upLast struct {
		LastReconciledConfig json.RawMessage     `json:"last_reconciled_config"`
		ExternalDisks        map[string]upResult `json:"external_disks"`
		Datasets             map[string]upResult `json:"datasets"`
		OrphanedDatasets     []json.RawMessage   `json:"orphaned_datasets"`
		Zones                map[string]upResult `json:"zones"`
		BootPartitions       struct {
			BootDisk upStringResult `json:"boot_disk"`
			SlotA    upStringResult `json:"slot_a"`
			SlotB    upStringResult `json:"slot_b"`
		} `json:"boot_partitions"`
		RemoveMupdateOverride *struct {
			BootDiskResult upStringResult `json:"boot_disk_result"`
			NonBootMessage string         `json:"non_boot_message"`
		} `json:"remove_mupdate_override"`
	}
	upManifest struct {
		BootDiskPath  string            `json:"boot_disk_path"`
		BootInventory upStringResult    `json:"boot_inventory"`
		NonBootStatus []json.RawMessage `json:"non_boot_status"`
	}
	upResolver struct {
		ZoneManifest        upManifest `json:"zone_manifest"`
		MeasurementManifest upManifest `json:"measurement_manifest"`
		MupdateOverride     struct {
			BootDiskPath  string            `json:"boot_disk_path"`
			BootOverride  upStringResult    `json:"boot_override"`
			NonBootStatus []json.RawMessage `json:"non_boot_status"`
		} `json:"mupdate_override"`
	}
	upSvcsResult struct {
		Type  string `json:"type"`
		Value *struct {
			Services []struct {
				FMRI  string `json:"fmri"`
				Zone  string `json:"zone"`
				State string `json:"state"`
			} `json:"services"`
			Errors       []string  `json:"errors"`
			TimeOfStatus time.Time `json:"time_of_status"`
		} `json:"value"`
	}
)

// strictDecode decodes b into v refusing unknown members, as a generated
// client does.
func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

var testHardware = hardware.Info{
	Baseboard:       hardware.Baseboard{Part: "913-0000019", Revision: 6, Serial: "BRM42220004"},
	CPUFamily:       hardware.CPUAMDMilan,
	PhysicalRAM:     1 << 40,
	HardwareThreads: 128,
}

func withIdentity(id api.Identity) func(*api.Deps) {
	return func(d *api.Deps) { d.Identity = id }
}

// upstreamGet serves path and checks the exchange against the upstream
// document.
func (s *sled) upstreamGet(spec *openapitest.Spec, path string) (response, error) {
	s.t.Helper()
	r := s.do(http.MethodGet, path, nil)
	x := openapitest.Exchange{Request: httptest.NewRequest(http.MethodGet, "http://[::1]:12345"+path, nil), Status: r.status, Header: r.header, Body: r.body}
	return r, spec.Check(x)
}

// upstreamInventory fetches /inventory, fails the test unless it matches
// the upstream document and decodes strictly, and returns it.
func (s *sled) upstreamInventory(spec *openapitest.Spec) upInventory {
	s.t.Helper()
	r, err := s.upstreamGet(spec, "/inventory")
	if err != nil {
		s.t.Fatalf("GET /inventory does not match the upstream document: %v\n%.2000s", err, r.body)
	}
	var inv upInventory
	if err := strictDecode(r.body, &inv); err != nil {
		s.t.Fatalf("GET /inventory does not decode strictly as upstream's Inventory: %v\n%.2000s", err, r.body)
	}
	return inv
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestInventoryIsUpstreamsInEveryState checks GET /inventory against the
// upstream document, and decodes it strictly into types written from it, in
// every reconciler state: not yet run, running with a start in flight,
// idle, and with a zone in error.
func TestInventoryIsUpstreamsInEveryState(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	id := api.Identity{SledID: sledID, Address: "[fd00:1122:3344:101::1]:12345", Role: "scrimlet", RackID: "0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c", Hardware: testHardware}
	zones := sledconfigtest.Crucibles(3)

	t.Run("not yet run", func(t *testing.T) {
		s := newSled(t, sim.Options{}, withIdentity(id), func(d *api.Deps) { d.Reservoir = reservoir.NewAccount(600 << 30) })
		inv := s.upstreamInventory(spec)
		if inv.ReconcilerStatus.Status != "not_yet_run" || inv.LastReconciliation != nil || inv.LedgeredSledConfig != nil {
			t.Errorf("before any config: status %q, last %v, ledgered %v", inv.ReconcilerStatus.Status, inv.LastReconciliation, inv.LedgeredSledConfig)
		}
		// The sled's identity and hardware, as Identity has them.
		want := upBaseboard{PartNumber: "913-0000019", SerialNumber: "BRM42220004"}
		if inv.SledID != sledID || inv.SledAgentAddress != id.Address || inv.SledRole != "scrimlet" || inv.BaseboardID != want ||
			inv.CPUFamily != "amd_milan" || inv.UsablePhysicalRAM != 1<<40 || inv.UsableHardwareThreads != 128 || inv.ReservoirSize != 600<<30 {
			t.Errorf("identity and hardware: %+v", inv)
		}
		// What this platform cannot have, in upstream's error variants.
		if inv.FMD.Ok != nil || inv.FMD.Err == nil || inv.FMD.Err.Kind != "fmd_error" || !strings.Contains(inv.FMD.Err.Message, "no fault management daemon") {
			t.Errorf("fmd: %+v", inv.FMD)
		}
		for name, m := range map[string]upStringResult{
			"zone manifest":        inv.FileSourceResolver.ZoneManifest.BootInventory,
			"measurement manifest": inv.FileSourceResolver.MeasurementManifest.BootInventory,
			"mupdate override":     inv.FileSourceResolver.MupdateOverride.BootOverride,
		} {
			if m.Ok != nil || m.Err == nil || !strings.Contains(*m.Err, "no M.2 boot disks") {
				t.Errorf("%s: %+v", name, m)
			}
		}
		if inv.SMFServices.Type != "svcs_enabled_not_online" || inv.SMFServices.Value == nil || len(inv.SMFServices.Value.Services) != 0 {
			t.Errorf("smf services: %+v", inv.SMFServices)
		}
		if len(inv.Disks)+len(inv.Zpools)+len(inv.Datasets)+len(inv.ReferenceMeasurements) != 0 {
			t.Errorf("storage lists not empty: %+v", inv)
		}
	})

	t.Run("running with a start in flight", func(t *testing.T) {
		s := newSled(t, sim.Options{}, withIdentity(id))
		if err := s.rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{zones[0].ID: {Start: "hang"}}}); err != nil {
			t.Fatal(err)
		}
		doc, _ := json.Marshal(sledconfigtest.Config(1, zones...))
		if r := s.put(doc); r.status != http.StatusNoContent {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		waitFor(t, "two zones running and a pass completed", func() bool {
			return len(s.rec.RunningZones()) == 2 && s.rec.Status().Last != nil
		})
		inv := s.upstreamInventory(spec)
		if st := inv.ReconcilerStatus; st.Status != "running" || st.Config == nil || st.StartedAt == nil || st.RunningFor == nil {
			t.Errorf("reconciler status while a start hangs: %+v", st)
		}
		if svcs := inv.SMFServices.Value.Services; len(svcs) != 1 || svcs[0].Zone != zones[0].Name() || svcs[0].State != "offline" || !strings.HasPrefix(svcs[0].FMRI, "svc:/oxide/crucible") {
			t.Errorf("services not online while %s starts: %+v", zones[0].Name(), svcs)
		}
		if lr := inv.LastReconciliation; lr == nil || lr.Zones[zones[0].ID].Result != "err" {
			t.Errorf("last reconciliation while %s starts: %+v", zones[0].Name(), lr)
		}
	})

	t.Run("idle, then a zone in error", func(t *testing.T) {
		s := newSled(t, sim.Options{}, withIdentity(id))
		doc, _ := json.Marshal(sledconfigtest.Config(1, zones[:2]...))
		if r := s.put(doc); r.status != http.StatusNoContent {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		waitFor(t, "an idle reconciler with two zones running", func() bool {
			return len(s.rec.RunningZones()) == 2 && s.rec.Status().Phase == reconciler.PhaseIdle
		})
		inv := s.upstreamInventory(spec)
		if st := inv.ReconcilerStatus; st.Status != "idle" || st.CompletedAt == nil || st.RanFor == nil || st.Config != nil {
			t.Errorf("idle reconciler status: %+v", st)
		}
		lr := inv.LastReconciliation
		if lr == nil || len(lr.Zones) != 2 || lr.Zones[zones[0].ID].Result != "ok" {
			t.Fatalf("last reconciliation when idle: %+v", lr)
		}
		if lr.BootPartitions.BootDisk.Err == nil || lr.BootPartitions.SlotA.Err == nil || lr.BootPartitions.SlotB.Err == nil ||
			!strings.Contains(*lr.BootPartitions.BootDisk.Err, "boot disk not found") {
			t.Errorf("boot partitions: %+v", lr.BootPartitions)
		}

		// A zone whose start fails.
		if err := s.rt.SetFaults(sim.Faults{Zones: map[string]sim.ZoneFaults{zones[2].ID: {Start: "fail"}}}); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		doc, _ = json.Marshal(sledconfigtest.Config(2, zones...))
		json.Unmarshal(doc, &m)
		m["remove_mupdate_override"] = "6b9d6b3c-7c2a-4b0e-9f8e-0d1c2b3a4f5e"
		doc, _ = json.Marshal(m)
		if r := s.put(doc); r.status != http.StatusNoContent {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		waitFor(t, "the failing zone to fail", func() bool {
			zs, _ := s.rec.Zone(zones[2].ID)
			last := s.rec.Status().Last
			return zs.State == reconciler.StateFailed && last != nil && last.Config.Generation == 2 && !last.Zones[zones[2].ID].OK
		})
		inv = s.upstreamInventory(spec)
		lr = inv.LastReconciliation
		if res := lr.Zones[zones[2].ID]; res.Result != "err" || !strings.Contains(res.Message, "injected") {
			t.Errorf("failed zone's result: %+v", res)
		}
		if svcs := inv.SMFServices.Value.Services; len(svcs) != 1 || svcs[0].Zone != zones[2].Name() || svcs[0].State != "maintenance" {
			t.Errorf("services not online with a failed zone: %+v", svcs)
		}
		if rm := lr.RemoveMupdateOverride; rm == nil || rm.BootDiskResult.Err == nil {
			t.Errorf("remove_mupdate_override asked for, reported %+v", rm)
		}
	})

	t.Run("a member missing is caught", func(t *testing.T) {
		s := newSled(t, sim.Options{}, withIdentity(id))
		r := s.do(http.MethodGet, "/inventory", nil)
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(r.body, &obj); err != nil {
			t.Fatal(err)
		}
		delete(obj, "baseboard_id")
		body, _ := json.Marshal(obj)
		x := openapitest.Exchange{Request: httptest.NewRequest(http.MethodGet, "http://[::1]:12345/inventory", nil), Status: r.status, Header: r.header, Body: body}
		if err := spec.Check(x); err == nil || !strings.Contains(err.Error(), "baseboard_id") {
			t.Errorf("an inventory without baseboard_id: Check = %v", err)
		}
		// And a member of ours is refused by the strict decoding.
		obj["zone_states"] = json.RawMessage(`[]`)
		body, _ = json.Marshal(obj)
		var inv upInventory
		if err := strictDecode(body, &inv); err == nil || !strings.Contains(err.Error(), "zone_states") {
			t.Errorf("an inventory with zone_states decodes strictly: %v", err)
		}
	})
}

// TestInventoryEncodingMatchesItsTypes checks that the inventory, encoded by
// hand from cached parts, decodes into the server's Inventory type and
// encodes back to the same document: the generated schema (from the type)
// describes what is served.
func TestInventoryEncodingMatchesItsTypes(t *testing.T) {
	s := newSled(t, sim.Options{})
	doc, _ := json.Marshal(sledconfigtest.Config(1, sledconfigtest.Crucibles(2)...))
	s.put(doc)
	waitFor(t, "a completed pass", func() bool { return s.rec.Status().Phase == reconciler.PhaseIdle })
	r := s.do(http.MethodGet, "/inventory", nil)
	var inv api.Inventory
	if err := strictDecode(r.body, &inv); err != nil {
		t.Fatalf("decoding into api.Inventory: %v", err)
	}
	again, err := json.Marshal(&inv)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := decode(t, again), decode(t, r.body); !jsonEqual(got, want) {
		t.Errorf("re-encoded inventory differs:\n%s\n%s", again, r.body)
	}
	if inv.LedgeredSledConfig == nil || !inv.LedgeredSledConfig.SameContent(s.store.Current()) {
		t.Errorf("ledgered config differs")
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestSledIdentifiers checks GET /sled-identifiers against the upstream
// document, and its 503 before the rack id is known.
func TestSledIdentifiers(t *testing.T) {
	spec := openapitest.Load(t, openapitest.SledAgent)
	id := api.Identity{SledID: sledID, Address: "[::1]:12345", Role: "gimlet", RackID: "0c37a9e5-1df6-4ec5-b2b1-bd2e5f3b8d5c", Hardware: testHardware}
	s := newSled(t, sim.Options{}, withIdentity(id))
	r, err := s.upstreamGet(spec, "/sled-identifiers")
	if err != nil {
		t.Fatalf("GET /sled-identifiers does not match the upstream document: %v", err)
	}
	var got struct {
		RackID   string `json:"rack_id"`
		SledID   string `json:"sled_id"`
		Model    string `json:"model"`
		Revision uint32 `json:"revision"`
		Serial   string `json:"serial"`
	}
	if err := strictDecode(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.RackID != id.RackID || got.SledID != sledID || got.Model != "913-0000019" || got.Revision != 6 || got.Serial != "BRM42220004" {
		t.Errorf("sled identifiers %+v", got)
	}

	id.RackID = ""
	s = newSled(t, sim.Options{}, withIdentity(id))
	r, err = s.upstreamGet(spec, "/sled-identifiers")
	if err != nil {
		t.Errorf("503 does not match the upstream document: %v", err)
	}
	wantError(t, r, http.StatusServiceUnavailable, "rack id is not configured")
}

// TestAgentInventory checks our own view, which moved out of /inventory.
func TestAgentInventory(t *testing.T) {
	s := newSled(t, sim.Options{})
	zones := sledconfigtest.Crucibles(2)
	doc, _ := json.Marshal(sledconfigtest.Config(4, zones...))
	s.put(doc)
	waitFor(t, "a completed pass", func() bool { return s.rec.Status().Phase == reconciler.PhaseIdle })
	r := s.do(http.MethodGet, "/agent/inventory", nil)
	var inv api.AgentInventory
	if err := strictDecode(r.body, &inv); err != nil {
		t.Fatalf("GET /agent/inventory: %d %v\n%s", r.status, err, r.body)
	}
	if inv.SledID != sledID || inv.LedgeredConfig == nil || inv.LedgeredConfig.Generation != 4 || inv.LedgeredConfig.Zones != 2 {
		t.Errorf("identity and ledgered config: %+v", inv)
	}
	if len(inv.Ledger.Copies) != 2 || len(inv.ZoneStates) != 2 || inv.ReconcilerStatus.Status != "idle" || inv.ReconcilerStatus.Passes == 0 {
		t.Errorf("ledger, zones, reconciler: %+v", inv)
	}
	if lr := inv.LastReconciliation; lr == nil || lr.Generation != 4 || lr.CompletedAt.IsZero() || len(lr.Zones) != 2 {
		t.Errorf("last reconciliation: %+v", lr)
	}
	// completed_at is ours: not in upstream's last_reconciliation.
	last := s.inventory()["last_reconciliation"].(map[string]any)
	if _, ok := last["completed_at"]; ok {
		t.Errorf("/inventory's last_reconciliation has completed_at")
	}
	if _, ok := s.inventory()["zone_states"]; ok {
		t.Errorf("/inventory has zone_states")
	}
}
