// Package rules is OPTE's firewall and router semantics on flow keys, as
// a pure library (no I/O): the firewall rules Nexus resolves compiled into
// a port's ordered rule set, the route sets Nexus pushes gated by version
// and turned into per-port deltas, and a port's router table.
//
// Upstream: omicron illumos-utils/src/opte/{firewall_rules,port,port_manager}.rs
// (the sled agent's translation) and opte lib/oxide-vpc/src/engine/{firewall,router}.rs,
// lib/opte/src/engine/layer.rs (the dataplane's rule tables).
//
// # Firewall
//
// CompileFirewall takes upstream's ResolvedVpcFirewallRule list and a port's
// (VNI, MAC), keeps the enabled rules whose targets are empty or name the
// port, unrolls each into protocols × hosts rules, and orders each
// direction's rules as OPTE does. Firewall.Match returns the first rule
// that matches a Flow, or the direction's default: inbound Deny, outbound
// Allow. Allow is stateful (OPTE's StatefulAllow): the engine keeps the
// flow so that its replies pass; a new rule set clears those flows.
//
// # Router
//
// RouteSets is the sled's record of route sets by RouterID with upstream's
// version gate; Ensure returns the add/delete delta per id for the engine to
// apply to every port that needs the id (RouterKeys), in the id's Class.
// Table is a port's router table; Lookup returns the decision and the
// matched entry's target, for the overlay and NAT to act on.
//
// # Quirks kept on purpose
//
// These are what a user of an Oxide rack observes, so they are copied:
//   - Ports are destination ports only, in both directions.
//   - A rule with ports and no protocol ignores its ports: it matches every
//     port of every protocol. Ports apply only to TCP and UDP, so a rule for
//     [tcp, icmp] with ports applies them to TCP alone.
//   - A port range or ICMP code range whose start is above its end is
//     accepted and holds nothing: a rule whose only port range is reversed
//     matches no TCP or UDP packet.
//   - At equal priority Deny comes before Allow, and among rules of equal
//     priority and action the one added last comes first; this changes only
//     which rule is reported, never the verdict.
//   - An ip host filter matches the remote address: the source inbound, the
//     destination outbound. A vpc host filter matches the packet's VNI tag,
//     which packets from the switch (External option) do not have, so a vpc
//     filter never matches traffic from outside.
//   - An icmp filter does not match ICMPv6, nor icmp6 ICMP.
//   - Router entries are a list: a route added twice (a service port's
//     initial IGW routes arrive once per custom id) is there twice, and a
//     deletion removes one. A drop target beats any other target of the same
//     destination and class.
//   - Router ids no port on the sled needs are ignored; a route set with no
//     version replaces one that had a version.
//   - Service ports start every new id's set with 0.0.0.0/0 and ::/0 to the
//     system internet gateway; instance ports start with nothing.
//
// Where this package departs from upstream, on purpose:
//   - An id sent twice in one Ensure yields one delta, to its final routes
//     (upstream applies only the second delta, computed against the first).
//   - A route that cannot be a table entry (multicast destination, target
//     of the other IP family) is left out of the table and reported, while
//     the rest of the delta is applied (upstream stops the whole update at
//     the first such route, after recording the new version).
//   - A VNI beyond 24 bits is refused when decoding, wherever it appears
//     (upstream's Vni decodes any u32, and its sled agent panics on one in
//     a vpc host filter, omicron illumos-utils/src/opte/firewall_rules.rs:70-72).
package rules
