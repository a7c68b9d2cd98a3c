package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// MAC is the virtual gateway's MAC address that the sled agent gives every
// port (omicron illumos-utils/src/opte/mod.rs OPTE_VIRTUAL_GATEWAY_MAC).
var MAC = wire.MAC{0xa8, 0x40, 0x25, 0xff, 0x77, 0x77}

// Config is what the gateway layer of one port needs (the gateway's part
// of OPTE's VpcCfg): the guest's addresses, the gateway's, the exceptions to
// address filtering, the DHCP options and the port's MTU. A port has IPv4,
// IPv6 or both.
type Config struct {
	GuestMAC   wire.MAC
	GatewayMAC wire.MAC // MAC for every instance and service port
	IPv4       *IPv4Config
	IPv6       *IPv6Config
	DHCP       DHCP
	// MTU is the port's MTU, announced in the router advertisement
	// (1500, or the jumbo 8500 when the instance opted in).
	MTU uint32
}

// IPv4Config is a port's IPv4 side.
type IPv4Config struct {
	// Private is the guest's VPC-private address; the guest gets it as a /32.
	Private netip.Addr
	// Gateway is the gateway's address: the first host of the VPC subnet
	// (FirstHost), which ARP, ping and DHCP answer from.
	Gateway netip.Addr
	// Transit are prefixes the guest may also send from (Out) or receive
	// for (In): the NIC's transit_ips, both ways as the sled agent sets them.
	Transit []Transit
	// Attached are attached subnets, allowed both ways.
	Attached []netip.Prefix
}

// IPv6Config is a port's IPv6 side. The gateway's IPv6 address is not
// configured: it is the link-local EUI-64 address of the gateway MAC.
type IPv6Config struct {
	Private  netip.Addr
	Transit  []Transit
	Attached []netip.Prefix
}

// Transit is an exception to the gateway's address filtering (OPTE's
// TransitIpConfig): traffic to (In) or from (Out) the prefix passes as if
// it were the guest's own address.
type Transit struct {
	Prefix  netip.Prefix
	In, Out bool
}

// DHCP is the DHCP configuration of a port (OPTE's DhcpCfg): the options
// DHCPv4 and DHCPv6 hand out besides the address.
type DHCP struct {
	Hostname   DomainName // zero: none
	HostDomain DomainName // zero: none
	Search     []DomainName
	DNS4       []netip.Addr
	DNS6       []netip.Addr
}

// NewDHCP builds a port's DHCP configuration as the sled agent does from
// an instance's local config (omicron sled-agent/src/instance.rs): the
// instance's hostname, dhcp_config's host_domain (nil: none) and
// search_domains, and its dns_servers split by family.
func NewDHCP(hostname string, hostDomain *string, search []string, dns []netip.Addr) (DHCP, error) {
	var d DHCP
	var err error
	if d.Hostname, err = ParseDomainName(hostname); err != nil {
		return DHCP{}, fmt.Errorf("hostname: %w", err)
	}
	if hostDomain != nil {
		if d.HostDomain, err = ParseDomainName(*hostDomain); err != nil {
			return DHCP{}, fmt.Errorf("host_domain: %w", err)
		}
	}
	for _, s := range search {
		n, err := ParseDomainName(s)
		if err != nil {
			return DHCP{}, fmt.Errorf("search_domains: %w", err)
		}
		d.Search = append(d.Search, n)
	}
	for _, a := range dns {
		switch {
		case a.Is4() || a.Is4In6():
			d.DNS4 = append(d.DNS4, a.Unmap())
		case a.Is6():
			d.DNS6 = append(d.DNS6, a)
		default:
			return DHCP{}, fmt.Errorf("dns_servers: %v is not an IP address", a)
		}
	}
	return d, nil
}

// FirstHost is the gateway address of an IPv4 subnet: its first host
// (omicron's Ipv4Net::first_host, the network address plus one).
func FirstHost(subnet netip.Prefix) netip.Addr {
	return subnet.Masked().Addr().Next()
}

// LinkLocal is the EUI-64 link-local address of mac (RFC 4291 appendix A,
// OPTE's Ipv6Addr::from_eui64): fe80::aa40:25ff:feff:7777 for the gateway.
func LinkLocal(mac wire.MAC) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0,
		mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
}

// SolicitedNode is the solicited-node multicast address of a (RFC 4291 §2.7.1).
func SolicitedNode(a netip.Addr) netip.Addr {
	v := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, v[13], v[14], v[15]})
}

// clone is a deep copy of c (a Gateway keeps its own).
func (c Config) clone() Config {
	if c.IPv4 != nil {
		v := *c.IPv4
		v.Transit, v.Attached = slices.Clone(v.Transit), slices.Clone(v.Attached)
		c.IPv4 = &v
	}
	if c.IPv6 != nil {
		v := *c.IPv6
		v.Transit, v.Attached = slices.Clone(v.Transit), slices.Clone(v.Attached)
		c.IPv6 = &v
	}
	c.DHCP.Search = slices.Clone(c.DHCP.Search)
	c.DHCP.DNS4, c.DHCP.DNS6 = slices.Clone(c.DHCP.DNS4), slices.Clone(c.DHCP.DNS6)
	return c
}

// ErrConfig is wrapped by the errors of New.
var ErrConfig = errors.New("invalid gateway config")

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if c.GuestMAC == (wire.MAC{}) || c.GuestMAC.IsMulticast() {
		return bad("guest MAC %v is not a unicast address", c.GuestMAC)
	}
	if c.GatewayMAC == (wire.MAC{}) || c.GatewayMAC.IsMulticast() || c.GatewayMAC == c.GuestMAC {
		return bad("gateway MAC %v is not a unicast address apart from the guest's", c.GatewayMAC)
	}
	if c.IPv4 == nil && c.IPv6 == nil {
		return bad("neither IPv4 nor IPv6")
	}
	if c.MTU == 0 {
		return bad("MTU 0")
	}
	if v := c.IPv4; v != nil {
		if !v.Private.Is4() || !v.Gateway.Is4() {
			return bad("IPv4 private %v and gateway %v must be IPv4 addresses", v.Private, v.Gateway)
		}
		if v.Private == v.Gateway {
			return bad("IPv4 private address %v is the gateway's", v.Private)
		}
		if err := checkPrefixes(true, v.Transit, v.Attached); err != nil {
			return bad("IPv4 %v", err)
		}
	}
	if v := c.IPv6; v != nil {
		if !v.Private.Is6() || v.Private.Is4In6() {
			return bad("IPv6 private %v must be an IPv6 address", v.Private)
		}
		if err := checkPrefixes(false, v.Transit, v.Attached); err != nil {
			return bad("IPv6 %v", err)
		}
	}
	for _, a := range c.DHCP.DNS4 {
		if !a.Is4() {
			return bad("DNS4 server %v is not IPv4", a)
		}
	}
	for _, a := range c.DHCP.DNS6 {
		if !a.Is6() || a.Is4In6() {
			return bad("DNS6 server %v is not IPv6", a)
		}
	}
	return nil
}

func checkPrefixes(v4 bool, transit []Transit, attached []netip.Prefix) error {
	ok := func(p netip.Prefix) bool { return p.IsValid() && p.Addr().Is4() == v4 && !p.Addr().Is4In6() }
	for _, t := range transit {
		if !ok(t.Prefix) {
			return fmt.Errorf("transit prefix %v of the wrong family", t.Prefix)
		}
	}
	for _, p := range attached {
		if !ok(p) {
			return fmt.Errorf("attached subnet %v of the wrong family", p)
		}
	}
	return nil
}
