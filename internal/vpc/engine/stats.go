package engine

import "sync/atomic"

// Reason is why a packet was dropped.
type Reason uint8

// Why packets are dropped, by layer.
const (
	ReasonNone Reason = iota
	// A frame the engine cannot read: not Ethernet II with IPv4, IPv6 or
	// ARP, truncated, a fragment after the first, an IPv6 extension header.
	ReasonParse
	// Gateway traffic the gateway does not answer: ARP but the guest's
	// request for the gateway, NDP but solicitations of it, DHCPv6 it does
	// not serve, IPv6 with extension headers (OPTE's gateway layer).
	ReasonGateway
	// A guest's frame from another MAC or address than its own, or one for
	// another MAC or address than the guest's.
	ReasonSpoof
	// The firewall's decision.
	ReasonFirewall
	// No router entry for the destination, or a drop route.
	ReasonNoRoute
	// NAT: a flow to an internet gateway with no external address that
	// gateway takes (OPTE's priority-255 deny), an ICMP message other
	// than an echo request through source NAT, a full NAT flow table, or
	// a packet for an external address of the port that answers no flow.
	ReasonNAT
	// Source NAT: every port of the flow's protocol is in use.
	ReasonSNATExhausted
	// The internet gateway's destination has no boundary tunnel endpoint
	// (no v2b entry).
	ReasonNoV2B
	// A packet from an external address (a NAT flow's) that the router
	// sends into the VPC: OPTE's overlay denies it.
	ReasonExternalToVPC
	// No v2p mapping for the destination in the port's VNI.
	ReasonNoV2P
	// Geneve whose VNI and inner destination MAC are no port's, not Geneve,
	// or with an unknown critical option.
	ReasonNoPort
	// A frame too big for the buffer with its encapsulation.
	ReasonTooBig
	numReasons
)

var reasonNames = [numReasons]string{"", "unreadable frame", "gateway: not answered", "spoofed", "firewall", "no route", "no external address for the flow", "SNAT ports exhausted", "no boundary tunnel endpoint", "from an external address into the VPC", "no v2p mapping", "no such port", "too big"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Stats count a port's packets.
type Stats struct {
	// Out: frames from the guest; In: frames to the guest.
	OutPackets, InPackets uint64
	// Dropped counts drops by Reason.
	Dropped map[string]uint64
}

type counters struct {
	out, in atomic.Uint64
	dropped [numReasons]atomic.Uint64
}

func (c *counters) snapshot() Stats {
	s := Stats{OutPackets: c.out.Load(), InPackets: c.in.Load(), Dropped: map[string]uint64{}}
	for r := Reason(1); r < numReasons; r++ {
		if n := c.dropped[r].Load(); n > 0 {
			s.Dropped[r.String()] = n
		}
	}
	return s
}
