package guestcg

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// Size is what a guest's limits are sized for.
type Size struct {
	CPUs      int
	MemoryMiB int64
	// TCG is a guest whose CPUs QEMU emulates: QEMU's translation cache
	// is then part of its memory.
	TCG bool
	// HostMemory is the host's memory in bytes (MemTotal), which sizes
	// QEMU's default translation cache; 0 takes the cache's largest size.
	HostMemory int64
}

// Limits are what one guest's QEMU may use.
type Limits struct {
	// MemoryBytes bounds QEMU's memory (memory.max, memory.limit_in_bytes);
	// reaching it, QEMU is killed by the kernel (SIGKILL).
	MemoryBytes int64
	// CPUQuota is the CPU time QEMU's threads may use in each CPUPeriod
	// (cpu.max, cpu.cfs_quota_us per cpu.cfs_period_us).
	CPUQuota, CPUPeriod time.Duration
	// Pids bounds the tasks (processes and threads) in QEMU's cgroup
	// (pids.max, v1 and v2 alike): a QEMU taken over by its guest cannot
	// exhaust the host's pids.
	Pids int64
}

// The parts of the limits beyond the guest's own memory and vCPUs.
//
// QEMU's memory beyond the guest's RAM was measured on QEMU 7.2 (TCG, one
// vCPU, 256 MiB, every page of RAM touched with -mem-prealloc, booted to
// the test guest's prompt): its cgroup peaked at 365 MiB, 347 MiB of it
// anonymous (the guest's 256 MiB, 62 MiB of translation cache, 29 MiB of
// QEMU's own: heap, device models, the firmware's flash, thread stacks)
// and 15 MiB of page cache read from the disk. The limit adds to the
// guest's memory:
//
//   - qemuOverhead, 256 MiB, for QEMU itself: over five times the 44 MiB
//     measured (its own and the page cache), for more devices and queues,
//     vhost-net's buffers, the disks' I/O threads, and the page cache of
//     the disk files charged to the cgroup (which the kernel reclaims
//     before it kills anything);
//   - cpuOverhead, 16 MiB per vCPU: a vCPU thread's stack and state (and
//     its TLB under TCG);
//   - 1/32 of the guest's memory: the page tables and KVM's structures
//     that map it, dirty bitmaps;
//   - with TCG, QEMU's translation cache at its largest: QEMU 7.2 sizes it
//     at an eighth of the host's memory, at most 1 GiB, and the pages it has
//     filled stay charged (a guest that runs long enough fills it).
//
// Tasks: QEMU's own threads (main loop, RCU, the worker pool of each
// AioContext, at most 64 workers, signal and I/O threads, vhost-net's
// workers since Linux 6.4) and one thread per vCPU: pidsOverhead plus the
// vCPUs. Measured (QEMU 7.2, a 1-vCPU TCG guest booting and booted): 4 to
// 8 threads.
// QEMU's sandbox (spawn=deny) forbids it new processes; the limit holds
// its threads.
//
// So a guest that uses all its memory is never near the limit; only a QEMU
// that leaks, or a guest that makes QEMU allocate without bound, reaches
// it.
//
// CPU: the guest's vCPUs, whole, plus a quarter of a CPU for QEMU's own
// threads (its main loop, the disks' I/O threads, vhost-net's workers, which
// since Linux 6.4 run in QEMU's cgroup).
const (
	qemuOverhead  = 256 << 20
	cpuOverhead   = 16 << 20
	tcgCacheMax   = 1 << 30
	qemuCPUShare  = 4 // 1/qemuCPUShare of a CPU for QEMU's own threads
	DefaultPeriod = 100 * time.Millisecond
	pageSize      = 4096
	guestMemShare = 32 // 1/guestMemShare of the guest's memory
	pidsOverhead  = 256
)

// LimitsFor returns the limits of a guest of size s (see above).
func LimitsFor(s Size) Limits {
	mem := s.MemoryMiB << 20
	cpus := int64(max(s.CPUs, 1))
	l := Limits{
		MemoryBytes: mem + qemuOverhead + cpus*cpuOverhead + mem/guestMemShare,
		CPUPeriod:   DefaultPeriod,
		CPUQuota:    time.Duration(cpus)*DefaultPeriod + DefaultPeriod/qemuCPUShare,
		Pids:        pidsOverhead + cpus,
	}
	if s.TCG {
		l.MemoryBytes += TCGCache(s.HostMemory)
	}
	l.MemoryBytes &^= pageSize - 1
	return l
}

// TCGCache is the largest translation cache QEMU 7.2 gives a TCG guest by
// default on a host of hostMemory bytes: an eighth of it, at most 1 GiB
// (tcg/region.c, size_code_gen_buffer).
func TCGCache(hostMemory int64) int64 {
	if hostMemory <= 0 {
		return tcgCacheMax
	}
	return min(tcgCacheMax, (hostMemory/8)&^(pageSize-1))
}

// HostMemory is this host's memory in bytes (/proc/meminfo's MemTotal),
// or 0 if it cannot be read.
func HostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return n << 10
				}
			}
		}
	}
	return 0
}

// String is the limits as people read them: "memory ≤ 1560 MiB, CPU ≤ 1.25,
// tasks ≤ 257".
func (l Limits) String() string {
	return "memory ≤ " + l.memory() + ", CPU ≤ " + l.cpu() + ", tasks ≤ " + l.pids()
}

func (l Limits) pids() string { return strconv.FormatInt(l.Pids, 10) }

func (l Limits) memory() string { return strconv.FormatInt(l.MemoryBytes>>20, 10) + " MiB" }

func (l Limits) cpu() string {
	if l.CPUPeriod <= 0 {
		return "?"
	}
	return strconv.FormatFloat(float64(l.CPUQuota)/float64(l.CPUPeriod), 'f', -1, 64)
}
