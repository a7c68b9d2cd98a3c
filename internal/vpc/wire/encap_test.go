package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

var (
	sled1     = netip.MustParseAddr("fd00:1122:3344:101::1")
	sled2     = netip.MustParseAddr("fd00:1122:3344:102::1")
	tep       = netip.MustParseAddr("fd00:99::1")
	guestA    = MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
	guestB    = MAC{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x02}
	nic1      = MAC{0x02, 0, 0, 0, 0x01, 0x01}
	nextHop2  = MAC{0x02, 0, 0, 0, 0x02, 0x01}
	switchMAC = MAC{0x02, 0, 0, 0, 0xaa, 0x01}
)

type goldenCase struct {
	name   string
	frame  []byte
	encap  func(key FlowKey, inner *Frame) Encap
	vni    uint32
	src    netip.Addr
	dst    netip.Addr
	hop    uint8
	sport  uint16
	csum   uint16
	mss    bool
	ext    bool
	optLen int
	inDst  MAC
	inSrc  MAC
	proto  uint8
	key    FlowKey
}

func goldenCases() []goldenCase {
	v4 := netip.MustParseAddr
	opte := func(e Encap) Encap { e.OuterDst, e.OuterSrc = nextHop2, nic1; return e }
	sw := func(key FlowKey, inner *Frame) Encap {
		e := SwitchEncap(7777, sled1, inner.Proto)
		e.OuterDst, e.OuterSrc = nic1, switchMAC
		e.HopLimit-- // the switch routes the packet it built (dendrite nat.rs adjust_hlim(-1))
		return e
	}
	return []goldenCase{
		{
			name: "internal TCP", frame: goldenInternalTCP,
			encap: func(k FlowKey, _ *Frame) Encap { return opte(InternalEncap(7777, sled1, sled2, k)) },
			vni:   7777, src: sled1, dst: sled2, hop: 128, sport: 0x9b25, mss: true, optLen: 8,
			inDst: guestB, inSrc: guestA, proto: ProtoTCP,
			key: FlowKey{Proto: ProtoTCP, Src: v4("172.30.0.5"), Dst: v4("172.30.0.6"), SrcPort: 49152, DstPort: 22},
		},
		{
			name: "internal ICMP", frame: goldenInternalICMP,
			encap: func(k FlowKey, _ *Frame) Encap { return opte(InternalEncap(7777, sled1, sled2, k)) },
			vni:   7777, src: sled1, dst: sled2, hop: 128, sport: 0x26fc,
			inDst: guestB, inSrc: guestA, proto: ProtoICMP,
			key: FlowKey{Proto: ProtoICMP, Src: v4("172.30.0.5"), Dst: v4("172.30.0.6"), ICMPType: 8, EchoID: 0x1234},
		},
		{
			name: "boundary", frame: goldenBoundary,
			encap: func(k FlowKey, _ *Frame) Encap { return opte(BoundaryEncap(BoundaryServicesVNI, sled1, tep, k)) },
			vni:   99, src: sled1, dst: tep, hop: 128, sport: 0x23ac,
			inDst: TunnelEndpointMAC, inSrc: guestA, proto: ProtoTCP,
			key: FlowKey{Proto: ProtoTCP, Src: v4("198.51.100.10"), Dst: v4("203.0.113.7"), SrcPort: 16384, DstPort: 443},
		},
		{
			name: "switch ICMP", frame: goldenSwitchICMP, encap: sw,
			vni: 7777, src: netip.IPv6Unspecified(), dst: sled1, hop: 254, sport: 6081, ext: true, optLen: 4,
			inDst: guestA, proto: ProtoICMP,
			key: FlowKey{Proto: ProtoICMP, Src: v4("203.0.113.7"), Dst: v4("198.51.100.10"), ICMPType: 8, EchoID: 0x4242},
		},
		{
			name: "switch UDP", frame: goldenSwitchUDP, encap: sw,
			vni: 7777, src: netip.IPv6Unspecified(), dst: sled1, hop: 254, sport: 6081, csum: 0x5510, ext: true, optLen: 4,
			inDst: guestA, proto: ProtoUDP,
			key: FlowKey{Proto: ProtoUDP, Src: v4("203.0.113.7"), Dst: v4("198.51.100.10"), SrcPort: 53, DstPort: 16400},
		},
	}
}

