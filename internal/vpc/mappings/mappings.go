// Package mappings holds the sled-wide tables of the VPC data path, as
// OPTE keeps them (opte lib/oxide-vpc/src/engine/overlay.rs): v2p, where a
// VPC's addresses live (VNI and virtual IP → the guest's MAC and its sled's
// underlay address), which Nexus fills with PUT /v2p; and v2b, where traffic
// for outside the rack leaves it (a prefix → the switches' tunnel
// endpoints), which the sled's routing daemon fills from what the switches
// originate (ddmd's sys.rs, GET /tunnel_endpoints here). Both are global to
// the sled and independent of its ports: a mapping may come before any port
// that uses it.
//
// Reads are the data path's, for every new flow: they take no lock (an
// immutable snapshot behind an atomic pointer). Writes are the control
// plane's, rare: each builds a new snapshot under a writers' lock and bumps
// the table's epoch. Unlike OPTE, whose v2p writes leave cached flows as
// they were until they expire (opte#221), the engine is meant to drop its
// cached flows when the epoch moves, so a changed mapping holds for every
// packet after it.
package mappings

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
)

// MaxVNI is the largest Geneve VNI (24 bits).
const MaxVNI = 1<<24 - 1

// Phys is where a virtual address lives: its guest's MAC, and the underlay
// address of its sled.
type Phys struct {
	MAC  [6]byte
	Sled netip.Addr
}

// HardwareAddr is p's MAC as net's type.
func (p Phys) HardwareAddr() net.HardwareAddr { return net.HardwareAddr(p.MAC[:]) }

// Mapping is one v2p entry, as GET /v2p lists them.
type Mapping struct {
	VNI       uint32
	VirtualIP netip.Addr
	Phys
}

type v2pKey struct {
	vni uint32
	ip  netip.Addr
}

// V2P is the sled's virtual-to-physical table. The zero value is empty and
// ready.
type V2P struct {
	mu    sync.Mutex // writers
	snap  atomic.Pointer[v2pSnap]
	epoch atomic.Uint64
}

// v2pSnap is an immutable state of the table: its mappings, and for each
// address the lowest VNI holding it (VNIOf, for every new flow).
type v2pSnap struct {
	m     map[v2pKey]Phys
	vniOf map[netip.Addr]uint32
}

func (t *V2P) load() map[v2pKey]Phys {
	if s := t.snap.Load(); s != nil {
		return s.m
	}
	return nil
}

// Set maps vip in vni to phys, replacing what it was mapped to (upstream's
// set_v2p: keyed by VNI and virtual IP). It reports whether anything
// changed.
func (t *V2P) Set(vni uint32, vip netip.Addr, phys Phys) (bool, error) {
	if err := checkKey(vni, vip); err != nil {
		return false, err
	}
	if !phys.Sled.Is6() || phys.Sled.Is4In6() {
		return false, fmt.Errorf("v2p: sled address %s: want IPv6", phys.Sled)
	}
	k := v2pKey{vni, vip.Unmap()}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	if p, ok := old[k]; ok && p == phys {
		return false, nil
	}
	m := maps.Clone(old)
	if m == nil {
		m = map[v2pKey]Phys{}
	}
	m[k] = phys
	t.publish(m)
	return true, nil
}

// Del removes the mapping of vip in vni, whatever it maps to (upstream's
// clear_v2p deletes by VNI and virtual IP; the MAC and sled of the request
// are not compared). It returns what was removed.
func (t *V2P) Del(vni uint32, vip netip.Addr) (Phys, bool) {
	k := v2pKey{vni, vip.Unmap()}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.load()
	p, ok := old[k]
	if !ok {
		return Phys{}, false
	}
	m := maps.Clone(old)
	delete(m, k)
	t.publish(m)
	return p, true
}

func (t *V2P) publish(m map[v2pKey]Phys) {
	s := &v2pSnap{m: m, vniOf: make(map[netip.Addr]uint32, len(m))}
	for k := range m {
		if v, ok := s.vniOf[k.ip]; !ok || k.vni < v {
			s.vniOf[k.ip] = k.vni
		}
	}
	t.snap.Store(s)
	t.epoch.Add(1)
}

// Get is where vip of vni lives.
func (t *V2P) Get(vni uint32, vip netip.Addr) (Phys, bool) {
	p, ok := t.load()[v2pKey{vni, vip.Unmap()}]
	return p, ok
}

// VNIOf is the VNI that holds vip: the lowest, if several do (OPTE's
// ip_to_vni walks its VNIs in order and takes the first; the control plane
// keeps peered VPCs' addresses apart). The gateway tags an outbound flow
// with it, for the firewall's "vpc" host filter.
func (t *V2P) VNIOf(vip netip.Addr) (uint32, bool) {
	s := t.snap.Load()
	if s == nil {
		return 0, false
	}
	vni, ok := s.vniOf[vip.Unmap()]
	return vni, ok
}

// Dump lists every mapping, by VNI, then address.
func (t *V2P) Dump() []Mapping {
	m := t.load()
	out := make([]Mapping, 0, len(m))
	for k, p := range m {
		out = append(out, Mapping{VNI: k.vni, VirtualIP: k.ip, Phys: p})
	}
	slices.SortFunc(out, func(a, b Mapping) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), a.VirtualIP.Compare(b.VirtualIP))
	})
	return out
}

// Len is how many mappings there are.
func (t *V2P) Len() int { return len(t.load()) }

// Epoch moves with every change.
func (t *V2P) Epoch() uint64 { return t.epoch.Load() }

func checkKey(vni uint32, vip netip.Addr) error {
	if vni > MaxVNI {
		return fmt.Errorf("v2p: VNI %d: want at most %d (24 bits)", vni, MaxVNI)
	}
	if !vip.IsValid() {
		return fmt.Errorf("v2p: no virtual IP")
	}
	return nil
}
