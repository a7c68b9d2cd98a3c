// Package wire parses and builds the frames of the VPC data path, as OPTE
// and the switch put them on the wire: Ethernet II, ARP, IPv4, IPv6, UDP,
// TCP, ICMP and ICMPv6 inside a VPC, and Geneve with Oxide's options on the
// underlay. It does no I/O and, on the per-packet paths, no allocation:
// Parse, ParseGeneve, DecapGeneve and DecapFrame fill a caller-owned struct
// of fields and offsets over the caller's bytes, and the Encap methods
// write into a caller-supplied buffer (with headroom, the inner frame is
// not copied). PutEthernet, PutARP, PutIPv4, PutIPv6 and PutUDP build the
// replies the data path makes itself; Frame's Set methods rewrite addresses,
// ports and echo identifiers for NAT with checksums kept right.
//
// What is exactly OPTE's (opte 21df7210; omicron pins the same API 41) or
// the switch's (dendrite 2df9101e):
//   - Geneve: version 0 (others refused), protocol 0x6558, 24-bit VNI,
//     options as TLVs with a 5-bit length in 4-byte words. Oxide class
//     0x0129: type 0x00 External (no body; from the switch), 0x01 Multicast
//     (replication in the top 2 bits of a 4-byte body), 0x02 MSS (4-byte
//     body). An unknown critical option, or a malformed list, is an error
//     only when the header's C bit is set, as OPTE walks options only then
//     (oxide-vpc engine/geneve.rs validate_options). A critical type of the
//     Oxide class that OPTE does not define (0x80..) is unknown.
//   - OPTE's encapsulation (oxide-vpc engine/overlay.rs EncapAction): outer
//     IPv6 with traffic class 0, flow label 0, hop limit 128 (ingot's
//     default for a pushed header), the sled's underlay address as source;
//     UDP to 6081 from the flow's entropy, checksum 0 (headers.rs
//     SizeHoldingEncap); the MSS option (value 0 without offload) on
//     VPC-internal TCP only; no options towards boundary services (VNI 99,
//     inner destination TunnelEndpointMAC). The outer Ethernet addresses
//     are the driver's (from the underlay route): callers supply them.
//   - The entropy is InnerFlowId::crc32() as u16, byte for byte (see
//     FlowKey.CRC32); it reproduces the values OPTE's integration tests
//     assert. OPTE hashes the flow after NAT.
//   - OPTE takes an inbound Geneve packet only with an inner IPv4 or IPv6
//     packet and a TCP, UDP, ICMP or ICMPv6 header (engine/parse.rs
//     GeneveOverV6); DecapFrame leaves that check to the caller's Parse of
//     the inner frame (Frame.HasL4).
//   - The switch's NAT ingress encapsulation (sidecar.p4 add_encap_headers
//     and IngressDeparser): source ::, 6081→6081, hop limit 255, the
//     External option only, inner source MAC 0, and a real outer UDP
//     checksum for inner TCP and UDP (0 for ICMP).
//   - ICMP echo identifiers are read only for echo request/reply with code
//     0 (engine/icmp echo_id), and flow keys are built as OPTE builds them.
//
// Deliberate differences:
//   - VLAN-tagged frames are refused (ErrVLAN); a VPC port is untagged.
//     OPTE parses them with no L3 and leaves them to its layers.
//   - IPv6 extension headers are recognised and flagged (Frame.IPv6Ext),
//     not walked: the transport is not parsed. OPTE walks some of them.
//   - Inner checksums are not verified by Parse; Frame.L4ChecksumValid and
//     IPv4HeaderChecksumValid do it on request. DecapFrame verifies a
//     nonzero outer UDP checksum (a UDP socket has the kernel do it).
//   - The NAT helpers (Frame.SetSrcIP etc.) update checksums incrementally
//     (RFC 1624); OPTE recomputes or defers to offload. The results are
//     the same bytes.
package wire
