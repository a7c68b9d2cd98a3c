// Package engine is the VPC data path's engine: OPTE's per-port pipeline of
// layers (opte xde/src/xde.rs:3242-3266), run on frames in memory. It does
// no I/O: the data path's process reads a guest's frames from its port's
// link and Geneve from the underlay (internal/vpc/netio), hands them here,
// and sends what comes back where it says.
//
// A port's layers, as OPTE orders them: gateway, firewall, router, NAT,
// overlay. A frame from the guest (Outbound) runs them first to last and
// leaves encapsulated for another sled, or is delivered to another port of
// this sled; Geneve from the underlay (Inbound) is matched to its port by
// its VNI and inner destination MAC and runs them last to first. The
// sled-wide tables (v2p, v2b) are internal/vpc/mappings'; the firewall's
// and router's semantics internal/vpc/rules'; frames are parsed and built
// by internal/vpc/wire.
//
// What is done so far, and what is not yet:
//   - gateway (internal/vpc/gateway): ARP, ICMP echo, DHCPv4, RA, NA and
//     DHCPv6 answered as OPTE answers them, anti-spoofing both ways, the
//     source MAC of what a guest receives rewritten to the gateway's, the
//     outbound VNI tag from the v2p table.
//   - firewall: OPTE's rules (rules.Firewall) with stateful allow: an
//     allowed flow's packets, both ways, pass without a new decision until it
//     idles 60 s; a rule change decides every flow again.
//   - router: the port's table (rules.Table), outbound only.
//   - NAT: OPTE's (oxide-vpc engine/nat.rs), per family. Outbound, a flow
//     the router sends to an internet gateway takes the first external
//     address that gateway takes, by priority: floating (one of several by
//     the flow's CRC32), ephemeral, then source NAT with a port (or ICMP
//     echo identifier) of the address's pool; the system gateway takes
//     addresses the gateway map does not hold, an instance gateway those
//     it lists for it; none: dropped. Inbound, a flow to the ephemeral or a
//     floating address is translated 1:1 to the private one. Each NAT flow
//     is kept under both directions' keys so that the other way is
//     translated back; it idles out in 60 s and gives its port back.
//     SetExternalIPs replaces the addresses; flows are checked again on
//     their next packet. The packet an ICMP error quotes is translated
//     with a 1:1 flow, as OPTE's body transforms do (not with SNAT, nor
//     in NDP redirects). Attached external subnets are not translated
//     either way: what the guest sends from one is external as it is,
//     and the gateway lets every attached subnet through both ways.
//   - overlay: v2p for VPC targets, Geneve as OPTE encapsulates it
//     (wire.InternalEncap; the flow's hash, the outer UDP source port, is
//     Result.SrcPort), delivery to a port of this sled without leaving
//     it; internet gateway targets to the boundary tunnel endpoint v2b
//     gives, by the flow's hash after NAT (wire.BoundaryEncap), only from
//     an external address; inbound demultiplexing by (VNI, MAC) and the
//     VNI tag, absent on packets from the switch (External option).
package engine

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/wire"
)

// GatewayMAC is the MAC of every port's gateway, A8:40:25:FF:77:77 (omicron
// illumos-utils/src/opte/mod.rs).
var GatewayMAC = wire.MAC{0xa8, 0x40, 0x25, 0xff, 0x77, 0x77}

// Headroom is how much room a caller leaves before a guest's frame in its
// buffer: an encapsulated frame's Geneve header and options are written
// there, so that the frame is not copied.
const Headroom = 64

// Config is the sled's side of the engine.
type Config struct {
	// Underlay is the sled's underlay address: the outer source of what it
	// sends, and how it knows a v2p target is on this sled.
	Underlay netip.Addr
	V2P      *mappings.V2P
	V2B      *mappings.V2B
	// Now is the clock of the flow tables (time.Now if nil).
	Now func() time.Time
}

// Engine is one sled's data path state: its ports, and the tables it
// shares with the sled.
type Engine struct {
	cfg Config

	mu     sync.RWMutex
	ports  map[string]*Port
	byAddr map[portAddr]*Port // (VNI, MAC): inbound demultiplexing

	// unmatched counts what came from the underlay for no port.
	unmatched counters
}

type portAddr struct {
	vni uint32
	mac wire.MAC
}

// New makes an engine with no port.
func New(cfg Config) (*Engine, error) {
	if !cfg.Underlay.Is6() || cfg.Underlay.Is4In6() {
		return nil, fmt.Errorf("engine: underlay address %s: want IPv6", cfg.Underlay)
	}
	if cfg.V2P == nil {
		cfg.V2P = &mappings.V2P{}
	}
	if cfg.V2B == nil {
		cfg.V2B = &mappings.V2B{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Engine{cfg: cfg, ports: map[string]*Port{}, byAddr: map[portAddr]*Port{}}, nil
}

// V2P is the sled's virtual-to-physical table.
func (e *Engine) V2P() *mappings.V2P { return e.cfg.V2P }

// V2B is the sled's virtual-to-boundary table.
func (e *Engine) V2B() *mappings.V2B { return e.cfg.V2B }

// Errors of port management.
var (
	ErrPortExists = errors.New("engine: a port of that name, or of that VNI and MAC, exists")
	ErrNoPort     = errors.New("engine: no such port")
)

// CreatePort adds a port (OPTE's create_xde), with no router entry and the
// firewall's defaults until told otherwise.
func (e *Engine) CreatePort(cfg PortConfig) (*Port, error) {
	p, err := newPort(e, cfg)
	if err != nil {
		return nil, err
	}
	k := portAddr{cfg.VNI, cfg.MAC}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.ports[cfg.Name]; ok {
		return nil, fmt.Errorf("%w: %s", ErrPortExists, cfg.Name)
	}
	if o, ok := e.byAddr[k]; ok {
		return nil, fmt.Errorf("%w: %s has VNI %d and MAC %s", ErrPortExists, o.cfg.Name, cfg.VNI, cfg.MAC)
	}
	e.ports[cfg.Name] = p
	e.byAddr[k] = p
	return p, nil
}

// DeletePort removes the port called name (OPTE's delete_xde); it reports
// whether there was one.
func (e *Engine) DeletePort(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.ports[name]
	if !ok {
		return false
	}
	delete(e.ports, name)
	delete(e.byAddr, portAddr{p.cfg.VNI, p.cfg.MAC})
	return true
}

// Port is the port called name.
func (e *Engine) Port(name string) (*Port, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	p, ok := e.ports[name]
	return p, ok
}

// Ports lists the ports by name.
func (e *Engine) Ports() []*Port {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]*Port, 0, len(e.ports))
	for _, p := range e.ports {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Port) int {
		if a.cfg.Name < b.cfg.Name {
			return -1
		}
		return 1
	})
	return out
}

func (e *Engine) portByAddr(vni uint32, mac wire.MAC) (*Port, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	p, ok := e.byAddr[portAddr{vni, mac}]
	return p, ok
}

// Unmatched is what came from the underlay and found no port: not Geneve,
// unreadable inside, or for no port's VNI and MAC.
func (e *Engine) Unmatched() Stats { return e.unmatched.snapshot() }

// Expire forgets every port's flows idle past their time, as OPTE sweeps
// each port every second, and gives the SNAT ports of NAT flows back; the
// data path calls it periodically. It returns how many flows went.
func (e *Engine) Expire() int {
	n := 0
	for _, p := range e.Ports() {
		n += len(p.fwFlows.Expire()) + p.expireNAT()
	}
	return n
}
