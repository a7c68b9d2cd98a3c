package rules

import (
	"fmt"
	"net/netip"
)

// Dir is the direction of a packet relative to the guest's port: Out leaves
// the guest, In arrives for it.
type Dir uint8

const (
	Out Dir = iota
	In
)

func (d Dir) String() string {
	if d == In {
		return "in"
	}
	return "out"
}

// Proto is an IP protocol number (IPv4 protocol, or IPv6 next header after
// extension headers).
type Proto uint8

const (
	ProtoICMP   Proto = 1
	ProtoTCP    Proto = 6
	ProtoUDP    Proto = 17
	ProtoICMPv6 Proto = 58
)

func (p Proto) String() string {
	switch p {
	case ProtoICMP:
		return "icmp"
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMPv6:
		return "icmp6"
	}
	return fmt.Sprintf("proto %d", uint8(p))
}

// VNITag is the VNI a packet is tagged with for the firewall's "vpc" host
// filter. Inbound it is the Geneve VNI of a packet from another guest; it is
// absent on packets from the switch (those carrying the External option).
// Outbound it is the VNI of the destination found in the VPC mappings.
type VNITag struct {
	Present bool
	VNI     uint32
}

// Tag returns a present tag for vni.
func Tag(vni uint32) VNITag { return VNITag{Present: true, VNI: vni} }

// Flow is the flow key the firewall and router decide on: what the engine
// reads from a parsed inner frame, plus the VNI tag.
type Flow struct {
	Dir      Dir
	Proto    Proto
	Src, Dst netip.Addr
	// SrcPort and DstPort are meaningful for TCP and UDP only.
	SrcPort, DstPort uint16
	// ICMPType and ICMPCode are meaningful for ICMP and ICMPv6 only.
	ICMPType, ICMPCode uint8
	VNI                VNITag
}

// Remote is the address on the far side of the port: the source of an
// inbound packet, the destination of an outbound one. Host filters match it.
func (f *Flow) Remote() netip.Addr {
	if f.Dir == In {
		return f.Src
	}
	return f.Dst
}

func (f Flow) String() string {
	s := fmt.Sprintf("%s %s %s", f.Dir, f.Proto, f.Src)
	switch f.Proto {
	case ProtoTCP, ProtoUDP:
		s = fmt.Sprintf("%s %s %s -> %s", f.Dir, f.Proto, netip.AddrPortFrom(f.Src, f.SrcPort), netip.AddrPortFrom(f.Dst, f.DstPort))
	case ProtoICMP, ProtoICMPv6:
		s = fmt.Sprintf("%s -> %s type %d code %d", s, f.Dst, f.ICMPType, f.ICMPCode)
	default:
		s = fmt.Sprintf("%s -> %s", s, f.Dst)
	}
	if f.VNI.Present {
		s += fmt.Sprintf(" vni %d", f.VNI.VNI)
	}
	return s
}

// Action is what a firewall or router decision does with a packet.
type Action uint8

const (
	// Deny drops the packet.
	Deny Action = iota
	// Allow passes it. From the firewall it is OPTE's StatefulAllow: the
	// engine records the flow so that its replies pass in both directions.
	Allow
)

func (a Action) String() string {
	if a == Allow {
		return "allow"
	}
	return "deny"
}
