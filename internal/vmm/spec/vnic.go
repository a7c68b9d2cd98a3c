package spec

import (
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
)

// The sled agent names each virtio NIC's backend (vnic_name, which upstream's
// sled agent sets to the OPTE port it made for the NIC) after the NIC's MAC:
// "vn" and its 12 hex digits. The VMM service learns the guest's MAC from
// it, and it names the NIC's tap in the VMM's zone (15 bytes at most).
const vnicPrefix = "vn"

// VNICName is the vnic_name the agent gives the backend of a NIC with mac.
func VNICName(mac net.HardwareAddr) string {
	return vnicPrefix + strings.ReplaceAll(mac.String(), ":", "")
}

// MACOfVNIC is the MAC a vnic_name made by VNICName stands for.
func MACOfVNIC(name string) (net.HardwareAddr, error) {
	hexMAC, ok := strings.CutPrefix(name, vnicPrefix)
	if !ok || len(hexMAC) != 12 || strings.ToLower(hexMAC) != hexMAC {
		return nil, fmt.Errorf("vnic_name %q is not one this sled's agent made (%s and a MAC's 12 lowercase hex digits)", name, vnicPrefix)
	}
	var b [6]byte
	if _, err := hex.Decode(b[:], []byte(hexMAC)); err != nil {
		return nil, fmt.Errorf("vnic_name %q: %w", name, err)
	}
	return net.HardwareAddr(b[:]), nil
}

// NICsOf finds the MAC of every virtio NIC of s from its backend's
// vnic_name, by the NIC's interface_id: a spec the agent sent carries them.
func NICsOf(s *Spec) (map[string]net.HardwareAddr, error) {
	nics := map[string]net.HardwareAddr{}
	var probs []string
	for _, c := range s.Components {
		if c.Type != TypeVirtioNIC {
			continue
		}
		b, ok := s.Components[c.NIC.BackendID]
		if !ok || b.Network == nil {
			continue // spec.Check names it
		}
		mac, err := MACOfVNIC(b.Network.VNICName)
		if err != nil {
			probs = append(probs, fmt.Sprintf("component %q: %v", c.NIC.BackendID, err))
			continue
		}
		nics[strings.ToLower(c.NIC.InterfaceID)] = mac
	}
	if len(probs) > 0 {
		slices.Sort(probs)
		return nil, &Error{Problems: probs}
	}
	return nics, nil
}
