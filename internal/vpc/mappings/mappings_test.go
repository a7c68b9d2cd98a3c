package mappings

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
)

var (
	ip5   = netip.MustParseAddr("172.30.0.5")
	ip6   = netip.MustParseAddr("172.30.0.6")
	sledA = netip.MustParseAddr("fd00:1122:3344:101::1")
	sledB = netip.MustParseAddr("fd00:1122:3344:102::1")
	macA  = [6]byte{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01}
	macB  = [6]byte{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x02}
	macD  = [6]byte{0xa8, 0x40, 0x25, 0xf0, 0x00, 0x04}
)

// v2p is keyed by (VNI, virtual IP), as upstream's set_v2p; the same
// address in two VNIs is two mappings (VPC.md §4.3 S5); setting the same
// mapping again changes nothing; a delete goes by (VNI, virtual IP) alone.
func TestV2P(t *testing.T) {
	var v V2P
	if changed, err := v.Set(7777, ip5, Phys{macA, sledA}); err != nil || !changed {
		t.Fatalf("Set: %v %v", changed, err)
	}
	e := v.Epoch()
	if changed, _ := v.Set(7777, ip5, Phys{macA, sledA}); changed || v.Epoch() != e {
		t.Error("the same mapping again changed the table")
	}
	v.Set(7777, ip6, Phys{macB, sledB})
	v.Set(8888, ip6, Phys{macD, sledA})
	if p, ok := v.Get(7777, ip6); !ok || p != (Phys{macB, sledB}) {
		t.Errorf("Get(7777, .6) = %v %v, want B's", p, ok)
	}
	if p, ok := v.Get(8888, ip6); !ok || p != (Phys{macD, sledA}) {
		t.Errorf("Get(8888, .6) = %v %v, want D's", p, ok)
	}
	if _, ok := v.Get(8888, ip5); ok {
		t.Error("a mapping of VNI 7777 is found in VNI 8888")
	}
	if vni, ok := v.VNIOf(ip6); !ok || vni != 7777 {
		t.Errorf("VNIOf(.6) = %d %v, want the lowest, 7777", vni, ok)
	}
	// An IPv4-mapped address is the IPv4 one.
	if _, ok := v.Get(7777, netip.AddrFrom16(ip5.As16())); !ok {
		t.Error("the v4-mapped form of a mapped address is not found")
	}
	want := []Mapping{{7777, ip5, Phys{macA, sledA}}, {7777, ip6, Phys{macB, sledB}}, {8888, ip6, Phys{macD, sledA}}}
	if got := v.Dump(); !slices.Equal(got, want) {
		t.Errorf("Dump = %v, want %v", got, want)
	}
	// Replaced in place.
	v.Set(7777, ip6, Phys{macB, sledA})
	if p, _ := v.Get(7777, ip6); p.Sled != sledA {
		t.Errorf("a mapping set again is %v", p)
	}
	if p, ok := v.Del(7777, ip6); !ok || p != (Phys{macB, sledA}) {
		t.Errorf("Del = %v %v", p, ok)
	}
	if _, ok := v.Del(7777, ip6); ok {
		t.Error("a second Del found the mapping")
	}
	if _, ok := v.Get(8888, ip6); !ok {
		t.Error("deleting VNI 7777's .6 took VNI 8888's")
	}
	for _, bad := range []struct {
		vni  uint32
		ip   netip.Addr
		sled netip.Addr
	}{{1 << 24, ip5, sledA}, {7777, netip.Addr{}, sledA}, {7777, ip5, netip.MustParseAddr("10.0.0.1")}} {
		if _, err := v.Set(bad.vni, bad.ip, Phys{macA, bad.sled}); err == nil {
			t.Errorf("Set(%d, %s, %s) accepted", bad.vni, bad.ip, bad.sled)
		}
	}
}

// Readers never see a table half written, and never wait for a writer.
func TestV2PReadersDuringWrites(t *testing.T) {
	var v V2P
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			v.Set(uint32(1024+i%16), ip5, Phys{macA, sledA})
			v.Del(uint32(1024+(i+8)%16), ip5)
		}
		close(stop)
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, m := range v.Dump() {
					if m.Phys != (Phys{macA, sledA}) {
						t.Errorf("a reader saw %v", m)
						return
					}
				}
				v.Get(1030, ip5)
			}
		}()
	}
	wg.Wait()
}

