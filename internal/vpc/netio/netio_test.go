package netio

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testNets makes network namespaces of the test's own, <tag>-a and
// <tag>-b, joined by a veth pair <tag>a/<tag>b holding
// fd00:1122:3344:1fc::1/64 and ::2/64, and returns their paths and the tag.
// Everything goes at cleanup.
func testNets(t testing.TB) (a, b, tag string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces and links")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	r := make([]byte, 3)
	rand.Read(r)
	tag = "zt" + hex.EncodeToString(r)
	for _, ns := range []string{tag + "-a", tag + "-b"} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "link", "add", tag+"a", "netns", tag+"-a", "type", "veth", "peer", "name", tag+"b", "netns", tag+"-b")
	for _, s := range []struct{ ns, link, addr string }{{tag + "-a", tag + "a", "fd00:1122:3344:1fc::1/64"}, {tag + "-b", tag + "b", "fd00:1122:3344:1fc::2/64"}} {
		run(t, "ip", "-n", s.ns, "addr", "add", s.addr, "dev", s.link, "nodad")
		run(t, "ip", "-n", s.ns, "link", "set", s.link, "up")
	}
	return "/run/netns/" + tag + "-a", "/run/netns/" + tag + "-b", tag
}

// openPorts opens a port on each end of testNets' veth pair, closed when
// the test ends.
func openPorts(t testing.TB, nsA, nsB, tag string) (pa, pb *Port) {
	t.Helper()
	for _, p := range []struct {
		port     **Port
		ns, link string
	}{{&pa, nsA, tag + "a"}, {&pb, nsB, tag + "b"}} {
		port, err := OpenPort(p.ns, p.link)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { port.Close() })
		*p.port = port
	}
	return pa, pb
}

// The underlay addresses of testNets' two ends.
var (
	underlayA = netip.MustParseAddr("fd00:1122:3344:1fc::1")
	underlayB = netip.MustParseAddr("fd00:1122:3344:1fc::2")
)

// listenUnderlays opens the Geneve sockets of testNets' two ends, closed
// when the test ends.
func listenUnderlays(t testing.TB, nsA, nsB string) (ua, ub *Underlay) {
	t.Helper()
	for _, u := range []struct {
		u    **Underlay
		ns   string
		addr netip.Addr
	}{{&ua, nsA, underlayA}, {&ub, nsB, underlayB}} {
		ul, err := ListenUnderlay(u.ns, u.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ul.Close() })
		*u.u = ul
	}
	return ua, ub
}

// testFrame is a frame from a guest's MAC to the gateway's, of an
// EtherType no stack takes (0x88b5), carrying payload.
func testFrame(payload []byte) []byte {
	return append([]byte{0xa8, 0x40, 0x25, 0xff, 0x77, 0x77, 0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01, 0x88, 0xb5}, payload...)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// Geneve between two sleds' underlay sockets: a datagram sent from one
// arrives at the other, and on the wire it is as OPTE sends it: from the
// source port it was given (the flow's hash), to 6081, with UDP checksum
// zero and hop limit 128; the receiving socket takes such datagrams.
func TestUnderlayZeroChecksum(t *testing.T) {
	nsA, nsB, tag := testNets(t)
	ua, ub := listenUnderlays(t, nsA, nsB)
	wire, err := OpenPort(nsB, tag+"b")
	if err != nil {
		t.Fatal(err)
	}
	defer wire.Close()

	payload := []byte("geneve header and an inner frame")
	if err := ua.WriteTo(payload, underlayB, 0xbeef); err != nil {
		t.Fatal(err)
	}
	ub.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, from, err := ub.ReadFrom(buf)
	if err != nil || !bytes.Equal(buf[:n], payload) || from != netip.AddrPortFrom(underlayA, 0xbeef) {
		t.Fatalf("received %q from %s (%v)", buf[:n], from, err)
	}
	// The frame as it crossed the link: Ethernet, IPv6 (next header UDP,
	// hop limit 128), UDP 0xbeef → 6081 with checksum 0.
	wire.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := wire.Read(buf)
		if err != nil {
			t.Fatalf("no UDP frame seen on the link: %v", err)
		}
		f := buf[:n]
		if len(f) < 62 || binary.BigEndian.Uint16(f[12:]) != 0x86dd || f[20] != 17 {
			continue // neighbour discovery and the like
		}
		udp := f[54:]
		if sp, dp, sum := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]), binary.BigEndian.Uint16(udp[6:]); sp != 0xbeef || dp != 6081 || sum != 0 {
			t.Errorf("UDP on the wire: %d → %d, checksum %#04x; want 48879 → 6081, 0", sp, dp, sum)
		}
		if hops, l := f[21], binary.BigEndian.Uint16(udp[4:]); hops != 128 || int(l) != 8+len(payload) {
			t.Errorf("hop limit %d, UDP length %d; want 128, %d", hops, l, 8+len(payload))
		}
		break
	}
}

// A port reads what the link receives and writes what the link sends; it
// does not read its own writes; a deadline ends a read, and so does Close.
func TestPortReadsAndWritesFrames(t *testing.T) {
	nsA, nsB, tag := testNets(t)
	pa, pb := openPorts(t, nsA, nsB, tag)
	// A frame to a MAC that is neither end's, of an EtherType no stack
	// takes: a port reads every frame its link receives.
	frame := testFrame([]byte("a guest's frame"))
	frame = append(frame, make([]byte, 60-len(frame))...)
	if err := pa.Write(frame); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	pb.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := pb.Read(buf)
		if err != nil {
			t.Fatalf("the frame did not arrive: %v", err)
		}
		if bytes.Equal(buf[:n], frame) {
			break
		}
	}
	// Its own write is not read back.
	pa.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		n, err := pa.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(buf[:n], frame) {
			t.Fatal("the port read its own write")
		}
	}
	// Close ends a read in progress (frames the link gets meanwhile, its
	// neighbour discovery, are read and passed over).
	pb.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := pb.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	pb.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a read in progress")
	}
}

