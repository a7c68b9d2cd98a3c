package rules

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// lpm is a longest-prefix-match index of one address family: binary
// search on prefix lengths (Waldvogel et al., "Scalable High Speed IP
// Routing Lookups", SIGCOMM 1997). Each prefix length present has a hash
// table of masked addresses. A lookup probes the middle length: a hit
// means the answer is that long or longer, a miss that it is shorter. So
// that a hit is never wrong, each prefix leaves a marker at the shorter
// lengths the search visits on its way to it, and every marker carries the
// best real match at its length. A lookup costs about log2(lengths)
// probes, 5 for IPv4 and 8 for IPv6 at worst.
type lpm struct {
	lens   []int                 // distinct prefix lengths, ascending
	levels []map[[2]uint64]int32 // per length: masked address → entry, or -1 for a marker with no match
}

// addrKey is an address as two words, IPv4 in the top 32 bits.
func addrKey(a netip.Addr) [2]uint64 {
	if a.Is4() {
		b := a.As4()
		return [2]uint64{uint64(binary.BigEndian.Uint32(b[:])) << 32, 0}
	}
	b := a.As16()
	return [2]uint64{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func maskKey(k [2]uint64, bits int) [2]uint64 {
	switch {
	case bits == 0:
		return [2]uint64{}
	case bits < 64:
		return [2]uint64{k[0] &^ (1<<(64-bits) - 1), 0}
	case bits == 64:
		return [2]uint64{k[0], 0}
	case bits < 128:
		return [2]uint64{k[0], k[1] &^ (1<<(128-bits) - 1)}
	}
	return k
}

// buildLPM indexes prefixes (masked, one family) and the entry each names.
func buildLPM(prefixes map[netip.Prefix]int32) lpm {
	var m lpm
	for p := range prefixes {
		m.lens = append(m.lens, p.Bits())
	}
	slices.Sort(m.lens)
	m.lens = slices.Compact(m.lens)
	level := make(map[int]int, len(m.lens))
	m.levels = make([]map[[2]uint64]int32, len(m.lens))
	real := make([]map[[2]uint64]int32, len(m.lens))
	for i, l := range m.lens {
		level[l] = i
		m.levels[i] = map[[2]uint64]int32{}
		real[i] = map[[2]uint64]int32{}
	}
	for p, e := range prefixes {
		i := level[p.Bits()]
		real[i][addrKey(p.Addr())] = e
		m.levels[i][addrKey(p.Addr())] = e
	}
	best := func(k [2]uint64, upTo int) int32 {
		for i := upTo; i >= 0; i-- {
			if e, ok := real[i][maskKey(k, m.lens[i])]; ok {
				return e
			}
		}
		return -1
	}
	for p := range prefixes {
		k, target := addrKey(p.Addr()), level[p.Bits()]
		lo, hi := 0, len(m.lens)-1
		for lo <= hi {
			mid := (lo + hi) / 2
			if mid == target {
				break
			}
			if mid > target {
				hi = mid - 1
				continue
			}
			mk := maskKey(k, m.lens[mid])
			if _, ok := m.levels[mid][mk]; !ok {
				m.levels[mid][mk] = best(mk, mid)
			}
			lo = mid + 1
		}
	}
	return m
}

// lookup returns the entry of the longest prefix holding a, or -1.
func (m *lpm) lookup(a netip.Addr) int32 {
	k := addrKey(a)
	found := int32(-1)
	lo, hi := 0, len(m.lens)-1
	for lo <= hi {
		mid := (lo + hi) / 2
		if e, ok := m.levels[mid][maskKey(k, m.lens[mid])]; ok {
			found = e
			lo = mid + 1
		} else {
			hi = mid - 1
		}
	}
	return found
}
