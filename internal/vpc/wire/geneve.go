package wire

import "encoding/binary"

// Geneve constants (RFC 8926) and Oxide's option class and types
// (opte lib/opte/src/engine/geneve.rs, lib/oxide-vpc/src/engine/geneve.rs;
// dendrite dpd/p4/headers.p4).
const (
	GenevePort          = 6081
	GeneveLen           = 8      // fixed header, without options
	GeneveProtoEthernet = 0x6558 // "Transparent Ethernet Bridging"
	GeneveMaxOptLen     = 63 * 4 // opt_len is 6 bits of 4-byte words

	GeneveFlagOAM      = 0x80 // O bit, in byte 1
	GeneveFlagCritical = 0x40 // C bit, in byte 1

	OptionCritical = 0x80 // critical bit of an option's type byte

	OxideOptionClass    = 0x0129
	OxideTypeExternal   = 0x00 // from the switch's NAT ingress; no body
	OxideTypeMulticast  = 0x01 // 4-byte body, replication in the top 2 bits
	OxideTypeMSS        = 0x02 // 4-byte body, a big-endian TCP MSS
	OptionHeaderLen     = 4
	oxideBodyLen        = 4
	MaxVNI              = 1<<24 - 1
	BoundaryServicesVNI = 99 // oxide-vpc api.rs BOUNDARY_SERVICES_VNI
	DefaultMulticastVNI = 77 // oxide-vpc api.rs DEFAULT_MULTICAST_VNI
)

// Replication is the multicast option's 2-bit instruction to the switch
// (oxide-vpc api.rs Replication).
type Replication uint8

const (
	ReplicationExternal Replication = 0
	ReplicationUnderlay Replication = 1
	ReplicationBoth     Replication = 2
	ReplicationReserved Replication = 3
)

// TunnelEndpointMAC is the inner destination MAC of frames sent to
// boundary services (oxide-vpc overlay.rs TUNNEL_ENDPOINT_MAC).
var TunnelEndpointMAC = MAC{0xa8, 0x40, 0x25, 0x77, 0x77, 0x77}

// Geneve is the parse of a Geneve header and its options. Offsets are from
// the start of the Geneve header.
type Geneve struct {
	OAM      bool
	Critical bool // C bit: at least one critical option is present
	Protocol uint16
	VNI      uint32
	// OptLen is the length of the options in bytes; InnerOff (8+OptLen) is
	// where the inner Ethernet frame starts.
	OptLen   int
	InnerOff int

	// The Oxide options found. External is set by the switch on traffic
	// from outside the rack; MSS on VPC-internal TCP (value 0 unless the
	// sender used segmentation offload); Multicast on multicast.
	External     bool
	HasMSS       bool
	MSS          uint32
	HasMulticast bool
	Replication  Replication
	// OptionsMalformed is set when the option list could not be walked to
	// its end. With the C bit clear OPTE does not walk options and accepts
	// such a packet; options after the fault are then not reported.
	OptionsMalformed bool
}

// Option is one Geneve option TLV.
type Option struct {
	Class uint16
	Type  uint8  // including the critical bit
	Data  []byte // the body: Length*4 bytes of the caller's buffer
}

// IsCritical reports whether the option's critical bit is set.
func (o Option) IsCritical() bool { return o.Type&OptionCritical != 0 }

// Options iterates the option TLVs of a Geneve header in b (starting at
// the Geneve header).
type Options struct{ rest []byte }

// GeneveOptions returns an iterator over the options of the Geneve header at b.
func GeneveOptions(b []byte) Options {
	if len(b) < GeneveLen {
		return Options{}
	}
	n := int(b[0]&0x3f) * 4
	if GeneveLen+n > len(b) {
		return Options{rest: b[GeneveLen:]}
	}
	return Options{rest: b[GeneveLen : GeneveLen+n]}
}

// Next returns the next option, false at the end, or ErrGeneveOption when
// an option runs past the options area.
func (it *Options) Next() (Option, bool, error) {
	if len(it.rest) == 0 {
		return Option{}, false, nil
	}
	if len(it.rest) < OptionHeaderLen {
		it.rest = nil
		return Option{}, false, ErrGeneveOption
	}
	n := OptionHeaderLen + int(it.rest[3]&0x1f)*4
	if n > len(it.rest) {
		it.rest = nil
		return Option{}, false, ErrGeneveOption
	}
	o := Option{
		Class: binary.BigEndian.Uint16(it.rest[0:2]),
		Type:  it.rest[2],
		Data:  it.rest[OptionHeaderLen:n],
	}
	it.rest = it.rest[n:]
	return o, true, nil
}

// ParseGeneve parses the Geneve header at the start of b (the payload of
// a UDP datagram to port 6081) into g, as OPTE does:
//   - the version must be 0 (opte engine/geneve.rs validate_geneve);
//   - the protocol must be Ethernet, as the VPC parser expects an inner frame;
//   - when the C bit is set, every option is walked and an unknown critical
//     one, or a malformed list, is an error (oxide-vpc engine/geneve.rs
//     validate_options). A critical option of the Oxide class with a type
//     OPTE does not define (0x80 and up) counts as unknown.
func ParseGeneve(b []byte, g *Geneve) error {
	*g = Geneve{}
	if len(b) < GeneveLen {
		return ErrTruncated
	}
	if b[0]>>6 != 0 {
		return ErrGeneveVersion
	}
	g.OptLen = int(b[0]&0x3f) * 4
	g.OAM = b[1]&GeneveFlagOAM != 0
	g.Critical = b[1]&GeneveFlagCritical != 0
	g.Protocol = binary.BigEndian.Uint16(b[2:4])
	g.VNI = uint32(b[4])<<16 | uint32(b[5])<<8 | uint32(b[6])
	g.InnerOff = GeneveLen + g.OptLen
	if g.InnerOff > len(b) {
		return ErrTruncated
	}
	if g.Protocol != GeneveProtoEthernet {
		return ErrGeneveProtocol
	}
	it := GeneveOptions(b)
	for {
		o, ok, err := it.Next()
		if err != nil {
			g.OptionsMalformed = true
			if g.Critical {
				return err
			}
			return nil
		}
		if !ok {
			return nil
		}
		known, err := g.noteOption(o)
		if err != nil {
			g.OptionsMalformed = true
			if g.Critical {
				return err
			}
			return nil
		}
		if !known && o.IsCritical() && g.Critical {
			return UnknownCriticalOptionError{Class: o.Class, Type: o.Type}
		}
	}
}

// noteOption records an Oxide option. A known type whose body is too short
// for it is malformed, as ingot's parse of the body fails in OPTE.
func (g *Geneve) noteOption(o Option) (known bool, err error) {
	if o.Class != OxideOptionClass {
		return false, nil
	}
	switch o.Type {
	case OxideTypeExternal:
		g.External = true
	case OxideTypeMulticast:
		if len(o.Data) < oxideBodyLen {
			return true, ErrGeneveOption
		}
		g.HasMulticast = true
		g.Replication = Replication(o.Data[0] >> 6)
	case OxideTypeMSS:
		if len(o.Data) < oxideBodyLen {
			return true, ErrGeneveOption
		}
		g.HasMSS = true
		g.MSS = binary.BigEndian.Uint32(o.Data)
	default:
		return false, nil
	}
	return true, nil
}
