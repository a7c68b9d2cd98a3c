package bench

import (
	"bytes"
	"math"
	"runtime/pprof"
	"testing"

	"github.com/google/pprof/profile"
)

// Each sample goes to its part by its stack (leaf first): the data path's
// reads and writes, split at the system call; the engine and the libraries
// it runs frames through; the data path's loops; the guests' sockets; Go's
// scheduler and its garbage collector, alone on a stack; anything else.
func TestClassifyPutsSamplesInParts(t *testing.T) {
	const (
		netio = internalPrefix + "vpc/netio."
		vpcd  = internalPrefix + "vpc/vpcd."
		sys   = "internal/runtime/syscall/linux.Syscall6"
	)
	for _, c := range []struct {
		stack []string
		want  string
	}{
		{[]string{sys, "syscall.RawSyscall6", "golang.org/x/sys/unix.recvfrom", netio + "(*Port).Read.func1", "os.(*rawConn).Read", netio + "(*Port).Read", vpcd + "(*attached).read"}, partReadKernel},
		{[]string{"runtime.gopark", "internal/poll.(*pollDesc).waitRead", netio + "(*Port).Read", vpcd + "(*attached).read"}, partReadGo},
		{[]string{sys, "syscall.sendto", "net.(*UDPConn).WriteToUDPAddrPort", netio + "(*Underlay).WriteTo", vpcd + "(*Daemon).dispatch", vpcd + "(*attached).read"}, partWriteKernel},
		{[]string{sys, "syscall.recvfrom", "net.(*UDPConn).ReadFromUDPAddrPort", netio + "(*Underlay).ReadFrom", vpcd + "(*Daemon).underlayLoop"}, partReadKernel},
		{[]string{"internal/poll.(*fdMutex).rwlock", netio + "(*Port).Write", vpcd + "(*attached).write", vpcd + "(*Daemon).dispatch"}, partWriteGo},
		{[]string{sys, "syscall.Syscall6", netio + "(*Reads).recv", "os.(*rawConn).Read", netio + "(*Reads).read", netio + "(*Port).ReadBatch", vpcd + "(*attached).read"}, partReadKernel},
		{[]string{sys, "syscall.Syscall6", netio + "(*Writes).send", "os.(*rawConn).Write", netio + "(*Writes).write", netio + "(*Underlay).WriteBatch", vpcd + "(*Daemon).writeUnderlay"}, partWriteKernel},
		{[]string{"internal/poll.(*FD).RawRead", "os.(*rawConn).Read", netio + "(*Reads).read", netio + "(*Underlay).ReadBatch", vpcd + "(*Daemon).underlayLoop"}, partReadGo},
		{[]string{internalPrefix + "vpc/wire.crc32IEEE", internalPrefix + "vpc/engine.(*Engine).Outbound", vpcd + "(*attached).read"}, partEngine},
		{[]string{internalPrefix + "vpc/flow.(*Table[...]).Lookup", internalPrefix + "vpc/engine.(*Port).firewall"}, partEngine},
		{[]string{"sync.(*Mutex).Lock", vpcd + "(*Daemon).dispatch", vpcd + "(*Daemon).underlayLoop"}, partDataPath},
		{[]string{sys, "syscall.write", "net.(*conn).Write", benchPrefix + "(*vpcGuests).stream"}, partGuests},
		{[]string{"runtime.epollwait", "runtime.netpoll", "runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.mcall"}, partScheduler},
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker.func2", "runtime.gcBgMarkWorker"}, partGC},
		{[]string{"internal/runtime/atomic.(*Uint32).CompareAndSwap", "runtime.mallocgc", "runtime.newobject", "os.newFile"}, partOther},
		{[]string{"crypto/sha256.block", "main.main"}, partOther},
		{nil, partOther},
	} {
		if got := classify(c.stack); got != c.want {
			t.Errorf("%v: %q, want %q", c.stack, got, c.want)
		}
	}
}

// The breakdown sums each part's CPU time (inlined frames counted as their
// own functions), gives shares of the whole, scales them to the way's CPU
// per Gbit, and leaves out parts with none.
func TestCPUBreakdownSumsParts(t *testing.T) {
	fn := map[string]*profile.Function{}
	line := func(name string) profile.Line {
		if fn[name] == nil {
			fn[name] = &profile.Function{ID: uint64(len(fn) + 1), Name: name}
		}
		return profile.Line{Function: fn[name]}
	}
	loc := func(id uint64, names ...string) *profile.Location {
		l := &profile.Location{ID: id}
		for _, n := range names {
			l.Line = append(l.Line, line(n))
		}
		return l
	}
	sys := loc(1, "internal/runtime/syscall/linux.Syscall6")
	read := loc(2, internalPrefix+"vpc/netio.(*Port).Read")
	// The engine's function inlined into the loop's.
	engine := loc(3, internalPrefix+"vpc/wire.Parse", internalPrefix+"vpc/engine.(*Engine).Outbound", internalPrefix+"vpc/vpcd.(*attached).read")
	sched := loc(4, "runtime.findRunnable", "runtime.schedule")
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{sys, read}, Value: []int64{6, 60e6}},
			{Location: []*profile.Location{engine}, Value: []int64{3, 30e6}},
			{Location: []*profile.Location{sched}, Value: []int64{1, 10e6}},
		},
	}
	got := cpuBreakdown(p, 2)
	want := []CPUPart{{partReadKernel, 0.6, 1.2}, {partEngine, 0.3, 0.6}, {partScheduler, 0.1, 0.2}}
	if len(got) != len(want) {
		t.Fatalf("%+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Part != want[i].Part || math.Abs(got[i].Share-want[i].Share) > 1e-9 || math.Abs(got[i].CPUSecondsPerGbit-want[i].CPUSecondsPerGbit) > 1e-9 {
			t.Errorf("part %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A profile taken by startCPUProfile parses, and is written as it is to
// the writer given; a second profile at once is refused.
func TestCPUProfileWritesWhatItParses(t *testing.T) {
	var out bytes.Buffer
	c, err := startCPUProfile(&out)
	if err != nil {
		t.Skipf("profiling is on already: %v", err)
	}
	if _, err := startCPUProfile(nil); err == nil {
		t.Error("a second profile started")
	}
	x := 0
	for i := range 1 << 22 {
		x += i * i
	}
	_ = x
	p, err := c.stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.SampleType) == 0 || p.SampleType[len(p.SampleType)-1].Type != "cpu" {
		t.Errorf("sample types %v", p.SampleType)
	}
	q, err := profile.Parse(&out)
	if err != nil {
		t.Fatalf("what was written: %v", err)
	}
	if len(q.Sample) != len(p.Sample) {
		t.Errorf("written %d samples, parsed %d", len(q.Sample), len(p.Sample))
	}
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Errorf("profiling still on after stop: %v", err)
	}
	pprof.StopCPUProfile()
}
