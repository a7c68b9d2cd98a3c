package agent_test

import (
	"net"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/agent"
	"github.com/sled-agent/sled-agent/internal/hardware"
)

// What inventory says the sled is: its baseboard as the operator gave it,
// the rack, and the address other sleds reach it at (the sled's underlay
// address and the agent's port), not the address it happens to listen on.
func TestIdentityCarriesHardwareRackAndUnderlayAddress(t *testing.T) {
	const rack = "de608e01-b8e4-4d93-b972-a7dbed36dd22"
	rev := uint32(6)
	a := newAgent(t, agent.Config{
		DataDir:           t.TempDir(),
		UnderlayIP:        "fd00:1122:3344:104::1",
		RackID:            strings.ToUpper(rack),
		BaseboardPart:     "913-0000019",
		BaseboardSerial:   "BRM42220004",
		BaseboardRevision: &rev,
	})
	t.Cleanup(func() { a.Close() })
	id := a.Identity()

	_, port, err := net.SplitHostPort(a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if want := "[fd00:1122:3344:104::1]:" + port; id.Address != want {
		t.Errorf("address %q, want %q (the underlay address and the listen port; the agent listens on %s)", id.Address, want, a.Addr())
	}
	if id.RackID != rack {
		t.Errorf("rack id %q, want %q", id.RackID, rack)
	}
	if want := (hardware.Baseboard{Part: "913-0000019", Serial: "BRM42220004", Revision: 6}); id.Hardware.Baseboard != want {
		t.Errorf("baseboard %+v, want %+v", id.Hardware.Baseboard, want)
	}
	if id.Hardware.PhysicalRAM == 0 || id.Hardware.HardwareThreads < 1 || id.Hardware.CPUFamily == "" {
		t.Errorf("hardware %+v: want RAM, at least one thread and a cpu family", id.Hardware)
	}
}

// Without overrides the agent reports this host as it is, and no rack.
func TestIdentityIsThisHost(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir()})
	t.Cleanup(func() { a.Close() })
	want, _, err := hardware.Probe(hardware.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := a.Identity()
	if id.Hardware != want {
		t.Errorf("hardware %+v, want this host's %+v", id.Hardware, want)
	}
	if id.RackID != "" {
		t.Errorf("rack id %q, want none", id.RackID)
	}
	if !strings.HasPrefix(id.Address, "["+agent.DefaultUnderlayIP+"]:") {
		t.Errorf("address %q, want the default underlay address %s", id.Address, agent.DefaultUnderlayIP)
	}
}
