package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sled-agent/sled-agent/internal/vpc/netio"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// What the acceptance steps see on the wire: frames captured on the rack's
// bridge and on a guest's eth0 by packet sockets, the gateway's answer to
// an ARP request, Geneve made with the wire package's builders and put on
// the rack's bridge as if a sled had sent it, and what the agents answer
// about routes and mappings.

// gatewayMAC is the MAC of every VPC subnet's gateway (OPTE's
// oxide-vpc GW_MAC), written out here rather than taken from the code
// under test.
const gatewayMAC = "a8:40:25:ff:77:77"

// macOf parses a MAC written a8:40:25:….
func macOf(t *testing.T, s string) wire.MAC {
	t.Helper()
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		t.Fatalf("MAC %q: %v", s, err)
	}
	return wire.MAC(hw)
}

// underlayMAC is the MAC of the sled's underlay link ul0.
func (s *vpcSled) underlayMAC(t *testing.T) wire.MAC {
	t.Helper()
	var m wire.MAC
	vpctest.OnLink(t, "/run/netns/"+s.ns, "ul0", func(_ *netlink.Handle, l netlink.Link) error {
		m = wire.MAC(l.Attrs().HardwareAddr)
		return nil
	})
	return m
}

// capture keeps the frames a link receives, read by a packet socket in
// the link's namespace, until the test ends (the first captureMax).
type capture struct {
	mu     sync.Mutex
	frames [][]byte
}

const captureMax = 1 << 14

// startCapture captures on the link in the namespace at path. A bridge
// passes up to its own link only what is for the host; captured there, it
// is made promiscuous so that it passes up what it forwards between its
// ports too.
func startCapture(t *testing.T, path, link string) *capture {
	t.Helper()
	vpctest.OnLink(t, path, link, func(h *netlink.Handle, l netlink.Link) error {
		if l.Type() != "bridge" {
			return nil
		}
		return h.SetPromiscOn(l)
	})
	p, err := netio.OpenPort(path, link)
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, err := p.Read(buf)
			if err != nil && !errors.Is(err, netio.ErrTruncated) {
				return // closed
			}
			c.mu.Lock()
			if len(c.frames) < captureMax {
				c.frames = append(c.frames, slices.Clone(buf[:n]))
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.Close()
		<-done
	})
	return c
}

// seen are the frames captured so far.
func (c *capture) seen() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.frames)
}

// underlayPacket is a captured IPv6 UDP packet to port 6081: its outer
// headers and Geneve header as wire.DecapFrame reads them (err when it
// refuses them), its options, and its inner frame.
type underlayPacket struct {
	raw   []byte
	d     wire.Decap
	err   error
	opts  []wire.Option
	inner wire.Frame
}

// geneve are the packets to port 6081 among the frames captured.
func (c *capture) geneve() []underlayPacket {
	var out []underlayPacket
	for _, b := range c.seen() {
		p := underlayPacket{raw: b}
		p.err = wire.DecapFrame(b, &p.d)
		if p.d.DstPort != wire.GenevePort {
			continue // not UDP to 6081
		}
		if p.err == nil {
			it := wire.GeneveOptions(b[wire.OuterLen:])
			for {
				o, ok, err := it.Next()
				if err != nil {
					p.err = err
				}
				if !ok {
					break
				}
				p.opts = append(p.opts, o)
			}
		}
		if p.err == nil {
			p.err = wire.Parse(p.d.Inner(b), &p.inner)
		}
		out = append(out, p)
	}
	return out
}

