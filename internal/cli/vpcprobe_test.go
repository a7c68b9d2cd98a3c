package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/openapitest"
	"github.com/sled-agent/sled-agent/internal/runtime/linux/zonenet"
	"github.com/sled-agent/sled-agent/internal/vmm/ensurebody"
	"github.com/sled-agent/sled-agent/internal/vpc/engine"
	"github.com/sled-agent/sled-agent/internal/vpc/vpctest"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// What the acceptance steps drive and watch: Nexus's calls to the sleds'
// agents, checked against upstream's document; guests registered as Nexus
// registers them; probes sent from inside namespaces, answered or
// dropped by the data path, as its counters say.

// nexus plays Nexus toward the sleds: every exchange must be upstream's
// sled-agent 48.0.0 (request and answer).
type nexus struct {
	t    *testing.T
	spec *openapitest.Spec
}

func newNexus(t *testing.T) *nexus {
	return &nexus{t: t, spec: openapitest.Load(t, "sled-agent-48.0.0.json")}
}

// call sends one operation to sled s's agent and returns its answer.
func (n *nexus) call(s *vpcSled, method, path, body string) (int, string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(n.t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://[::1]:12345"+path, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	req.Header.Set("api-version", "48.0.0")
	var raw []byte
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		raw = []byte(body)
	}
	x, err := n.spec.Do(n.t, s.hc, req, raw)
	if err != nil {
		n.t.Errorf("sled %s: %s %s is not upstream's: %v", s.tag, method, path, err)
	}
	return x.Status, string(x.Body)
}

// must sends one operation and fails the test unless it answers want.
func (n *nexus) must(s *vpcSled, want int, method, path, body string) string {
	n.t.Helper()
	code, out := n.call(s, method, path, body)
	if code != want {
		n.t.Fatalf("sled %s: %s %s: %d %s, want %d", s.tag, method, path, code, out, want)
	}
	return out
}

// all sends one operation to every sled, each answering 204.
func (n *nexus) all(sleds []*vpcSled, method, path, body string) {
	n.t.Helper()
	for _, s := range sleds {
		n.must(s, http.StatusNoContent, method, path, body)
	}
}

// acceptGuest is a guest of the steps: its VMM on a sled and its one NIC.
type acceptGuest struct {
	name                        string
	sled                        *vpcSled
	vmm, nic, instance, mac, ip string
	vni                         int
	ns                          string // its stand-in's namespace, once found
	// addr is its propolis_addr, when not its sled's (a second guest of
	// the sled).
	addr string
}

// sledGuest is the guest twoSleds filled in for s, in VNI 7777.
func sledGuest(name string, s *vpcSled) *acceptGuest {
	return &acceptGuest{name: name, sled: s, vmm: s.vmm, nic: s.nic, instance: s.instanceID(), mac: s.mac, ip: s.ip, vni: 7777}
}

// nicJSON is the guest's NIC as Nexus writes a NetworkInterface.
func (g *acceptGuest) nicJSON() string {
	return vpcNIC(g.nic, g.instance, g.ip, "172.30.0.0/22", g.mac, g.vni)
}

// v2p is the guest's mapping as Nexus pushes it.
func (g *acceptGuest) v2p() string { return vpcV2P(g.ip, g.mac, g.sled.underlay, g.vni) }

