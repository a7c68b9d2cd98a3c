// Package vmmtest makes VMM registrations for tests: upstream's
// InstanceEnsureBody with an instance spec that any sled can realise (its
// boot disk a blob, one NIC, com1), so a test needs no file of the sled's.
package vmmtest

import (
	"net"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vmm"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
)

// NICID and MAC are the test guest's NIC, in local_config.nics and the spec.
const (
	NICID = "5f6ac8a5-5e2c-4d8b-9f5b-3d8f1c2a7e01"
	MAC   = "a8:40:25:f0:00:07"
)

// MemoryMiB is the test guest's memory.
const MemoryMiB = 256

// Spec is an instance spec with 1 CPU, MemoryMiB of memory, a blob-backed
// virtio boot disk, a virtio NIC (NICID), com1 and pvpanic.
func Spec() map[string]any {
	return ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: MemoryMiB, NICID: NICID, ImageBlob: []byte{0, 0, 0, 0}})
}

// Body is an InstanceEnsureBody for instance at propolisAddr with spec
// (Spec() when nil); extra members are added at the top level.
func Body(instance, propolisAddr string, spec map[string]any, extra map[string]any) []byte {
	if spec == nil {
		spec = Spec()
	}
	return ensurebody.Body(ensurebody.Instance{
		InstanceID: instance, PropolisAddr: propolisAddr, Hostname: "vm0", NICID: NICID, MAC: MAC,
		ProjectID: "11111111-2222-3333-4444-555555555555", SiloID: "66666666-7777-8888-9999-000000000000",
	}, spec, extra)
}

// Registration is Body parsed as the API parses it.
func Registration(instance, propolisAddr string, extra map[string]any) vmm.Registration {
	body := Body(instance, propolisAddr, nil, extra)
	g, err := vmm.ParseGuest(body)
	if err != nil {
		panic(err)
	}
	return vmm.Registration{
		InstanceID:   instance,
		PropolisAddr: netip.MustParseAddrPort(propolisAddr),
		Initial:      vmm.RuntimeState{Gen: 1, State: "starting"},
		Body:         body,
		Guest:        g,
	}
}

// MustMAC is MAC parsed.
func MustMAC() net.HardwareAddr {
	mac, err := net.ParseMAC(MAC)
	if err != nil {
		panic(err)
	}
	return mac
}
