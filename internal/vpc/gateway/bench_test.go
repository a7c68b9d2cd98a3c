package gateway

import (
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

type benchCase struct {
	name    string
	frame   []byte
	verdict Verdict
	in      bool
}

func benchCases() []benchCase {
	peer := netip.MustParseAddr("172.30.0.6")
	return []benchCase{
		{"ARP", arpRequest(guestMAC, broadcastMAC, guestMAC, priv4, gw4, wire.ARPRequest), Reply, false},
		{"DHCPDiscover", discover(dhcpDiscover, 0x8000), Reply, false},
		{"DHCPRequest", discover(dhcpRequest, 0), Reply, false},
		{"Echo4", echo4(guestMAC, MAC, priv4, gw4, wire.ICMPEchoRequest, 0, 7, 777, make([]byte, 56)), Reply, false},
		{"RouterSolicit", rs(guestMAC, guestLL, 255, slla(guestMAC)), Reply, false},
		{"DHCPv6Solicit", dhcpv6Frame(guestLL, testSolicitPacket[62:]), Reply, false},
		{"OutboundGuest", udp4(guestMAC, MAC, priv4, peer), Continue, false},
		{"OutboundSpoofed", udp4(otherMAC, MAC, priv4, peer), Drop, false},
		{"InboundGuest", udp4(otherMAC, guestMAC, peer, priv4), Continue, true},
	}
}

func benchGateway(tb testing.TB) *Gateway {
	var v2p mappings.V2P
	if _, err := v2p.Set(1287581, netip.MustParseAddr("172.30.0.6"),
		mappings.Phys{MAC: otherMAC, Sled: netip.MustParseAddr("fd00:f7:101::1")}); err != nil {
		tb.Fatal(err)
	}
	return newG1(tb, &v2p)
}

// TestNoAllocation: no decision, reply included, allocates.
func TestNoAllocation(t *testing.T) {
	g := benchGateway(t)
	out := make([]byte, 2048)
	for _, bc := range benchCases() {
		f := parse(t, bc.frame)
		run := func() {
			var d Decision
			if bc.in {
				d = g.Inbound(bc.frame, f)
			} else {
				d = g.Outbound(bc.frame, f, out)
			}
			if d.Verdict != bc.verdict {
				t.Fatalf("%s: %v %v", bc.name, d.Verdict, d.Reason)
			}
		}
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Errorf("%s: %v allocations", bc.name, n)
		}
	}
}

// BenchmarkGateway times each decision on a parsed frame (the parse is the
// wire package's, timed there).
func BenchmarkGateway(b *testing.B) {
	g := benchGateway(b)
	out := make([]byte, 2048)
	for _, bc := range benchCases() {
		f := parse(b, bc.frame)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.in {
					g.Inbound(bc.frame, f)
				} else {
					g.Outbound(bc.frame, f, out)
				}
			}
		})
	}
}
