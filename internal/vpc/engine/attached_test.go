package engine

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

var (
	vpcSubnet = netip.MustParsePrefix("10.1.0.0/24")
	inVPC     = netip.MustParseAddr("10.1.0.7")
	outside   = netip.MustParseAddr("10.2.0.7")
	extSubnet = netip.MustParsePrefix("203.0.113.0/28")
	inExt     = netip.MustParseAddr("203.0.113.5")
)

// A VPC subnet attached to A (RFD 599, as OPTE's internal_attached_subnets
// test has it): B reaches an address of it through the route the control
// plane gives B (the subnet to A's address), and A sends from any address
// of it; from outside it, and once detached, both are spoofed.
func TestAttachedVPCSubnet(t *testing.T) {
	e, pa := sled(t, sledA, "vnA", macA, ipA)
	pb, err := e.CreatePort(PortConfig{Name: "vnB", VNI: 7777, MAC: macB, IPv4: &IPConfig{Private: ipB, Subnet: subnet}})
	if err != nil {
		t.Fatal(err)
	}
	pb.SetFirewall(defaultRules(t))
	pb.ApplyRoutes(rules.System, nil, []rules.Route{{Dest: subnet, Target: rules.SubnetTarget(subnet)}, {Dest: vpcSubnet, Target: rules.IPTarget(ipA)}})
	e.V2P().Set(7777, ipB, mappings.Phys{MAC: macB, Sled: sledA})
	e.V2P().Set(7777, ipA, mappings.Phys{MAC: macA, Sled: sledA})
	buf := make([]byte, 2048)
	toA := func() Result {
		n := frame(buf, macB, ipB, inVPC, wire.ProtoUDP, 40000, 5000, 0, "to the subnet")
		return e.Outbound(pb, buf, n)
	}
	fromA := func(src netip.Addr) Result {
		n := frame(buf, macA, src, ipB, wire.ProtoUDP, 5000, 40000, 0, "from the subnet")
		return e.Outbound(pa, buf, n)
	}
	if r := toA(); r.Reason != ReasonSpoof || pa.Stats().Dropped["spoofed"] != 1 {
		t.Errorf("to the subnet before the attach: %+v, A's stats %+v", r, pa.Stats())
	}
	if r := fromA(inVPC); r.Reason != ReasonSpoof {
		t.Errorf("from the subnet before the attach: %+v", r)
	}
	if changed, err := pa.AttachSubnet(AttachedSubnet{Prefix: vpcSubnet}); !changed || err != nil {
		t.Fatalf("attach: %v %v", changed, err)
	}
	if changed, err := pa.AttachSubnet(AttachedSubnet{Prefix: netip.MustParsePrefix("10.1.0.9/24")}); changed || err != nil {
		t.Errorf("the same subnet again (unmasked): %v %v", changed, err)
	}
	r := toA()
	var f wire.Frame
	if r.Verdict != ToPort || r.Port != pa || wire.Parse(r.Data, &f) != nil || f.DstIP != inVPC || f.Dst != macA || f.Src != GatewayMAC {
		t.Fatalf("to the subnet: %+v %+v", r, f)
	}
	r = fromA(inVPC)
	if r.Verdict != ToPort || r.Port != pb || wire.Parse(r.Data, &f) != nil || f.SrcIP != inVPC || f.DstIP != ipB {
		t.Errorf("from the subnet: %+v %+v", r, f)
	}
	if r := fromA(outside); r.Reason != ReasonSpoof {
		t.Errorf("from outside the subnet: %+v", r)
	}
	if got := pa.AttachedSubnets(); len(got) != 1 || got[0] != (AttachedSubnet{Prefix: vpcSubnet}) {
		t.Errorf("attached subnets %+v", got)
	}
	if got := pa.Config().Attached; len(got) != 1 {
		t.Errorf("the port's config's attached subnets %+v", got)
	}
	if found, err := pa.DetachSubnet(vpcSubnet); !found || err != nil {
		t.Fatalf("detach: %v %v", found, err)
	}
	if found, err := pa.DetachSubnet(vpcSubnet); found || err != nil {
		t.Errorf("detach again: %v %v", found, err)
	}
	if r := toA(); r.Reason != ReasonSpoof {
		t.Errorf("to the subnet after the detach: %+v", r)
	}
	if r := fromA(inVPC); r.Reason != ReasonSpoof {
		t.Errorf("from the subnet after the detach: %+v", r)
	}
	// OPTE's InvalidIpCfg: a subnet of a family the port has no address in.
	if _, err := pa.AttachSubnet(AttachedSubnet{Prefix: netip.MustParsePrefix("fd00:1::/64")}); !errors.Is(err, ErrAttachedSubnet) {
		t.Errorf("an IPv6 subnet on an IPv4 port: %v", err)
	}
	if _, err := pa.SetAttachedSubnets([]AttachedSubnet{{Prefix: vpcSubnet}, {Prefix: vpcSubnet, External: true}}); !errors.Is(err, ErrAttachedSubnet) {
		t.Errorf("a subnet given twice: %v", err)
	}
	if len(pa.AttachedSubnets()) != 0 {
		t.Errorf("a refused change changed %+v", pa.AttachedSubnets())
	}
}

