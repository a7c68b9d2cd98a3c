package sledconfig

import (
	"fmt"
	"net/netip"
)

// Upstream's underlay address plan (omicron common/src/address.rs): an
// availability zone is a /48 (AZ_PREFIX_LENGTH), a rack a /56 in it
// (RACK_PREFIX_LENGTH), a sled a /64 in its rack (SLED_PREFIX_LENGTH), and
// the sled's subnet is the /64 of its sled agent's address. Zone underlay
// addresses are allocated from the sled's subnet (RSS's
// AddressBumpAllocator, the planner's SledUnderlayIpAllocator), and so are
// VMMs' (Nexus's per-sled last_used_address); the rack's routing (DDM)
// sends the whole /64 to the sled. Internal DNS zones are the exception:
// their dns_address and http_address are the ::1 of one of the internal DNS
// /64s reserved in the AZ's first /56 (ReservedRackSubnet, get_dns_subnets:
// the /56 with the rack bits zero, /64s 1 to INTERNAL_DNS_REDUNDANCY), and
// their gz_address, which the sled puts on itself and advertises, is the
// ::2 of the same /64 (DnsSubnet::gz_address).
//
// An address outside what upstream allocates to this sled is another
// sled's, or another service's, or not the rack's at all: a zone or VMM
// there would take this sled's traffic to it (the Linux runtime routes a
// zone's address into the zone), so it is refused. So is an internal DNS
// zone's gz_address outside the internal DNS /64s: the sled advertises
// that address's /64 (internal/prefix), which would draw another sled's
// traffic here.
//
// Where this agent differs: upstream's allocators give zones ::3 to ::ffff
// of the sled's /64 (CP_SERVICES_RESERVED_ADDRESSES) and VMMs the
// addresses above; the agent takes either anywhere in the /64 past the
// reserved first addresses, since both are this sled's to route and a
// zone and a VMM never share an address (internal/claims). The rack's /56
// is not known to the agent (nor needed: the sled's /64 is in it, and the
// internal DNS /64s follow from the AZ), so a sled /64 in the reserved
// /56 is not refused here.
const (
	// azBytes is the AZ prefix (/48), in bytes.
	azBytes = 48 / 8
	// sledReservedAddresses is upstream's SLED_RESERVED_ADDRESSES: the
	// sled's subnet's ::1 (the sled agent) and ::2 (the switch zone, on a
	// scrimlet) are never a zone's or a VMM's; nor is ::0, the
	// subnet-router anycast address (RFC 4291 §2.6.1), which upstream
	// always skips.
	sledReservedAddresses = 2
	// internalDNSSubnets is upstream's RESERVED_INTERNAL_DNS_REDUNDANCY:
	// the internal DNS /64s reserved in the AZ's first /56. Upstream
	// allocates from the first INTERNAL_DNS_REDUNDANCY (3) of them today;
	// the reserved ones are accepted too, since nothing else may be
	// there and upstream keeps them for more DNS servers.
	internalDNSSubnets = 5
)

// SledSubnet is the sled's subnet: the /64 of its underlay address
// (upstream's Ipv6Subnet<SLED_PREFIX_LENGTH>::new of the sled agent's
// address).
func SledSubnet(sled netip.Addr) netip.Prefix {
	return netip.PrefixFrom(sled, 64).Masked()
}

// SledAddrProblem says why a, a global unicast IPv6 address, cannot be the
// underlay address of a zone (other than an internal DNS zone) or a VMM on
// the sled whose underlay address is sled, or returns "" if it can. The
// sled's own address is not this rule's business: it is refused as a
// collision with the sled, which says more.
func SledAddrProblem(sled, a netip.Addr) string {
	if a == sled {
		return ""
	}
	subnet := SledSubnet(sled)
	if !subnet.Contains(a) {
		return fmt.Sprintf("%s is outside the sled's subnet %s (the /64 of its underlay address %s)", a, subnet, sled)
	}
	b := a.As16()
	if b[8]|b[9]|b[10]|b[11]|b[12]|b[13]|b[14] == 0 && b[15] <= sledReservedAddresses {
		return fmt.Sprintf("%s is one of the first addresses of the sled's subnet %s, which are never a zone's or a VMM's (::0 its anycast address, ::1 the sled agent's, ::2 the switch zone's)", a, subnet)
	}
	return ""
}

// internalDNSProblem says why a, a global unicast IPv6 address, cannot be
// an internal DNS zone's address (dns_address, http_address or gz_address)
// on the sled whose underlay address is sled, or returns "".
//
// The AZ is the /48 of the sled's address, as upstream derives it
// (get_internal_dns_server_addresses). Where upstream's planner also knows
// which /64 of the three an internal DNS zone took and that its gz_address
// is that /64's ::2, this agent only checks that every address lies in a
// reserved internal DNS /64: any of them is the rack's DNS, never another
// service's.
func internalDNSProblem(sled, a netip.Addr) string {
	s, b := sled.As16(), a.As16()
	if [azBytes]byte(s[:azBytes]) == [azBytes]byte(b[:azBytes]) && b[6] == 0 && b[7] >= 1 && b[7] <= internalDNSSubnets {
		return ""
	}
	first, last := s, s
	first[6], first[7], last[6], last[7] = 0, 1, 0, internalDNSSubnets
	clear(first[8:])
	clear(last[8:])
	return fmt.Sprintf("%s is outside the internal DNS subnets reserved in the sled's availability zone (%s to %s)",
		a, netip.PrefixFrom(netip.AddrFrom16(first), 64), netip.PrefixFrom(netip.AddrFrom16(last), 64))
}

// sledSubnet reports zone addresses outside what upstream allocates for the
// sled whose underlay address is sled: underlay addresses outside its
// subnet (SledAddrProblem), and an internal DNS zone's addresses outside
// the internal DNS subnets. Addresses that are not global unicast are
// reported already, and not again.
func (v *validator) sledSubnet(zones map[string]Zone, addrs []zoneAddrs, sled netip.Addr) {
	for i := range addrs {
		z := &addrs[i]
		t := zones[z.key].ZoneType
		dns := t.Type == "internal_dns"
		for _, a := range z.underlay {
			if !a.IsGlobalUnicast() || a.Zone() != "" || a == sled {
				continue // reported already
			}
			msg := ""
			if dns {
				msg = internalDNSProblem(sled, a)
			} else {
				msg = SledAddrProblem(sled, a)
			}
			if msg != "" {
				v.unrealisable(zonePath(z.key)+".zone_type."+underlayField(t, a), "underlay address %s", msg)
			}
		}
		if z.hasGZ && z.gz.IsGlobalUnicast() && z.gz != sled {
			if msg := internalDNSProblem(sled, z.gz); msg != "" {
				v.unrealisable(zonePath(z.key)+".zone_type.gz_address", "%s", msg)
			}
		}
	}
}
