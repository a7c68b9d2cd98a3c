package gateway_test

import (
	"fmt"
	"net/netip"

	"github.com/sled-agent/sled-agent/internal/vpc/gateway"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// The engine parses each frame once, asks the gateway, and acts on the
// decision: a reply goes back to the guest, a Continue goes on to the
// firewall with its VNI tag.
func ExampleGateway_Outbound() {
	dhcp, err := gateway.NewDHCP("web-1", nil, nil, []netip.Addr{netip.MustParseAddr("1.1.1.1")})
	if err != nil {
		panic(err)
	}
	guest := wire.MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
	var v2p mappings.V2P
	g, err := gateway.New(gateway.Config{
		GuestMAC:   guest,
		GatewayMAC: gateway.MAC,
		IPv4: &gateway.IPv4Config{
			Private: netip.MustParseAddr("172.30.0.5"),
			Gateway: gateway.FirstHost(netip.MustParsePrefix("172.30.0.0/22")),
		},
		DHCP: dhcp,
		MTU:  1500,
	}, &v2p)
	if err != nil {
		panic(err)
	}

	// The guest asks who has 172.30.0.1.
	req := make([]byte, wire.EthernetLen+wire.ARPLen)
	wire.PutEthernet(req, wire.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, guest, wire.EtherTypeARP)
	if err := wire.PutARP(req[wire.EthernetLen:], &wire.ARP{Op: wire.ARPRequest, SenderMAC: guest,
		SenderIP: netip.MustParseAddr("172.30.0.5"), TargetIP: netip.MustParseAddr("172.30.0.1")}); err != nil {
		panic(err)
	}
	var f wire.Frame
	if err := wire.Parse(req, &f); err != nil {
		panic(err)
	}
	out := make([]byte, 1514)
	d := g.Outbound(req, &f, out)
	var reply wire.Frame
	if err := wire.Parse(out[:d.Len], &reply); err != nil {
		panic(err)
	}
	fmt.Println(d.Verdict, d.Reason, reply.ARP.SenderIP, "is at", reply.ARP.SenderMAC)
	// Output: reply ARP reply 172.30.0.1 is at a8:40:25:ff:77:77
}