var (
	tep1 = TEP{netip.MustParseAddr("fd00:99::1"), BoundaryVNI}
	tep2 = TEP{netip.MustParseAddr("fd00:99::2"), BoundaryVNI}
	any4 = netip.MustParsePrefix("0.0.0.0/0")
	net8 = netip.MustParsePrefix("198.51.100.0/24")
)

// v2b: endpoints per prefix, the longest prefix wins, a flow is hashed
// onto one of its endpoints in address order; set adds to a prefix's
// endpoints (by address: one there already keeps its VNI), remove takes
// them and the prefix with the last (OPTE's Virt2Boundary).
func TestV2B(t *testing.T) {
	var b V2B
	if _, ok := b.Pick(netip.MustParseAddr("198.51.100.1"), 0); ok {
		t.Error("an empty table picked an endpoint")
	}
	b.Set(any4, tep2)
	b.Set(any4, tep1, TEP{tep2.Addr, 100})
	if teps, _ := b.Get(netip.MustParseAddr("8.8.8.8")); !slices.Equal(teps, []TEP{tep1, tep2}) {
		t.Errorf("0/0's endpoints %v, want both in address order, tep2 with its first VNI", teps)
	}
	for h, want := range map[uint32]TEP{0: tep1, 1: tep2, 2: tep1, 7: tep2} {
		if got, ok := b.Pick(netip.MustParseAddr("8.8.8.8"), h); !ok || got != want {
			t.Errorf("Pick(hash %d) = %v, want %v", h, got, want)
		}
	}
	b.Set(net8, tep2)
	if got, _ := b.Pick(netip.MustParseAddr("198.51.100.7"), 0); got != tep2 {
		t.Errorf("the longer prefix lost: %v", got)
	}
	if got, _ := b.Pick(netip.MustParseAddr("198.51.101.7"), 0); got != tep1 {
		t.Errorf("outside the longer prefix: %v", got)
	}
	b.Remove(net8, tep2)
	if got := b.Dump(); len(got) != 1 || got[0].Prefix != any4 {
		t.Errorf("after removing the /24's last endpoint: %v", got)
	}
	b.Remove(any4, tep1)
	if teps, _ := b.Get(netip.MustParseAddr("8.8.8.8")); !slices.Equal(teps, []TEP{tep2}) {
		t.Errorf("after removing tep1: %v", teps)
	}
	if err := b.Set(any4, TEP{netip.MustParseAddr("10.0.0.1"), 99}); err == nil {
		t.Error("an IPv4 tunnel endpoint was taken")
	}
}

// Replace makes the table what the routing daemon says, and says whether
// that changed it.
func TestV2BReplace(t *testing.T) {
	var b V2B
	want := map[netip.Prefix][]TEP{any4: {tep2, tep1}, netip.MustParsePrefix("::/0"): {tep1}}
	if changed, err := b.Replace(want); err != nil || !changed {
		t.Fatalf("Replace: %v %v", changed, err)
	}
	e := b.Epoch()
	if changed, _ := b.Replace(map[netip.Prefix][]TEP{any4: {tep1, tep2}, netip.MustParsePrefix("::/0"): {tep1}}); changed || b.Epoch() != e {
		t.Error("the same table again changed it")
	}
	if teps, _ := b.Get(netip.MustParseAddr("2001:db8::1")); !slices.Equal(teps, []TEP{tep1}) {
		t.Errorf("::/0: %v", teps)
	}
	b.Replace(nil)
	if got := b.Dump(); len(got) != 0 {
		t.Errorf("after withdrawing everything: %v", got)
	}
}

func BenchmarkV2PGet(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(itoa(n), func(b *testing.B) {
			var v V2P
			for i := range n {
				v.Set(7777, netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}), Phys{macA, sledA})
			}
			b.ReportAllocs()
			for b.Loop() {
				v.Get(7777, ip5)
			}
		})
	}
}

func BenchmarkV2BPick(b *testing.B) {
	var t V2B
	t.Set(any4, tep1, tep2)
	t.Set(net8, tep1)
	dst := netip.MustParseAddr("8.8.8.8")
	b.ReportAllocs()
	for b.Loop() {
		t.Pick(dst, 12345)
	}
}

func itoa(n int) string {
	return map[int]string{1: "1", 1000: "1k", 10000: "10k"}[n]
}