// A port holds PacketSocketsPerPort packet sockets of the process, and
// Close closes them all; it knows its link's MTU.
func TestPortSocketsAndClose(t *testing.T) {
	nsA, _, tag := testNets(t)
	before := packetSockets(t)
	p, err := OpenPort(nsA, tag+"a")
	if err != nil {
		t.Fatal(err)
	}
	if p.MTU() != 1500 {
		t.Errorf("MTU %d, want the veth's 1500", p.MTU())
	}
	if n := packetSockets(t); n != before+PacketSocketsPerPort {
		t.Errorf("%d packet sockets with the port open, %d before; want %d more", n, before, PacketSocketsPerPort)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := packetSockets(t); n != before {
		t.Errorf("%d packet sockets after Close, %d before", n, before)
	}
}

// packetSockets counts this process's packet sockets.
func packetSockets(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	buf := make([]byte, 64)
	for _, e := range ents {
		if m, err := unix.Getxattr("/proc/self/fd/"+e.Name(), "system.sockprotoname", buf); err == nil && string(bytes.TrimRight(buf[:m], "\x00")) == "PACKET" {
			n++
		}
	}
	return n
}

// A short buffer gets the frame's start and ErrTruncated.
func TestPortTruncates(t *testing.T) {
	nsA, nsB, tag := testNets(t)
	pa, pb := openPorts(t, nsA, nsB, tag)
	frame := testFrame(bytes.Repeat([]byte{7}, 200))
	if err := pa.Write(frame); err != nil {
		t.Fatal(err)
	}
	pb.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for {
		n, err := pb.Read(buf)
		if errors.Is(err, ErrTruncated) {
			if n != 100 || !bytes.Equal(buf, frame[:100]) {
				t.Errorf("truncated read: %d bytes", n)
			}
			return
		}
		if err != nil {
			t.Fatalf("no truncated read: %v", err)
		}
	}
}

// A frame written and read through ports allocates nothing: the data path
// does both for every frame.
func TestPortFrameAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops what is put back at random")
	}
	nsA, nsB, tag := testNets(t)
	pa, pb := openPorts(t, nsA, nsB, tag)
	frame := testFrame(bytes.Repeat([]byte{7}, 1486))
	buf := make([]byte, 2048)
	pb.SetReadDeadline(time.Now().Add(10 * time.Second))
	lost := false
	allocs := testing.AllocsPerRun(200, func() {
		if err := pa.Write(frame); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := pb.Read(buf)
			if err != nil {
				lost = true
				return
			}
			if n == len(frame) {
				return
			}
		}
	})
	if lost {
		t.Fatal("a frame did not arrive")
	}
	if allocs != 0 {
		t.Errorf("%v allocations per frame written and read", allocs)
	}
}

// The cost of moving one 1500-byte frame through a port (written on one end
// of a veth pair, read on the other) and one 1550-byte Geneve datagram
// through the underlay (sent from one sled's socket, read at the other's),
// one at a time: the next is sent once the last arrived, so ns/op is the
// one-way latency of the data path's I/O with nothing else in flight, the
// floor under its round trips.
func BenchmarkPortFrame1500(b *testing.B) {
	benchPair(b, func(nsA, nsB, tag string) (send func([]byte) error, recv func([]byte) (int, error)) {
		pa, pb := openPorts(b, nsA, nsB, tag)
		return pa.Write, pb.Read
	}, 1500)
}

func BenchmarkUnderlayDatagram1400(b *testing.B) {
	benchPair(b, func(nsA, nsB, tag string) (send func([]byte) error, recv func([]byte) (int, error)) {
		ua, ub := listenUnderlays(b, nsA, nsB)
		return func(p []byte) error { return ua.WriteTo(p, underlayB, 40000) },
			func(p []byte) (int, error) { n, _, err := ub.ReadFrom(p); return n, err }
	}, 1400)
}

// benchPair sends b.N messages of size bytes one way, each once the last
// arrived (a lost one is given up after a second and counted).
func benchPair(b *testing.B, open func(nsA, nsB, tag string) (func([]byte) error, func([]byte) (int, error)), size int) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	nsA, nsB, tag := testNets(b)
	send, recv := open(nsA, nsB, tag)
	msg := testFrame(make([]byte, size-14))
	arrived := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			m, err := recv(buf)
			if err != nil {
				return
			}
			if m == size {
				arrived <- struct{}{}
			}
		}
	}()
	// The first may wait on neighbour discovery: not timed.
	send(msg)
	select {
	case <-arrived:
	case <-time.After(2 * time.Second):
	}
	lost := 0
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if err := send(msg); err != nil {
			b.Fatal(err)
		}
		select {
		case <-arrived:
		case <-time.After(time.Second):
			lost++
		}
	}
	b.ReportMetric(float64(lost), "lost")
}

// Sending a datagram to the underlay allocates nothing.
func TestUnderlayWriteAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops what is put back at random")
	}
	nsA, nsB, _ := testNets(t)
	ua, _ := listenUnderlays(t, nsA, nsB)
	payload := bytes.Repeat([]byte{7}, 1400)
	allocs := testing.AllocsPerRun(200, func() {
		if err := ua.WriteTo(payload, underlayB, 40000); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per datagram sent", allocs)
	}
}
