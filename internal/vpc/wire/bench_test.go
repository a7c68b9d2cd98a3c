package wire

import (
	"net/netip"
	"testing"
)

// tcp1500 is a 1514-byte Ethernet frame: IPv4 total length 1500, TCP with a
// 20-byte header and 1460 bytes of data, checksums right.
func tcp1500(tb testing.TB) []byte {
	tb.Helper()
	seg := make([]byte, TCPMinLen+1460)
	seg[0], seg[1], seg[2], seg[3] = 0xc0, 0x00, 0x00, 0x16
	seg[12], seg[13] = 0x50, TCPAck|TCPPsh
	for i := TCPMinLen; i < len(seg); i++ {
		seg[i] = byte(i)
	}
	b := ipv4Frame(ProtoTCP, nil, 0x4000, seg)
	var f Frame
	if err := Parse(b, &f); err != nil {
		tb.Fatal(err)
	}
	f.SetChecksums(b)
	if len(b) != 1514 {
		tb.Fatalf("frame of %d bytes", len(b))
	}
	return b
}

func BenchmarkParseTCP1500(b *testing.B) {
	fr := tcp1500(b)
	var f Frame
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(fr, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFlowKeyEntropy(b *testing.B) {
	fr := tcp1500(b)
	var f Frame
	if err := Parse(fr, &f); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var sink uint16
	for b.Loop() {
		sink += f.FlowKey().Entropy()
	}
	_ = sink
}

// BenchmarkEncapGeneveTCP1500 is the send path into a UDP socket: the inner
// frame already sits after headroom, so only the 16 header bytes are written.
func BenchmarkEncapGeneveTCP1500(b *testing.B) {
	inner := tcp1500(b)
	var f Frame
	if err := Parse(inner, &f); err != nil {
		b.Fatal(err)
	}
	e := InternalEncap(7777, sled1, sled2, f.FlowKey())
	h := e.GeneveHeaderLen()
	buf := make([]byte, h+len(inner))
	copy(buf[h:], inner)
	b.SetBytes(int64(len(inner)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.EncapGeneve(buf, buf[h:]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncapFrameCopyTCP1500 builds a full outer frame, copying the inner one.
func BenchmarkEncapFrameCopyTCP1500(b *testing.B) {
	inner := tcp1500(b)
	var f Frame
	if err := Parse(inner, &f); err != nil {
		b.Fatal(err)
	}
	e := InternalEncap(7777, sled1, sled2, f.FlowKey())
	buf := make([]byte, 2048)
	b.SetBytes(int64(len(inner)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.EncapFrame(buf, inner); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncapFrameSwitchChecksumTCP1500 is the switch's form, with the
// outer UDP checksum over the whole frame.
func BenchmarkEncapFrameSwitchChecksumTCP1500(b *testing.B) {
	inner := tcp1500(b)
	e := SwitchEncap(7777, sled1, ProtoTCP)
	h := e.FrameHeaderLen()
	buf := make([]byte, h+len(inner))
	copy(buf[h:], inner)
	b.SetBytes(int64(len(inner)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.EncapFrame(buf, buf[h:]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecapGeneveParseTCP1500 is the receive path from a UDP socket:
// Geneve and options, then the inner frame.
func BenchmarkDecapGeneveParseTCP1500(b *testing.B) {
	inner := tcp1500(b)
	var f Frame
	if err := Parse(inner, &f); err != nil {
		b.Fatal(err)
	}
	e := InternalEncap(7777, sled1, sled2, f.FlowKey())
	buf := make([]byte, e.GeneveHeaderLen()+len(inner))
	n, err := e.EncapGeneve(buf, inner)
	if err != nil {
		b.Fatal(err)
	}
	buf = buf[:n]
	var d Decap
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecapGeneve(buf, &d); err != nil {
			b.Fatal(err)
		}
		if err := Parse(d.Inner(buf), &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecapFrameTCP1500 parses a full outer frame (checksum 0, as OPTE sends).
func BenchmarkDecapFrameTCP1500(b *testing.B) {
	inner := tcp1500(b)
	e := InternalEncap(7777, sled1, sled2, FlowKey{Proto: ProtoTCP, Src: netip.MustParseAddr("172.30.0.5"), Dst: netip.MustParseAddr("172.30.0.6")})
	buf := make([]byte, 2048)
	n, err := e.EncapFrame(buf, inner)
	if err != nil {
		b.Fatal(err)
	}
	buf = buf[:n]
	var d Decap
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecapFrame(buf, &d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSNATRewriteTCP1500 is an outbound SNAT: source address and port,
// with incremental checksum updates.
func BenchmarkSNATRewriteTCP1500(b *testing.B) {
	fr := tcp1500(b)
	var f Frame
	if err := Parse(fr, &f); err != nil {
		b.Fatal(err)
	}
	ext := [2]netip.Addr{netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("172.30.0.5")}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := f.SetSrcIP(fr, ext[i&1]); err != nil {
			b.Fatal(err)
		}
		if err := f.SetSrcPort(fr, uint16(i)); err != nil {
			b.Fatal(err)
		}
	}
}
