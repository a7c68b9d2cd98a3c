package wire

import (
	"errors"
	"fmt"
)

// Errors returned for frames this package will not accept. They are
// sentinels (compare with errors.Is) so that dropping a bad packet on the hot
// path allocates nothing; only UnknownCriticalOptionError carries fields.
var (
	ErrTruncated      = errors.New("wire: frame truncated")
	ErrVLAN           = errors.New("wire: VLAN-tagged frame")
	ErrEtherType      = errors.New("wire: ethertype is not IPv4, IPv6 or ARP")
	ErrARPFormat      = errors.New("wire: ARP is not IPv4 over Ethernet")
	ErrIPVersion      = errors.New("wire: IP version does not match the ethertype")
	ErrIPv4HeaderLen  = errors.New("wire: IPv4 header length below 20 bytes")
	ErrIPLength       = errors.New("wire: IP length field inconsistent with the frame")
	ErrTCPHeaderLen   = errors.New("wire: TCP data offset below 5 words")
	ErrUDPLength      = errors.New("wire: UDP length field inconsistent with the packet")
	ErrNotGeneve      = errors.New("wire: not IPv6/UDP to port 6081")
	ErrUDPChecksum    = errors.New("wire: outer UDP checksum is wrong")
	ErrGeneveVersion  = errors.New("wire: Geneve version is not 0")
	ErrGeneveProtocol = errors.New("wire: Geneve protocol is not Ethernet (0x6558)")
	ErrGeneveOption   = errors.New("wire: malformed Geneve option")
	ErrVNI            = errors.New("wire: VNI does not fit in 24 bits")
	ErrShortBuffer    = errors.New("wire: destination buffer too small")
	ErrAddressFamily  = errors.New("wire: address of the wrong family")
	ErrNoL4           = errors.New("wire: frame has no parsed L4 header")
)

// UnknownCriticalOptionError is returned for a Geneve packet whose C bit is
// set and that carries a critical option (type bit 7 set) this dataplane
// does not understand. OPTE drops such packets
// (oxide-vpc engine/geneve.rs validate_options, PktParseError::UnrecognisedTunnelOpt).
type UnknownCriticalOptionError struct {
	Class uint16
	Type  uint8 // including the critical bit
}

func (e UnknownCriticalOptionError) Error() string {
	return fmt.Sprintf("wire: unknown critical Geneve option class %#04x type %#02x", e.Class, e.Type)
}