func TestGoldenFramesDecap(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			var d Decap
			if err := DecapFrame(c.frame, &d); err != nil {
				t.Fatalf("DecapFrame: %v", err)
			}
			g := d.Geneve
			if g.VNI != c.vni || d.Src != c.src || d.Dst != c.dst || d.HopLimit != c.hop ||
				d.SrcPort != c.sport || d.DstPort != GenevePort || d.UDPChecksum != c.csum {
				t.Errorf("outer: vni %d %v -> %v hop %d ports %d->%d csum %#x", g.VNI, d.Src, d.Dst, d.HopLimit, d.SrcPort, d.DstPort, d.UDPChecksum)
			}
			if g.HasMSS != c.mss || g.MSS != 0 || g.External != c.ext || g.OptLen != c.optLen ||
				g.HasMulticast || g.OAM || g.Critical || g.OptionsMalformed {
				t.Errorf("geneve: %+v", g)
			}
			var f Frame
			if err := Parse(d.Inner(c.frame), &f); err != nil {
				t.Fatalf("inner Parse: %v", err)
			}
			if f.Dst != c.inDst || f.Src != c.inSrc || f.Proto != c.proto || !f.HasL4 {
				t.Errorf("inner: %v -> %v proto %d", f.Src, f.Dst, f.Proto)
			}
			if k := f.FlowKey(); k != c.key {
				t.Errorf("flow key %+v, want %+v", k, c.key)
			}
			inner := d.Inner(c.frame)
			if !f.IPv4HeaderChecksumValid(inner) || !f.L4ChecksumValid(inner) {
				t.Errorf("inner checksums do not verify")
			}

			// The UDP-socket form: the same bytes after the outer UDP header.
			var da Decap
			if err := DecapGeneve(c.frame[OuterLen:], &da); err != nil {
				t.Fatalf("DecapGeneve: %v", err)
			}
			if da.Geneve != d.Geneve || !bytes.Equal(da.Inner(c.frame[OuterLen:]), inner) {
				t.Errorf("DecapGeneve differs from DecapFrame: %+v", da.Geneve)
			}
		})
	}
}

func TestGoldenFramesEncap(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			var d Decap
			if err := DecapFrame(c.frame, &d); err != nil {
				t.Fatal(err)
			}
			inner := append([]byte(nil), d.Inner(c.frame)...)
			var f Frame
			if err := Parse(inner, &f); err != nil {
				t.Fatal(err)
			}
			e := c.encap(f.FlowKey(), &f)

			// (b) a full outer frame, built by copying the inner frame.
			out := make([]byte, 2048)
			n, err := e.EncapFrame(out, inner)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out[:n], c.frame) {
				t.Errorf("EncapFrame:\n got %x\nwant %x", out[:n], c.frame)
			}

			// (b) again, in place: the inner frame already after the headroom.
			buf := make([]byte, e.FrameHeaderLen()+len(inner))
			copy(buf[e.FrameHeaderLen():], inner)
			n, err = e.EncapFrame(buf, buf[e.FrameHeaderLen():])
			if err != nil || !bytes.Equal(buf[:n], c.frame) {
				t.Errorf("in-place EncapFrame: %v\n got %x", err, buf[:n])
			}

			// (a) the UDP payload: the golden frame after its outer UDP header.
			n, err = e.EncapGeneve(out, inner)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out[:n], c.frame[OuterLen:]) {
				t.Errorf("EncapGeneve:\n got %x\nwant %x", out[:n], c.frame[OuterLen:])
			}

			// The inner checksums: zeroed and recomputed, they are the golden ones.
			scratch := append([]byte(nil), inner...)
			scratch[f.L3Off+10], scratch[f.L3Off+11] = 0, 0
			co := f.L4Off + L4ChecksumOffset(f.Proto)
			scratch[co], scratch[co+1] = 0xde, 0xad
			f.SetChecksums(scratch)
			if !bytes.Equal(scratch, inner) {
				t.Errorf("SetChecksums:\n got %x\nwant %x", scratch, inner)
			}
		})
	}
}

// OPTE's own Geneve emit tests (lib/opte/src/engine/geneve.rs emit_no_opts,
// emit_single_opt): UDP from entropy 7777 to 6081 and Geneve VNI 1234. There
// the UDP length counts no payload; here it counts the 0-byte inner frame.
func TestEncapMatchesOPTEEmitTests(t *testing.T) {
	for _, c := range []struct {
		name string
		e    Encap
		want []byte
	}{
		{"emit_no_opts", Encap{VNI: 1234}, []byte{
			0x1E, 0x61, 0x17, 0xC1, 0x00, 0x10, 0x00, 0x00,
			0x00, 0x00, 0x65, 0x58, 0x00, 0x04, 0xD2, 0x00}},
		{"emit_single_opt", Encap{VNI: 1234, External: true}, []byte{
			0x1E, 0x61, 0x17, 0xC1, 0x00, 0x14, 0x00, 0x00,
			0x01, 0x00, 0x65, 0x58, 0x00, 0x04, 0xD2, 0x00,
			0x01, 0x29, 0x00, 0x00}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := c.e
			e.Src, e.Dst, e.SrcPort = sled1, sled2, 7777
			out := make([]byte, 256)
			n, err := e.EncapFrame(out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := out[EthernetLen+IPv6Len : n]; !bytes.Equal(got, c.want) {
				t.Errorf("got %x\nwant %x", got, c.want)
			}
		})
	}
}

