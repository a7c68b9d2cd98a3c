package engine

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sled-agent/sled-agent/internal/vpc/gateway"
)

// AttachedSubnet is a subnet attached to a port (OPTE's attached_subnets
// entry, keyed by its prefix): the guest owns every address of it, and may
// send from and receive for each, both ways through the gateway's address
// filter. An external one (upstream's kind "external", OPTE's is_external)
// is a block of external addresses: what the guest sends from it is not
// translated by NAT and may leave only through an internet gateway (never
// into the VPC), and what comes for it is not translated either. A VPC one
// (kind "vpc") is reached by the rest of the VPC through the routes the
// control plane gives the other ports (its prefix to this guest's address),
// and goes through NAT like the guest's own address.
type AttachedSubnet struct {
	Prefix   netip.Prefix
	External bool
}

// ErrAttachedSubnet is a subnet the port cannot take: not a prefix, or of a
// family the port has no address in (OPTE's InvalidIpCfg).
var ErrAttachedSubnet = errors.New("engine: bad attached subnet")

func (p *Port) checkSubnet(prefix netip.Prefix) (netip.Prefix, error) {
	if !prefix.IsValid() || prefix.Addr().Is4In6() || prefix.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%w: port %s: %q is not an IP prefix", ErrAttachedSubnet, p.cfg.Name, prefix)
	}
	if prefix.Addr().Is4() && p.cfg.IPv4 == nil || prefix.Addr().Is6() && p.cfg.IPv6 == nil {
		fam := "IPv4"
		if prefix.Addr().Is6() {
			fam = "IPv6"
		}
		return netip.Prefix{}, fmt.Errorf("%w: port %s has no %s address for subnet %s", ErrAttachedSubnet, p.cfg.Name, fam, prefix)
	}
	return prefix.Masked(), nil
}

// normalize checks ss and returns them masked, sorted by prefix; a prefix
// given twice is an error.
func (p *Port) normalize(ss []AttachedSubnet) ([]AttachedSubnet, error) {
	out := make([]AttachedSubnet, 0, len(ss))
	for _, s := range ss {
		pfx, err := p.checkSubnet(s.Prefix)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(o AttachedSubnet) bool { return o.Prefix == pfx }) {
			return nil, fmt.Errorf("%w: port %s: subnet %s given twice", ErrAttachedSubnet, p.cfg.Name, pfx)
		}
		out = append(out, AttachedSubnet{Prefix: pfx, External: s.External})
	}
	slices.SortFunc(out, compareSubnets)
	return out, nil
}

func compareSubnets(a, b AttachedSubnet) int {
	return cmp.Or(a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()))
}

// AttachedSubnets are the port's attached subnets, by prefix.
func (p *Port) AttachedSubnets() []AttachedSubnet {
	p.attachMu.Lock()
	defer p.attachMu.Unlock()
	return slices.Clone(p.attached)
}

// AttachSubnet attaches s to the port, or changes whether it is external
// (OPTE's attach_subnet). It reports whether anything changed: the same
// subnet again changes nothing.
func (p *Port) AttachSubnet(s AttachedSubnet) (bool, error) {
	pfx, err := p.checkSubnet(s.Prefix)
	if err != nil {
		return false, err
	}
	s.Prefix = pfx
	p.attachMu.Lock()
	defer p.attachMu.Unlock()
	next := slices.Clone(p.attached)
	i := slices.IndexFunc(next, func(o AttachedSubnet) bool { return o.Prefix == pfx })
	switch {
	case i >= 0 && next[i] == s:
		return false, nil
	case i >= 0:
		next[i] = s
	default:
		next = append(next, s)
		slices.SortFunc(next, compareSubnets)
	}
	return true, p.setAttachedLocked(next)
}

// DetachSubnet detaches the subnet prefix (OPTE's detach_subnet). It
// reports whether the port had it: detaching one it does not have changes
// nothing, and is no error.
func (p *Port) DetachSubnet(prefix netip.Prefix) (bool, error) {
	pfx, err := p.checkSubnet(prefix)
	if err != nil {
		return false, err
	}
	p.attachMu.Lock()
	defer p.attachMu.Unlock()
	i := slices.IndexFunc(p.attached, func(o AttachedSubnet) bool { return o.Prefix == pfx })
	if i < 0 {
		return false, nil
	}
	return true, p.setAttachedLocked(slices.Delete(slices.Clone(p.attached), i, i+1))
}

// CheckAttachedSubnets reports whether SetAttachedSubnets would take ss,
// changing nothing.
func (p *Port) CheckAttachedSubnets(ss []AttachedSubnet) error {
	_, err := p.normalize(ss)
	return err
}

// SetAttachedSubnets makes the port's attached subnets exactly ss, as
// detaching those not in ss and attaching each of ss would. It reports
// whether anything changed.
func (p *Port) SetAttachedSubnets(ss []AttachedSubnet) (bool, error) {
	next, err := p.normalize(ss)
	if err != nil {
		return false, err
	}
	p.attachMu.Lock()
	defer p.attachMu.Unlock()
	if slices.Equal(next, p.attached) {
		return false, nil
	}
	return true, p.setAttachedLocked(next)
}

// setAttachedLocked rebuilds the two layers the attached subnets change,
// as OPTE's attach and detach do: the gateway, whose address filter lets
// them through both ways, and NAT, which leaves the external ones alone.
// attachMu is held.
func (p *Port) setAttachedLocked(next []AttachedSubnet) error {
	gc := p.gwBase
	var v4, v6 []netip.Prefix
	for _, s := range next {
		if s.Prefix.Addr().Is4() {
			v4 = append(v4, s.Prefix)
		} else {
			v6 = append(v6, s.Prefix)
		}
	}
	if gc.IPv4 != nil {
		c := *gc.IPv4
		c.Attached = v4
		gc.IPv4 = &c
	}
	if gc.IPv6 != nil {
		c := *gc.IPv6
		c.Attached = v6
		gc.IPv6 = &c
	}
	gw, err := gateway.New(gc, p.e.cfg.V2P)
	if err != nil {
		return fmt.Errorf("engine: port %s: %w", p.cfg.Name, err)
	}
	p.natMu.Lock()
	old := p.nat.Load()
	p.nat.Store(compileNAT(old.ext, next, old, old.gen+1))
	p.natMu.Unlock()
	p.gw.Store(gw)
	p.attached = next
	return nil
}

// externalSubnet reports whether a is in one of the family's attached
// external subnets.
func (n *natFamily) externalSubnet(a netip.Addr) bool {
	for _, s := range n.attachedExt {
		if s.Contains(a) {
			return true
		}
	}
	return false
}