// register registers the guest's VMM on its sled as Nexus does (VPC.md
// S1): its NIC, the VPC's firewall rules (a JSON array), its source NAT
// address snat with ports 16384-32767, Nexus's DHCP settings; then runs
// it.
func (g *acceptGuest) register(n *nexus, firewall, snat string) {
	n.t.Helper()
	addr := g.addr
	if addr == "" {
		addr = g.sled.addr
	}
	body := ensurebody.Body(ensurebody.Instance{InstanceID: g.instance, PropolisAddr: addr, Hostname: "inst-" + g.name,
		NICID: g.nic, MAC: strings.ToUpper(g.mac), NICIP: g.ip, NICSubnet: "172.30.0.0/22", VNI: uint32(g.vni),
		ProjectID: "960e0000-0000-4000-8000-000000000001", SiloID: "5170e000-0000-4000-8000-000000000001"},
		ensurebody.Spec(ensurebody.Guest{CPUs: 1, MemoryMiB: 256, NICID: g.nic, ImageBlob: []byte{0, 0, 0, 0}}), nil)
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		n.t.Fatal(err)
	}
	lc := m["local_config"].(map[string]any)
	lc["firewall_rules"] = json.RawMessage(firewall)
	lc["external_ips"] = json.RawMessage(`{"v4":{"source_nat":{"ip":"` + snat + `","first_port":16384,"last_port":32767},"ephemeral_ip":null,"floating_ips":[]}}`)
	lc["dhcp_config"] = json.RawMessage(`{"dns_servers":["1.1.1.1"],"host_domain":null,"search_domains":[]}`)
	lc["primary_nic_mtu"] = nil
	body, err := json.Marshal(m)
	if err != nil {
		n.t.Fatal(err)
	}
	n.must(g.sled, http.StatusOK, http.MethodPut, "/vmms/"+g.vmm, string(body))
	n.must(g.sled, http.StatusOK, http.MethodPut, "/vmms/"+g.vmm+"/state", `{"state":{"type":"running"}}`)
}

// findGuests waits for the guests' stand-ins and sets each up as OPTE's
// DHCP would leave it.
func findGuests(t *testing.T, gs ...*acceptGuest) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		found := standInGuests(t)
		missing := 0
		for _, g := range gs {
			if g.ns = found[g.mac]; g.ns == "" {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stand-in guests found: %v", found)
		}
		time.Sleep(waitInterval)
	}
	for _, g := range gs {
		vpctest.ConfigureGuest(t, g.ns, g.ip)
	}
}

// stats are the counters of the guest's port on its sled's data path.
func (g *acceptGuest) stats(t *testing.T) engine.Stats {
	t.Helper()
	// The port is made a moment after the guest's link appears.
	deadline := time.Now().Add(waitDeadline)
	for {
		st, err := g.sled.dataPath().State(t.Context())
		if err != nil {
			t.Fatalf("sled %s: the data path's state: %v", g.sled.tag, err)
		}
		for _, p := range st.Ports {
			if strings.EqualFold(p.Spec.MAC.String(), g.mac) {
				return p.Stats
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sled %s has no port of %s's MAC %s: %+v", g.sled.tag, g.name, g.mac, st.Ports)
		}
		time.Sleep(waitInterval)
	}
}

// probe is a way to send something and see whether it was answered.
type probe interface {
	send()
	// answered reads for up to wait; true once an answer came.
	answered(wait time.Duration) bool
	String() string
}

// answeredProbe sends p until it is answered.
func answeredProbe(t *testing.T, what string, p probe, debug func() string) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		p.send()
		if p.answered(300 * time.Millisecond) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s was not answered\n%s", what, p, debug())
		}
	}
}

// droppedProbe sends p until the port of g counts one more drop for
// reason (an engine.Reason's name), and fails if it is answered: what
// the data path drops is never delivered.
func droppedProbe(t *testing.T, what string, p probe, g *acceptGuest, reason string, debug func() string) {
	t.Helper()
	before := g.stats(t).Dropped[reason]
	deadline := time.Now().Add(waitDeadline)
	for {
		p.send()
		if p.answered(100 * time.Millisecond) {
			t.Fatalf("%s: %s was answered, want it dropped (%s on %s)\n%s", what, p, reason, g.name, debug())
		}
		if g.stats(t).Dropped[reason] > before {
			if p.answered(50 * time.Millisecond) {
				t.Fatalf("%s: %s was answered, want it dropped (%s on %s)\n%s", what, p, reason, g.name, debug())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: %s's port counts no drop for %q (%+v)\n%s", what, p, g.name, reason, g.stats(t), debug())
		}
	}
}

// inNS runs f on a thread in the namespace at path: sockets it makes stay
// there.
func inNS(t *testing.T, path string, f func() error) {
	t.Helper()
	if err := zonenet.RunInPath(path, f); err != nil {
		t.Fatal(err)
	}
}

// udpProbe sends a datagram from a socket of its own in a namespace to
// dst; last is the latest answer.
type udpProbe struct {
	c    *net.UDPConn
	dst  netip.AddrPort
	last string
}

// newUDPProbe binds from (ip:port; port 0 for a fresh one, a new flow) in
// the namespace at ns.
func newUDPProbe(t *testing.T, ns, from, dst string) *udpProbe {
	t.Helper()
	return &udpProbe{c: vpctest.ListenUDP(t, ns, from), dst: netip.MustParseAddrPort(dst)}
}

func (p *udpProbe) send() { p.c.WriteToUDPAddrPort([]byte("probe"), p.dst) }

func (p *udpProbe) answered(wait time.Duration) bool {
	buf := make([]byte, 2048)
	p.c.SetReadDeadline(time.Now().Add(wait))
	for {
		n, from, err := p.c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return false
		}
		if from == p.dst {
			p.last = string(buf[:n])
			return true
		}
	}
}