func TestEncapMulticastOption(t *testing.T) {
	// oxide-vpc overlay.rs GENEVE_MCAST_OPT with each replication (the body's
	// top two bits), as dendrite's gen_geneve_packet writes it too.
	for _, r := range []Replication{ReplicationExternal, ReplicationUnderlay, ReplicationBoth} {
		e := Encap{VNI: DefaultMulticastVNI, Multicast: true, Replication: r}
		b := make([]byte, e.GeneveHeaderLen())
		if _, err := e.PutGeneveHeader(b); err != nil {
			t.Fatal(err)
		}
		want := []byte{0x02, 0x00, 0x65, 0x58, 0x00, 0x00, 0x4d, 0x00, 0x01, 0x29, 0x01, 0x01, byte(r) << 6, 0, 0, 0}
		if !bytes.Equal(b, want) {
			t.Errorf("replication %d: got %x want %x", r, b, want)
		}
		var g Geneve
		if err := ParseGeneve(b, &g); err != nil || !g.HasMulticast || g.Replication != r {
			t.Errorf("replication %d: parse %v %+v", r, err, g)
		}
	}
}

func TestEncapErrors(t *testing.T) {
	out := make([]byte, 64)
	if _, err := (&Encap{VNI: 1 << 24}).EncapGeneve(out, nil); !errors.Is(err, ErrVNI) {
		t.Errorf("VNI 2^24: %v", err)
	}
	if _, err := (&Encap{VNI: 1, MSS: true}).EncapGeneve(out[:10], nil); !errors.Is(err, ErrShortBuffer) {
		t.Errorf("short: %v", err)
	}
	e := Encap{VNI: 1, Src: netip.MustParseAddr("10.0.0.1"), Dst: sled2}
	if _, err := e.EncapFrame(make([]byte, 256), nil); !errors.Is(err, ErrAddressFamily) {
		t.Errorf("IPv4 outer: %v", err)
	}
	e.Src = sled1
	if _, err := e.EncapFrame(make([]byte, 100), make([]byte, 40)); !errors.Is(err, ErrShortBuffer) {
		t.Errorf("short frame: %v", err)
	}
}

func TestDecapFrameRefuses(t *testing.T) {
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), goldenInternalTCP...)
		f(b)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"truncated", goldenInternalTCP[:60], ErrTruncated},
		{"vlan", mod(func(b []byte) { b[12], b[13] = 0x81, 0x00 }), ErrVLAN},
		{"ipv4 outer", mod(func(b []byte) { b[12], b[13] = 0x08, 0x00 }), ErrNotGeneve},
		{"tcp outer", mod(func(b []byte) { b[20] = ProtoTCP }), ErrNotGeneve},
		{"port 4789", mod(func(b []byte) { b[56], b[57] = 0x12, 0xb5 }), ErrNotGeneve},
		{"payload length past end", mod(func(b []byte) { b[19] = 0x60 }), ErrTruncated},
		{"udp length past payload", mod(func(b []byte) { b[59] = 0x60 }), ErrUDPLength},
		{"udp length below header", mod(func(b []byte) { b[58], b[59] = 0, 7 }), ErrUDPLength},
		{"bad checksum", mod(func(b []byte) { b[60], b[61] = 0x12, 0x34 }), ErrUDPChecksum},
		{"geneve version", mod(func(b []byte) { b[62] |= 0x40 }), ErrGeneveVersion},
		{"geneve protocol", mod(func(b []byte) { b[64] = 0x08; b[65] = 0x00 }), ErrGeneveProtocol},
	} {
		var d Decap
		if err := DecapFrame(c.b, &d); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A UDP length short of the IPv6 payload bounds the inner frame.
	short := mod(func(b []byte) { b[59] -= 2 })
	var ds Decap
	if err := DecapFrame(short, &ds); err != nil || ds.InnerEnd != len(short)-2 {
		t.Errorf("short UDP length: %v, inner end %d of %d", err, ds.InnerEnd, len(short))
	}
	// A switch frame whose checksum has been corrupted is refused, the intact one not.
	b := append([]byte(nil), goldenSwitchUDP...)
	b[len(b)-1] ^= 0xff
	var d Decap
	if err := DecapFrame(b, &d); !errors.Is(err, ErrUDPChecksum) {
		t.Errorf("corrupted switch UDP: %v", err)
	}
}

func FuzzDecapFrame(f *testing.F) {
	f.Add(goldenInternalTCP)
	f.Add(goldenSwitchUDP)
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decap
		if DecapFrame(b, &d) != nil {
			return
		}
		if d.InnerOff > d.InnerEnd || d.InnerEnd > len(b) {
			t.Fatalf("inner %d..%d of %d", d.InnerOff, d.InnerEnd, len(b))
		}
	})
}
