package ensurebody_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
)

// A body reads back as the guest it describes: its board, its boot disk's
// file, the seed's bytes, its NIC's MAC, its metadata.
func TestBodyParses(t *testing.T) {
	const nic, mac = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e02", "a8:40:25:f1:02:03"
	seed := []byte("instance-id: x\n")
	body := ensurebody.Body(ensurebody.Instance{
		InstanceID: "1b2e3c4d-0000-4000-8000-000000000001", PropolisAddr: "[fd00::5]:12400", Hostname: "vm0",
		NICID: nic, MAC: mac, ProjectID: "1b2e3c4d-0000-4000-8000-000000000002", SiloID: "1b2e3c4d-0000-4000-8000-000000000003",
	}, ensurebody.Spec(ensurebody.Guest{CPUs: 3, MemoryMiB: 768, NICID: nic, Image: "/images/disk.img", Seed: seed}), nil)
	g, err := vmm.ParseGuest(body)
	if err != nil {
		t.Fatalf("ParseGuest: %v\n%s", err, body)
	}
	if b := g.Spec.Board; b.CPUs != 3 || b.MemoryMiB != 768 {
		t.Errorf("board %+v, want 3 CPUs, 768 MiB", b)
	}
	if f := g.Spec.Components["boot-disk-backend"].File; f == nil || f.Path != "/images/disk.img" || f.ReadOnly {
		t.Errorf("boot disk backend %+v, want the writable file", f)
	}
	if b := g.Spec.Components["cloud-init-backend"].Blob; b == nil || !bytes.Equal(b.Data, seed) || !b.ReadOnly {
		t.Errorf("seed backend %+v, want the read-only seed", b)
	}
	if got := g.NICs[nic].String(); got != mac {
		t.Errorf("NIC %s's MAC %q, want %q", nic, got, mac)
	}
	if g.ProjectID != "1b2e3c4d-0000-4000-8000-000000000002" || g.Hostname != "vm0" {
		t.Errorf("guest %+v: metadata or hostname lost", g)
	}
}

// A body is what upstream's sled-agent 48.0.0 document says PUT
// /vmms/{propolis_id} takes, checked by an independent validator: its NIC a
// v4 private address in a guest VPC, as Nexus sends one.
func TestBodyIsUpstreamsInstanceEnsureBody(t *testing.T) {
	doc := openapitest.Load(t, "sled-agent-48.0.0.json")
	body := ensurebody.Body(ensurebody.Instance{
		InstanceID: "1b2e3c4d-0000-4000-8000-000000000001", PropolisAddr: "[fd00::5]:12400", Hostname: "vm0",
		NICID: "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e02", MAC: "a8:40:25:f1:02:03",
		ProjectID: "1b2e3c4d-0000-4000-8000-000000000002", SiloID: "1b2e3c4d-0000-4000-8000-000000000003",
	}, ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e02", ImageBlob: []byte{0}}), nil)
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	schema := doc.Doc().Components.Schemas["InstanceEnsureBody"].Value
	// Upstream's SpecKey is a oneOf that a name matches once and a UUID
	// twice; the spec's keys here are names.
	if err := doc.ValidateValue(schema, v); err != nil {
		t.Errorf("the body is not upstream's InstanceEnsureBody: %v\n%s", err, body)
	}
}