// waitGeneve waits up to wait for a Geneve packet captured, whole, for
// which match holds.
func (c *capture) waitGeneve(wait time.Duration, match func(*underlayPacket) bool) (underlayPacket, bool) {
	deadline := time.Now().Add(wait)
	for {
		for _, p := range c.geneve() {
			if p.err == nil && match(&p) {
				return p, true
			}
		}
		if time.Now().After(deadline) {
			return underlayPacket{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkOverlay checks the Geneve packets the capture on the rack's bridge
// saw from a's sled to b's, as VPC.md S3 wants them: from the inner flow's
// hash (OPTE's entropy) as UDP source port to 6081, with UDP checksum 0
// and hop limit 128, Geneve version 0 carrying Ethernet in a's VNI, the inner
// frame from a's MAC to b's; TCP segments with exactly the Oxide MSS
// option (class 0x0129, type 0x02, one 4-byte word), ICMP and UDP with no
// option. Each of the three must have been seen from a's address to b's.
func checkOverlay(t *testing.T, c *capture, a, b *acceptGuest) {
	t.Helper()
	src, dst := netip.MustParseAddr(a.sled.underlay), netip.MustParseAddr(b.sled.underlay)
	aMAC, bMAC := macOf(t, a.mac), macOf(t, b.mac)
	aIP, bIP := netip.MustParseAddr(a.ip), netip.MustParseAddr(b.ip)
	seen := map[uint8]int{}
	for _, p := range c.geneve() {
		if p.d.Src != src || p.d.Dst != dst {
			continue
		}
		if p.err != nil {
			t.Errorf("a Geneve packet from %s to %s that does not read: %v\n% x", src, dst, p.err, p.raw)
			continue
		}
		g := p.raw[wire.OuterLen:]
		switch {
		case p.d.UDPChecksum != 0:
			t.Errorf("Geneve from %s to %s with UDP checksum %#04x, want 0", src, dst, p.d.UDPChecksum)
		case p.d.SrcPort != p.inner.FlowKey().Entropy() || p.d.HopLimit != wire.OPTEHopLimit:
			t.Errorf("Geneve from %s to %s from UDP port %d with hop limit %d, want the inner flow's hash %d and %d",
				src, dst, p.d.SrcPort, p.d.HopLimit, p.inner.FlowKey().Entropy(), wire.OPTEHopLimit)
		case g[0]>>6 != 0:
			t.Errorf("Geneve version %d, want 0", g[0]>>6)
		case p.d.Geneve.Protocol != wire.GeneveProtoEthernet:
			t.Errorf("Geneve protocol %#04x, want 0x6558", p.d.Geneve.Protocol)
		case p.d.Geneve.VNI != uint32(a.vni):
			t.Errorf("Geneve VNI %d, want %d", p.d.Geneve.VNI, a.vni)
		case p.inner.Dst != bMAC || p.inner.Src != aMAC:
			t.Errorf("inner frame %s → %s, want %s → %s", p.inner.Src, p.inner.Dst, aMAC, bMAC)
		}
		if p.inner.L3 != wire.L3IPv4 || p.inner.SrcIP != aIP || p.inner.DstIP != bIP {
			continue
		}
		var opts []string
		for _, o := range p.opts {
			opts = append(opts, fmt.Sprintf("class %#04x type %#02x len %d", o.Class, o.Type, len(o.Data)/4))
		}
		switch p.inner.Proto {
		case wire.ProtoTCP:
			if want := []string{"class 0x0129 type 0x02 len 1"}; !slices.Equal(opts, want) {
				t.Errorf("Geneve options of a TCP segment from %s to %s: %v, want %v", aIP, bIP, opts, want)
			}
		case wire.ProtoICMP, wire.ProtoUDP:
			if len(opts) != 0 {
				t.Errorf("Geneve options of protocol %d from %s to %s: %v, want none", p.inner.Proto, aIP, bIP, opts)
			}
		}
		seen[p.inner.Proto]++
	}
	for proto, name := range map[uint8]string{wire.ProtoICMP: "ICMP", wire.ProtoUDP: "UDP", wire.ProtoTCP: "TCP"} {
		if seen[proto] == 0 {
			t.Errorf("no %s from %s to %s in Geneve from %s to %s on the rack's bridge (%d frames captured)", name, aIP, bIP, src, dst, len(c.seen()))
		}
	}
}

// checkFromGateway checks that the frames from a's address captured on
// b's guest's eth0 came from the gateway's MAC to b's: as OPTE delivers
// them, rewritten at b's port. At least one must have been seen.
func checkFromGateway(t *testing.T, c *capture, a, b *acceptGuest) {
	t.Helper()
	aIP, bMAC := netip.MustParseAddr(a.ip), macOf(t, b.mac)
	n := 0
	for _, raw := range c.seen() {
		var f wire.Frame
		if wire.Parse(raw, &f) != nil || f.L3 != wire.L3IPv4 || f.SrcIP != aIP {
			continue
		}
		n++
		if f.Src.String() != gatewayMAC || f.Dst != bMAC {
			t.Errorf("%s's guest got from %s a frame %s → %s, want %s → %s", b.name, aIP, f.Src, f.Dst, gatewayMAC, bMAC)
		}
	}
	if n == 0 {
		t.Errorf("%s's guest's eth0 got nothing from %s", b.name, aIP)
	}
}

// gatewayARP asks from g's eth0, with a packet socket, who has the
// gateway's address, and returns who the answer says has it.
func gatewayARP(t *testing.T, g *acceptGuest, debug func() string) wire.MAC {
	t.Helper()
	p, err := netio.OpenPort(g.ns, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mac, ip, gw := macOf(t, g.mac), netip.MustParseAddr(g.ip), netip.MustParseAddr("172.30.0.1")
	req := make([]byte, wire.EthernetLen+wire.ARPLen)
	wire.PutEthernet(req, wire.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac, wire.EtherTypeARP)
	if err := wire.PutARP(req[wire.EthernetLen:], &wire.ARP{Op: wire.ARPRequest, SenderMAC: mac, SenderIP: ip, TargetIP: gw}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<16)
	deadline := time.Now().Add(waitDeadline)
	for {
		if err := p.Write(req); err != nil && !errors.Is(err, netio.ErrBusy) {
			t.Fatal(err)
		}
		p.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			n, err := p.Read(buf)
			if err != nil && !errors.Is(err, netio.ErrTruncated) {
				break
			}
			var f wire.Frame
			if wire.Parse(buf[:n], &f) == nil && f.L3 == wire.L3ARP && f.ARP.Op == wire.ARPReply &&
				f.ARP.SenderIP == gw && f.ARP.TargetIP == ip && f.Dst == mac {
				if f.Src != f.ARP.SenderMAC {
					t.Errorf("the ARP reply for %s comes from %s and says %s", gw, f.Src, f.ARP.SenderMAC)
				}
				return f.ARP.SenderMAC
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's ARP request for %s was not answered\n%s", g.name, gw, debug())
		}
	}
}

// injector puts Geneve on the rack's bridge as if the sled from had sent
// it to the sled to: outer Ethernet between their underlay links' MACs.
type injector struct {
	p                  *netio.Port
	outerSrc, outerDst wire.MAC
	from, to           netip.Addr
}

func newInjector(t *testing.T, from, to *vpcSled) *injector {
	t.Helper()
	p, err := netio.OpenPort(from.rack, "br0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &injector{p: p, outerSrc: from.underlayMAC(t), outerDst: to.underlayMAC(t),
		from: netip.MustParseAddr(from.underlay), to: netip.MustParseAddr(to.underlay)}
}

// udp sends, in VNI vni, a UDP datagram from a's guest (port 40000) to
// dst's guest at port, inner frame from a's MAC to dst's, encapsulated as
// OPTE does (wire.InternalEncap).
func (in *injector) udp(t *testing.T, vni uint32, a, dst *acceptGuest, port uint16, payload string) {
	t.Helper()
	inner := make([]byte, wire.EthernetLen+wire.IPv4MinLen+wire.UDPLen+len(payload))
	wire.PutEthernet(inner, macOf(t, dst.mac), macOf(t, a.mac), wire.EtherTypeIPv4)
	l := wire.UDPLen + len(payload)
	if _, err := wire.PutIPv4(inner[wire.EthernetLen:], netip.MustParseAddr(a.ip), netip.MustParseAddr(dst.ip), wire.ProtoUDP, l, 64, 1, true); err != nil {
		t.Fatal(err)
	}
	if _, err := wire.PutUDP(inner[wire.EthernetLen+wire.IPv4MinLen:], 40000, port, len(payload)); err != nil {
		t.Fatal(err)
	}
	copy(inner[wire.EthernetLen+wire.IPv4MinLen+wire.UDPLen:], payload)
	var f wire.Frame
	if err := wire.Parse(inner, &f); err != nil {
		t.Fatal(err)
	}
	f.SetChecksums(inner)
	e := wire.InternalEncap(vni, in.from, in.to, f.FlowKey())
	e.OuterSrc, e.OuterDst = in.outerSrc, in.outerDst
	out := make([]byte, e.FrameHeaderLen()+len(inner))
	n, err := e.EncapFrame(out, inner)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.p.Write(out[:n]); err != nil && !errors.Is(err, netio.ErrBusy) {
		t.Fatal(err)
	}
}

// udpSink is a UDP socket in a namespace that keeps the payloads it gets.
type udpSink struct {
	mu  sync.Mutex
	got map[string]int
}

func newUDPSink(t *testing.T, ns, addr string) *udpSink {
	t.Helper()
	c := vpctest.ListenUDP(t, ns, addr)
	s := &udpSink{got: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got[string(buf[:n])]++
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return s
}

// heard is how many datagrams carried payload.
func (s *udpSink) heard(payload string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[payload]
}

// unmatched is what the sled's data path dropped for no port (Geneve whose
// VNI and inner MAC are no port's).
func (s *vpcSled) unmatched(t *testing.T) uint64 {
	t.Helper()
	st, err := s.dataPath().State(t.Context())
	if err != nil {
		t.Fatalf("sled %s: the data path's state: %v", s.tag, err)
	}
	return st.Unmatched.Dropped["no such port"]
}

// systemRouter is the router of VNI 7777's system route set, as Nexus
// names it in its versions.
const systemRouter = "5e5e0c5e-0000-4000-8000-000000000001"

// checkRouteVersions checks GET /vpc-routes on s: VNI 7777's system set
// at the system router's version, its custom set with none.
func checkRouteVersions(t *testing.T, n *nexus, s *vpcSled, version uint64) {
	t.Helper()
	var got []struct {
		ID      json.RawMessage `json:"id"`
		Version *struct {
			RouterID string `json:"router_id"`
			Version  uint64 `json:"version"`
		} `json:"version"`
	}
	out := n.must(s, http.StatusOK, http.MethodGet, "/vpc-routes", "")
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, r := range got {
		switch string(r.ID) {
		case `{"vni":7777,"kind":{"type":"system"}}`:
			found++
			if r.Version == nil || r.Version.RouterID != systemRouter || r.Version.Version != version {
				t.Errorf("sled %s: GET /vpc-routes: the system set's version in %s, want {%s, %d}", s.tag, out, systemRouter, version)
			}
		case `{"vni":7777,"kind":{"type":"custom","subnet":"172.30.0.0/22"}}`:
			found++
			if r.Version != nil {
				t.Errorf("sled %s: GET /vpc-routes: the custom set has a version in %s, want null", s.tag, out)
			}
		}
	}
	if found != 2 {
		t.Errorf("sled %s: GET /vpc-routes = %s, want VNI 7777's system and custom sets", s.tag, out)
	}
}

// checkV2P checks that GET /v2p on s returns exactly the guests' mappings,
// as Nexus pushed them, in any order.
func checkV2P(t *testing.T, n *nexus, s *vpcSled, gs ...*acceptGuest) {
	t.Helper()
	canon := func(raw string) []string {
		var ms []map[string]any
		if err := json.Unmarshal([]byte(raw), &ms); err != nil {
			t.Fatalf("sled %s: GET /v2p: %v in %s", s.tag, err, raw)
		}
		var out []string
		for _, m := range ms {
			b, _ := json.Marshal(m) // keys sorted
			out = append(out, string(b))
		}
		slices.Sort(out)
		return out
	}
	want := "["
	for i, g := range gs {
		if i > 0 {
			want += ","
		}
		want += g.v2p()
	}
	out := n.must(s, http.StatusOK, http.MethodGet, "/v2p", "")
	if got, w := canon(out), canon(want+"]"); !slices.Equal(got, w) {
		t.Errorf("sled %s: GET /v2p = %v, want %v", s.tag, got, w)
	}
}
