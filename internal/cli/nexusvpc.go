package cli

import (
	"fmt"
	"strings"
)

// What Nexus sends a sled of a VPC, as JSON: the shapes dev plays Nexus
// with, and the tests that play it too.

// vpcNIC is an instance's primary NIC as Nexus writes a NetworkInterface:
// its id, instance, private address ip in subnet, MAC (Nexus writes it in
// upper case) and VNI.
func vpcNIC(nic, instance, ip, subnet, mac string, vni int) string {
	return fmt.Sprintf(`{"id":%q,"kind":{"type":"instance","id":%q},"name":"net0","ip_config":{"type":"v4","value":{"ip":%q,"subnet":%q,"transit_ips":[]}},"mac":%q,"vni":%d,"primary":true,"slot":0}`,
		nic, instance, ip, subnet, strings.ToUpper(mac), vni)
}

// defaultVPCRules are Nexus's default rules of a new VPC
// (allow-internal-inbound, allow-ssh, allow-icmp, each at priority 65534),
// as it resolves them for the NICs nics (vpcNIC's) in vni.
func defaultVPCRules(vni int, nics ...string) string {
	ts := strings.Join(nics, ",")
	return fmt.Sprintf(`[{"status":"enabled","direction":"inbound","targets":[%[1]s],"filter_hosts":[{"type":"vpc","value":%[2]d}],"action":"allow","priority":65534},`+
		`{"status":"enabled","direction":"inbound","targets":[%[1]s],"filter_protocols":[{"type":"tcp"}],"filter_ports":["22"],"action":"allow","priority":65534},`+
		`{"status":"enabled","direction":"inbound","targets":[%[1]s],"filter_protocols":[{"type":"icmp","value":null}],"action":"allow","priority":65534}]`, ts, vni)
}

// vpcV2P is a v2p mapping as Nexus pushes it: the guest of ip and mac in
// vni is on the sled of underlay.
func vpcV2P(ip, mac, underlay string, vni int) string {
	return fmt.Sprintf(`{"virtual_ip":%q,"virtual_mac":%q,"physical_host_ip":%q,"vni":%d}`, ip, strings.ToUpper(mac), underlay, vni)
}
