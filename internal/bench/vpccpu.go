package bench

// Where the VPC data path's CPU goes: the process is profiled while the VPC
// way carries its stream (the data paths of both sleds run in it, beside
// the guests' sockets), and each sample is put in one part by its stack.

import (
	"bytes"
	"fmt"
	"io"
	"runtime/pprof"
	"strings"

	"github.com/google/pprof/profile"
)

// CPUPart is one part of the process's CPU during the VPC way's stream.
type CPUPart struct {
	Part string `json:"part"`
	// Share is the part's share of the profile's CPU time, 0 to 1.
	Share float64 `json:"share"`
	// CPUSecondsPerGbit is the part's share of the way's CPU seconds per
	// Gbit.
	CPUSecondsPerGbit float64 `json:"cpu_seconds_per_gbit"`
}

// The parts, in the order they are printed. Kernel time spent in a system
// call is the call's, including the network stack's work the kernel does
// in its context (a frame written to a veth is often taken up to the
// receiving socket before the write returns).
const (
	partReadKernel   = "data path: reading, in system calls"
	partReadGo       = "data path: reading, Go's poller and wrappers"
	partWriteKernel  = "data path: writing, in system calls"
	partWriteGo      = "data path: writing, Go's poller and wrappers"
	partEngine       = "data path: engine"
	partDataPath     = "data path: its loops and dispatch"
	partGuests       = "guests' sockets (the benchmark's own)"
	partScheduler    = "Go runtime: scheduler, network poller, timers"
	partGC           = "Go runtime: memory and garbage collector"
	partOther        = "other"
	internalPrefix   = "github.com/sled-agent/sled-agent/internal/"
	netioPrefix      = internalPrefix + "vpc/netio."
	vpcdPrefix       = internalPrefix + "vpc/vpcd."
	benchPrefix      = internalPrefix + "bench."
	runtimePrefix    = "runtime."
	runtimeSysPrefix = "internal/runtime/"
)

var cpuParts = []string{partReadKernel, partReadGo, partWriteKernel, partWriteGo, partEngine, partDataPath,
	partGuests, partScheduler, partGC, partOther}

// enginePackages are the engine and the libraries it runs frames through.
var enginePackages = []string{"engine", "wire", "flow", "rules", "mappings", "gateway", "snat"}

// classify puts a sample in its part by its stack, function names leaf
// first.
func classify(stack []string) string {
	leafInKernel := len(stack) > 0 && inSyscall(stack[0])
	for _, f := range stack {
		switch {
		case strings.HasPrefix(f, netioPrefix+"(*Port).Read") || strings.HasPrefix(f, netioPrefix+"(*Underlay).Read"):
			if leafInKernel {
				return partReadKernel
			}
			return partReadGo
		case strings.HasPrefix(f, netioPrefix+"(*Port).Write") || strings.HasPrefix(f, netioPrefix+"(*Underlay).Write"):
			if leafInKernel {
				return partWriteKernel
			}
			return partWriteGo
		}
	}
	for _, f := range stack {
		for _, p := range enginePackages {
			if strings.HasPrefix(f, internalPrefix+"vpc/"+p+".") {
				return partEngine
			}
		}
	}
	runtimeOnly := true
	for _, f := range stack {
		switch {
		case strings.HasPrefix(f, vpcdPrefix):
			return partDataPath
		case strings.HasPrefix(f, benchPrefix):
			return partGuests
		case !strings.HasPrefix(f, runtimePrefix) && !strings.HasPrefix(f, runtimeSysPrefix):
			runtimeOnly = false
		}
	}
	if !runtimeOnly || len(stack) == 0 {
		return partOther
	}
	for _, f := range stack {
		if strings.HasPrefix(f, "runtime.gc") || strings.HasPrefix(f, "runtime.bgsweep") ||
			strings.HasPrefix(f, "runtime.bgscavenge") || f == "runtime.mallocgc" {
			return partGC
		}
	}
	return partScheduler
}

// inSyscall is whether a leaf function is a system call's entry, where a
// sample taken in the kernel lands.
func inSyscall(f string) bool {
	switch f {
	case "internal/runtime/syscall.Syscall6", "internal/runtime/syscall/linux.Syscall6",
		"syscall.RawSyscall6", "syscall.rawSyscallNoError", "syscall.Syscall6", "syscall.Syscall":
		return true
	}
	return false
}

// cpuBreakdown sums a CPU profile's samples by part and scales the shares
// to cpuPerGbit; parts with no sample are left out.
func cpuBreakdown(p *profile.Profile, cpuPerGbit float64) []CPUPart {
	vi := len(p.SampleType) - 1 // a CPU profile's last value is its nanoseconds
	sums := map[string]int64{}
	var total int64
	var stack []string
	for _, s := range p.Sample {
		stack = stack[:0]
		for _, loc := range s.Location {
			for _, l := range loc.Line { // inlined functions first
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		v := s.Value[vi]
		sums[classify(stack)] += v
		total += v
	}
	var out []CPUPart
	for _, part := range cpuParts {
		if sums[part] == 0 {
			continue
		}
		share := float64(sums[part]) / float64(total)
		out = append(out, CPUPart{Part: part, Share: share, CPUSecondsPerGbit: share * cpuPerGbit})
	}
	return out
}

// cpuProfile profiles the process until its stop is called, which returns
// the profile; the raw profile is also written to w if not nil.
type cpuProfile struct {
	buf bytes.Buffer
	w   io.Writer
}

func startCPUProfile(w io.Writer) (*cpuProfile, error) {
	c := &cpuProfile{w: w}
	if err := pprof.StartCPUProfile(&c.buf); err != nil {
		return nil, fmt.Errorf("profiling the data path's CPU: %w", err)
	}
	return c, nil
}

func (c *cpuProfile) stop() (*profile.Profile, error) {
	pprof.StopCPUProfile()
	if c.w != nil {
		if _, err := c.w.Write(c.buf.Bytes()); err != nil {
			return nil, fmt.Errorf("writing the CPU profile: %w", err)
		}
	}
	return profile.Parse(&c.buf)
}

// cpuSummary is the parts in a line, for people.
func cpuSummary(parts []CPUPart) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %.0f%%", p.Part, 100*p.Share)
	}
	return b.String()
}
