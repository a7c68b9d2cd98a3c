package netio

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// readAll reads with rs until want messages came (or a read fails), and
// returns them in order, and the most one read took.
func readAll(t *testing.T, read func(*Reads) error, rs *Reads, want int) (got [][]byte, most int) {
	t.Helper()
	for len(got) < want {
		if err := read(rs); err != nil {
			t.Fatalf("after %d of %d: %v", len(got), want, err)
		}
		most = max(most, rs.Len())
		for i := range rs.Len() {
			n, cut := rs.Size(i)
			if cut {
				t.Fatalf("message %d cut at %d", len(got), n)
			}
			got = append(got, bytes.Clone(rs.Buf(i)[rs.headroom:rs.headroom+n]))
		}
	}
	return got, most
}

// Datagrams written in a batch, each to its own destination, arrive in
// order; one the kernel refuses (no route) is given up on, its error
// returned, and the others still go; the batch is empty after.
func TestUnderlayBatches(t *testing.T) {
	nsA, nsB, _ := testNets(t)
	ua, ub := listenUnderlays(t, nsA, nsB)
	b := underlayB
	// Neighbour discovery first, so that none waits on it.
	if err := ua.WriteTo([]byte("hello"), b, 40000); err != nil {
		t.Fatal(err)
	}
	ub.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	if _, _, err := ub.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}

	ws := NewWrites(8)
	var want [][]byte
	for i := range 6 {
		d := bytes.Repeat([]byte{byte('a' + i)}, 100+i*250) // within the link's MTU, 1500
		dst := b
		if i == 2 {
			dst = netip.MustParseAddr("fd00:dead::1") // no route there
		} else {
			want = append(want, d)
		}
		if err := ws.AddDatagram(ua, d, dst, uint16(40000+i)); err != nil {
			t.Fatal(err)
		}
	}
	if ws.Len() != 6 || ws.Full() {
		t.Fatalf("len %d full %v", ws.Len(), ws.Full())
	}
	if err := ua.WriteBatch(ws); !errors.Is(err, unix.ENETUNREACH) {
		t.Errorf("the batch with a datagram to nowhere: %v, want ENETUNREACH", err)
	}
	if ws.Len() != 0 {
		t.Errorf("%d left in the batch", ws.Len())
	}
	rs := NewReads(4, 2048, 0)
	got, _ := readAll(t, ub.ReadBatch, rs, len(want))
	if len(got) != len(want) {
		t.Fatalf("%d datagrams", len(got))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("datagram %d: %d bytes of %q, want %d of %q", i, len(got[i]), got[i][:1], len(want[i]), want[i][:1])
		}
	}
	// One alone goes too; one too long for a datagram is not taken.
	if err := ws.AddDatagram(ua, make([]byte, 1<<16), b, 40000); !errors.Is(err, unix.EMSGSIZE) || ws.Len() != 0 {
		t.Errorf("a 64 KiB payload: %v, %d in the batch; want EMSGSIZE and none", err, ws.Len())
	}
	if err := ws.AddDatagram(ua, []byte("alone"), b, 40000); err != nil {
		t.Fatal(err)
	}
	if err := ua.WriteBatch(ws); err != nil {
		t.Fatal(err)
	}
	if got, _ := readAll(t, ub.ReadBatch, rs, 1); string(got[0]) != "alone" {
		t.Errorf("read %q", got[0])
	}
	// A datagram longer than the link's MTU is refused, not fragmented:
	// OPTE does not fragment what it encapsulates either.
	if err := ua.WriteTo(make([]byte, 1500), b, 40000); !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("a datagram over the link's MTU: %v, want EMSGSIZE", err)
	}
}

// Frames written in a batch come out of the link in order, and are read
// in batches no bigger than the Reads, after its headroom; a frame longer
// than a buffer is read cut, and says so.
func TestPortBatches(t *testing.T) {
	nsA, nsB, tag := testNets(t)
	pa, pb := openPorts(t, nsA, nsB, tag)
	frame := func(i, size int) []byte {
		f := testFrame(bytes.Repeat([]byte{byte(i)}, size-14))
		return f
	}
	ws := NewWrites(8)
	var want [][]byte
	for i := range 8 {
		want = append(want, frame(i, 60+i*100))
		ws.Add(want[i])
	}
	if !ws.Full() {
		t.Error("8 of 8 is not full")
	}
	if err := pa.WriteBatch(ws); err != nil {
		t.Fatal(err)
	}
	rs := NewReads(3, 2048, 64)
	pb.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got [][]byte
	for len(got) < len(want) {
		if err := pb.ReadBatch(rs); err != nil {
			t.Fatalf("after %d frames: %v", len(got), err)
		}
		if rs.Len() > 3 {
			t.Fatalf("read %d into 3 buffers", rs.Len())
		}
		for i := range rs.Len() {
			n, cut := rs.Size(i)
			if cut {
				t.Fatalf("frame cut at %d", n)
			}
			if f := rs.Buf(i)[64 : 64+n]; f[12] == 0x88 && f[13] == 0xb5 { // not the link's own chatter
				got = append(got, bytes.Clone(f))
			}
		}
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("frame %d: %d bytes, want %d", i, len(got[i]), len(want[i]))
		}
	}
	// Cut: a 1000-byte frame into 100-byte buffers.
	ws.Add(frame(9, 1000))
	if err := pa.WriteBatch(ws); err != nil {
		t.Fatal(err)
	}
	small := NewReads(2, 100, 0)
	for {
		if err := pb.ReadBatch(small); err != nil {
			t.Fatal(err)
		}
		if n, cut := small.Size(0); cut {
			if n != 100 || !bytes.Equal(small.Buf(0), frame(9, 1000)[:100]) {
				t.Errorf("cut frame: %d bytes", n)
			}
			break
		}
	}
}

// A read that had to wait reads one frame, by recvfrom; one that found a
// frame waiting reads batches next, until a batch holds one.
func TestReadsBatchOnlyWhenFramesWait(t *testing.T) {
	nsA, nsB, tag := testNets(t)
	pa, pb := openPorts(t, nsA, nsB, tag)
	rs := NewReads(4, 2048, 0)
	if !rs.single {
		t.Fatal("a new Reads reads batches")
	}
	// Nothing waiting: the read waits, and stays single.
	done := make(chan error, 1)
	go func() { done <- pb.ReadBatch(rs) }()
	time.Sleep(20 * time.Millisecond)
	f := testFrame(make([]byte, 50))
	if err := pa.Write(f); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rs.Len() != 1 {
		t.Errorf("a single read took %d", rs.Len())
	}
	if rs.tries > 1 && !rs.single {
		t.Error("a read that waited left the Reads reading batches")
	}
	// Frames waiting: the read finds one, and the next reads a batch.
	ws := NewWrites(4)
	for range 4 {
		ws.Add(f)
	}
	if err := pa.WriteBatch(ws); err != nil {
		t.Fatal(err)
	}
	pb.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := pb.ReadBatch(rs); err != nil {
		t.Fatal(err)
	}
	if rs.tries == 1 && rs.single {
		t.Error("a read that found a frame waiting left the Reads single")
	}
	if !rs.single {
		if err := pb.ReadBatch(rs); err != nil {
			t.Fatal(err)
		}
		if rs.Len() < 2 && !rs.single {
			t.Error("a batch of one left the Reads reading batches")
		}
	}
}
