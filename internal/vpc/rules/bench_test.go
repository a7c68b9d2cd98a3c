package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// benchRules is n inbound rules of four kinds in turn: TCP to one port,
// from one host, UDP 53 from a /24, ICMP from a VPC; each names something
// no other rule names, the way a large allow-list looks.
func benchRules(n int) []FirewallRule {
	rs := make([]FirewallRule, n)
	for i := range rs {
		r := FirewallRule{Status: Enabled, Direction: Inbound, Action: RuleAllow, Priority: uint16(i % 65535), Targets: []NIC{}}
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		switch i % 4 {
		case 0:
			r.Protocols = []ProtocolFilter{{Proto: ProtoTCP}}
			r.Ports = []PortRange{{First: uint16(1000 + i), Last: uint16(1000 + i)}}
		case 1:
			r.Hosts = []HostFilter{IPHost(netip.PrefixFrom(a, 32))}
		case 2:
			r.Hosts = []HostFilter{IPHost(netip.PrefixFrom(a, 24).Masked())}
			r.Protocols = []ProtocolFilter{{Proto: ProtoUDP}}
			r.Ports = []PortRange{{First: 53, Last: 53}}
		case 3:
			r.Hosts = []HostFilter{VPCHost(uint32(1024 + i))}
			r.Protocols = []ProtocolFilter{{Proto: ProtoICMP, ICMP: &ICMPFilter{Type: 8}}}
		}
		rs[i] = r
	}
	return rs
}

// benchFlows: one that the last rule of the list decides (the worst case
// of a scan), and one that no rule matches (the default decides).
func benchFlows(n int) map[string]Flow {
	last := n - 1
	a := netip.AddrFrom4([4]byte{10, byte(last >> 16), byte(last >> 8), byte(last)})
	src := netip.MustParseAddr("192.0.2.1")
	var hit Flow
	switch last % 4 {
	case 0:
		hit = Flow{Dir: In, Proto: ProtoTCP, Src: src, Dst: ipB, SrcPort: 40000, DstPort: uint16(1000 + last)}
	case 1:
		hit = Flow{Dir: In, Proto: ProtoTCP, Src: a, Dst: ipB, SrcPort: 40000, DstPort: 443}
	case 2:
		hit = Flow{Dir: In, Proto: ProtoUDP, Src: a, Dst: ipB, SrcPort: 40000, DstPort: 53}
	case 3:
		hit = Flow{Dir: In, Proto: ProtoICMP, Src: src, Dst: ipB, ICMPType: 8, VNI: Tag(uint32(1024 + last))}
	}
	miss := Flow{Dir: In, Proto: ProtoUDP, Src: src, Dst: ipB, SrcPort: 40000, DstPort: 9, VNI: Tag(7777)}
	return map[string]Flow{"last": hit, "miss": miss}
}

func BenchmarkFirewallMatch(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		fw, err := CompileFirewall(benchRules(n), portB)
		if err != nil {
			b.Fatal(err)
		}
		for _, name := range []string{"last", "miss"} {
			f := benchFlows(n)[name]
			want := fw.matchLinear(&f)
			if name == "last" && want.Rule != n-1 {
				b.Fatalf("%d rules: the last flow is decided by %+v", n, want)
			}
			b.Run(fmt.Sprintf("rules=%d/%s", n, name), func(b *testing.B) {
				for b.Loop() {
					if fw.Match(&f) != want {
						b.Fatal("wrong verdict")
					}
				}
			})
			b.Run(fmt.Sprintf("rules=%d/%s/scan", n, name), func(b *testing.B) {
				for b.Loop() {
					if fw.matchLinear(&f) != want {
						b.Fatal("wrong verdict")
					}
				}
			})
		}
	}
}

func BenchmarkFirewallCompile(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		rs := benchRules(n)
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := CompileFirewall(rs, portB); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchRoutes is n distinct routes, three quarters IPv4 of lengths 8-32,
// a quarter IPv6 of lengths 16-128, half system and half custom.
func benchRoutes(rng *rand.Rand, n int) (system, custom []Route) {
	seen := map[netip.Prefix]bool{}
	for len(seen) < n {
		var p netip.Prefix
		if rng.IntN(4) > 0 {
			a := netip.AddrFrom4([4]byte{byte(1 + rng.IntN(200)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
			p = netip.PrefixFrom(a, 8+rng.IntN(25)).Masked()
		} else {
			var b [16]byte
			b[0], b[1] = 0xfd, byte(rng.IntN(4))
			for i := 2; i < 16; i++ {
				b[i] = byte(rng.IntN(256))
			}
			p = netip.PrefixFrom(netip.AddrFrom16(b), 16+rng.IntN(113)).Masked()
		}
		if p.Addr().IsMulticast() || seen[p] {
			continue
		}
		seen[p] = true
		r := Route{Dest: p, Target: SystemIGW()}
		if len(seen)%2 == 0 {
			custom = append(custom, r)
		} else {
			system = append(system, r)
		}
	}
	return system, custom
}

func BenchmarkRouterLookup(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		rng := rand.New(rand.NewPCG(5, 6))
		system, custom := benchRoutes(rng, n)
		tb, err := NewTable().Apply(System, nil, system)
		if err == nil {
			tb, err = tb.Apply(Custom, nil, custom)
		}
		if err != nil {
			b.Fatal(err)
		}
		// Destinations inside the routes (each a random host of one) and
		// outside all of them.
		flows := make([]Flow, 1024)
		for i := range flows {
			e := tb.Entries()[rng.IntN(len(tb.Entries()))]
			a := e.Dest.Addr().As16()
			for j := e.Dest.Bits() / 8; j < 16; j++ {
				a[j] = byte(rng.IntN(256))
			}
			dst := netip.AddrFrom16(a)
			if e.Dest.Addr().Is4() {
				dst = dst.Unmap()
				if !e.Dest.Contains(dst) {
					dst = e.Dest.Addr()
				}
			}
			if !e.Dest.Contains(dst) {
				dst = e.Dest.Addr()
			}
			if i%8 == 0 {
				dst = netip.MustParseAddr("2001:db8::1")
			}
			flows[i] = out(dst.String())
		}
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				tb.Lookup(&flows[i&1023])
				i++
			}
		})
	}
}

// TestRouterIndexAgreesWithScan: on large tables of overlapping routes of
// both classes, the index finds the entry a scan in order finds.
func TestRouterIndexAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	system, custom := benchRoutes(rng, 3000)
	// Add overlapping routes of both classes and drops.
	for i := range 300 {
		r := system[i]
		custom = append(custom, Route{Dest: r.Dest, Target: DropTarget()})
		wider, _ := r.Dest.Addr().Prefix(max(r.Dest.Bits()-4, 0))
		system = append(system, Route{Dest: wider, Target: IPTarget(r.Dest.Addr())})
	}
	tb, err := NewTable().Apply(System, nil, system)
	if err == nil {
		tb, err = tb.Apply(Custom, nil, custom)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20000 {
		e := tb.Entries()[rng.IntN(len(tb.Entries()))]
		a := e.Dest.Addr().As16()
		a[15] ^= byte(i)
		a[12] ^= byte(i >> 8)
		dst := netip.AddrFrom16(a)
		if e.Dest.Addr().Is4() {
			dst = dst.Unmap()
		}
		f := out(dst.String())
		if got, want := tb.Lookup(&f), linearLookup(tb, &f); got != want {
			t.Fatalf("%s: index %+v, scan %+v", dst, got, want)
		}
	}
}