func (p *udpProbe) String() string { return fmt.Sprintf("UDP %s → %s", p.c.LocalAddr(), p.dst) }

// udpEcho is a UDP echo server in a namespace: it answers "<name> saw
// <source>" and counts what it heard.
type udpEcho struct{ heard atomic.Int64 }

func newUDPEcho(t *testing.T, ns, addr, name string) *udpEcho {
	t.Helper()
	e := &udpEcho{}
	vpctest.Answer(vpctest.ListenUDP(t, ns, addr), func(from netip.AddrPort, _ []byte) []byte {
		e.heard.Add(1)
		return []byte(name + " saw " + from.String())
	})
	return e
}

// icmpProbe sends ICMP echo requests, hand-made, from a raw socket in a
// namespace to dst, under an identifier of its own.
type icmpProbe struct {
	c       net.PacketConn
	dst     netip.Addr
	id, seq uint16
}

func newICMPProbe(t *testing.T, ns, dst string) *icmpProbe {
	t.Helper()
	p := &icmpProbe{dst: netip.MustParseAddr(dst)}
	var id [2]byte
	rand.Read(id[:])
	p.id = binary.BigEndian.Uint16(id[:])
	inNS(t, ns, func() (err error) {
		p.c, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	t.Cleanup(func() { p.c.Close() })
	return p
}

func (p *icmpProbe) send() {
	p.seq++
	b := make([]byte, 8, 8+5)
	b[0] = 8 // echo request, code 0
	binary.BigEndian.PutUint16(b[4:], p.id)
	binary.BigEndian.PutUint16(b[6:], p.seq)
	b = append(b, "probe"...)
	binary.BigEndian.PutUint16(b[2:], wire.Fold(wire.Sum(b, 0)))
	p.c.WriteTo(b, &net.IPAddr{IP: p.dst.AsSlice()})
}

func (p *icmpProbe) answered(wait time.Duration) bool {
	buf := make([]byte, 2048)
	p.c.SetReadDeadline(time.Now().Add(wait))
	for {
		n, from, err := p.c.ReadFrom(buf)
		if err != nil {
			return false
		}
		b := buf[:n]
		if len(b) >= 20 && b[0]>>4 == 4 { // with its IPv4 header
			b = b[int(b[0]&0xf)*4:]
		}
		a, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if ok && a.Unmap() == p.dst && len(b) >= 8 && b[0] == 0 && binary.BigEndian.Uint16(b[4:]) == p.id {
			return true
		}
	}
}

func (p *icmpProbe) String() string { return fmt.Sprintf("ICMP echo id %d → %s", p.id, p.dst) }

// tcpServe accepts connections on addr in a namespace and writes each
// "SSH-2.0-<name> <peer>\r\n".
func tcpServe(t *testing.T, ns, addr, name string) {
	t.Helper()
	var ln net.Listener
	inNS(t, ns, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "SSH-2.0-%s %s\r\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
}

// tcpBanner connects from a namespace to dst until a banner comes, and
// returns it.
func tcpBanner(t *testing.T, what, ns, dst string, debug func() string) string {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		var c net.Conn
		err := zonenet.RunInPath(ns, func() (err error) {
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp4", dst)
			return err
		})
		if err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil {
				return strings.TrimSpace(line)
			}
			err = rerr
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: TCP to %s: %v\n%s", what, dst, err, debug())
		}
		time.Sleep(waitInterval)
	}
}