// An external subnet attached to A (OPTE's
// external_attached_subnets_dont_apply_nat and
// external_attached_subnets_cannot_reach_internal): what the switch brings
// for an address of it reaches the guest untranslated; what the guest sends
// from it leaves for the internet untranslated, with no NAT flow, and never
// into the VPC. A VPC subnet's traffic to the internet goes through NAT as
// the guest's own.
func TestAttachedExternalSubnet(t *testing.T) {
	e, p, _ := natSled(t, snatOnly(16384, 32767), nil)
	ping := fromSwitch(wire.ProtoICMP, inet, inExt, 9, 1, 8, "ping")
	if r := e.Inbound(append([]byte(nil), ping...)); r.Reason != ReasonSpoof {
		t.Errorf("before the attach: %+v", r)
	}
	if _, err := p.SetAttachedSubnets([]AttachedSubnet{{Prefix: extSubnet, External: true}, {Prefix: vpcSubnet}}); err != nil {
		t.Fatal(err)
	}
	in := toGuest(t, e.Inbound(append([]byte(nil), ping...)), p)
	if in.SrcIP != inet || in.DstIP != inExt || in.EchoID != 9 {
		t.Errorf("a ping to the external subnet: %+v", in)
	}
	buf := make([]byte, 2048)
	n := frame(buf, macA, inExt, inet, wire.ProtoUDP, 40000, 7, 0, "from the block")
	f, _ := boundary(t, e.Outbound(p, buf, n), tep1)
	if f.SrcIP != inExt || f.SrcPort != 40000 || f.DstIP != inet {
		t.Errorf("from the external subnet: %s:%d → %s", f.SrcIP, f.SrcPort, f.DstIP)
	}
	if fl := p.NATFlows(); len(fl) != 0 {
		t.Errorf("NAT flows %+v, want none", fl)
	}
	n = frame(buf, macA, inExt, ipB, wire.ProtoUDP, 40000, 5000, 0, "into the VPC")
	if r := e.Outbound(p, buf, n); r.Reason != ReasonExternalToVPC {
		t.Errorf("from the external subnet into the VPC: %+v", r)
	}
	n = frame(buf, macA, inVPC, inet, wire.ProtoUDP, 40000, 7, 0, "from the VPC subnet")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != snatIP {
		t.Errorf("a VPC subnet's packet to the internet leaves from %s, want the SNAT address", f.SrcIP)
	}
	// Changed to a VPC subnet: its traffic goes through NAT again.
	if changed, err := p.AttachSubnet(AttachedSubnet{Prefix: extSubnet}); !changed || err != nil {
		t.Fatalf("attach as a VPC subnet: %v %v", changed, err)
	}
	n = frame(buf, macA, inExt, inet, wire.ProtoUDP, 40001, 7, 0, "x")
	if f, _ := boundary(t, e.Outbound(p, buf, n), tep1); f.SrcIP != snatIP {
		t.Errorf("after the change, leaves from %s", f.SrcIP)
	}
}
