// Package gateway is OPTE's gateway layer for one VPC port, as a pure
// library (no I/O): the virtual router a guest sees as its only neighbour,
// which answers ARP, ping, DHCP, router and neighbour discovery and DHCPv6
// itself, and filters what the guest sends and receives by address.
//
// Upstream: opte 21df7210 lib/oxide-vpc/src/engine/gateway/{mod,arp,icmp,
// icmpv6,dhcp,dhcpv6,transit}.rs and engine/mod.rs (the rules and ARP),
// lib/opte/src/engine/{arp,dhcp}.rs, icmp/, dhcpv6/ (the replies, with
// smoltcp 0.11's DHCP and NDP parsing and layout); omicron
// illumos-utils/src/opte/mod.rs (the gateway MAC, A8:40:25:FF:77:77) and
// sled-agent/src/instance.rs (the DHCP options from an instance's hostname
// and dhcp_config, NewDHCP).
//
// The engine parses a frame with wire.Parse and calls Outbound for frames
// from the guest or Inbound for frames to it. A Decision is Continue (to the
// next layer; outbound with the VNI tag of the destination, inbound with the
// gateway MAC to write as the source, Decision.Rewrite), Reply (the answer
// is in the caller's buffer, to be sent back to the guest) or Drop with a
// Reason. Continue and Drop allocate nothing, nor do replies: their
// configuration-dependent parts are built once, by New.
//
// # What the guest sees
//
//   - Its IPv4 address as a /32 by DHCP, with the gateway (the first host of
//     the VPC subnet) as router and server, lease 86400 s, option 121 routes
//     gateway/32 on-link and 0/0 through the gateway, DNS (the first three
//     IPv4 servers), hostname, domain and search list (each name encoded in
//     full), and no MTU option. Only broadcast DISCOVERs and REQUESTs from
//     0.0.0.0:68 to 255.255.255.255:67 from the guest's MAC are answered;
//     the reply is broadcast if the client's broadcast flag asks for it,
//     else unicast to the guest's MAC and address.
//   - ARP answered for the gateway's address only, to a broadcast request
//     from the guest's MAC; the reply goes to the request's sender hardware
//     address. Every other ARP is dropped.
//   - Echo requests to the gateway (IPv4 address, IPv6 link-local
//     fe80::aa40:25ff:feff:7777) answered.
//   - A router advertisement for a router solicitation: Managed flag,
//     lifetime 9000 s, the gateway's MAC and the port's MTU, no prefix; a
//     neighbour advertisement (Router, Override, Solicited unless the
//     solicitation came from ::) for a solicitation of the gateway's
//     link-local address. All other NDP (types 133 to 137) is dropped, both ways.
//   - DHCPv6 Solicit (Advertise, or Reply with rapid commit), Request and
//     Confirm answered; the private address leased with infinite lifetimes,
//     DNS servers, search list and FQDN when asked for.
//   - Outbound, only frames from the guest's MAC and its address (or a
//     transit IP or attached subnet) pass; inbound, only frames to its MAC
//     and address (or a transit IP or attached subnet), and multicast to a
//     multicast MAC, and their source MAC becomes the gateway's.
//
// # Quirks kept on purpose
//
// These are what a guest on an Oxide rack observes:
//   - DHCP renewals and rebinds (from the guest's address) are not
//     answered: they do not match the broadcast-from-0.0.0.0 rule and pass
//     on as the guest's traffic. A REQUEST with ciaddr set from 0.0.0.0 is
//     answered like any other.
//   - The DHCP reply's UDP checksum is 0 (none). The options are the same
//     whatever the client's parameter request list asks.
//   - ARP requests unicast to the gateway's MAC (Linux's reachability
//     probes) are dropped; the guest falls back to broadcast.
//   - Router and neighbour solicitations are answered only from link-local
//     addresses in fe80::/64 (and neighbour solicitations from ::), as
//     OPTE's LINK_LOCAL is that /64; DHCPv6 likewise.
//   - A DHCPv6 message any of whose options fails OPTE's parse gets no
//     answer; a rapid commit option's body is read as further options. DNS
//     servers asked for are sent even when there are none (an empty option).
//     A DHCPv6 Confirm is answered only when its IA_NA holds IA_NAs holding
//     IA addresses (OPTE looks one level too deep), so an ordinary Confirm
//     is dropped; Renew, Rebind, Release and Information-request are dropped.
//   - A DHCPv6 Request must name the gateway's DUID (link-layer type, the
//     gateway MAC), exactly.
//
// # Deliberate differences
//
//   - IP fragments are never answered: they match no hairpin rule and pass,
//     or are dropped, on their addresses alone. OPTE would answer a first
//     fragment from its partial contents.
//   - IPv6 packets with extension headers are dropped both ways (the wire
//     package does not walk them, so NDP behind them could not be told
//     apart). OPTE walks some of them.
//   - An ICMPv6 echo request with checksum 0 (offloaded) gets a reply with
//     a correct checksum; OPTE computes that one without the pseudo-header.
//   - The DHCPv6 reply's UDP checksum is 0xffff where it computes to 0
//     (RFC 8200 §8.1); OPTE sends 0, which receivers drop.
//   - The echo payload is the request's up to its IP length; Ethernet
//     padding is never echoed.
package gateway
