package hardware

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/sys/unix"
)

// Options say where the truth is read from and what the operator says
// instead of it.
type Options struct {
	// Part, Serial and Revision, if set, are the baseboard's, whatever the
	// firmware says (--baseboard-part, --baseboard-serial,
	// --baseboard-revision).
	Part     string
	Serial   string
	Revision *uint32

	// Where to read from (tests); empty: the host's DMIDir, /proc/cpuinfo,
	// /proc/meminfo, and os.Hostname.
	DMIDir   string
	CPUInfo  string
	MemInfo  string
	Hostname func() (string, error)
}

// Probe reads what this host is: its baseboard from DMI, its CPU family from
// /proc/cpuinfo, its memory from the kernel and the hardware threads this
// process may run on. What cannot be read is replaced by what upstream's
// sleds report in its place, and the notes (for the log) say which and why;
// the error is for a host whose memory cannot be known, or for overrides
// that cannot be reported. Every read is of a kernel file: nothing blocks.
func Probe(opts Options) (Info, []string, error) {
	if err := validOverride("baseboard-part", opts.Part); err != nil {
		return Info{}, nil, err
	}
	if err := validOverride("baseboard-serial", opts.Serial); err != nil {
		return Info{}, nil, err
	}
	if opts.DMIDir == "" {
		opts.DMIDir = DMIDir
	}
	if opts.CPUInfo == "" {
		opts.CPUInfo = "/proc/cpuinfo"
	}
	if opts.MemInfo == "" {
		opts.MemInfo = "/proc/meminfo"
	}
	if opts.Hostname == nil {
		opts.Hostname = os.Hostname
	}

	var info Info
	var notes []string
	b, bn := readBaseboard(opts.DMIDir, opts.Hostname)
	// An override replaces the field and the note on what it replaces.
	if opts.Part != "" {
		b.Part, bn.Part = opts.Part, ""
	}
	if opts.Serial != "" {
		b.Serial, bn.Serial = opts.Serial, ""
	}
	if opts.Revision != nil {
		b.Revision, bn.Revision = *opts.Revision, ""
	}
	info.Baseboard = b
	for _, n := range []string{bn.Part, bn.Serial, bn.Revision} {
		if n != "" {
			notes = append(notes, n)
		}
	}

	info.CPUFamily = CPUUnknown
	if id, err := readCPUID(opts.CPUInfo); err != nil {
		notes = append(notes, fmt.Sprintf("cpu family: %v; reporting %s", err, CPUUnknown))
	} else {
		info.CPUFamily = id.family()
		if info.CPUFamily == CPUUnknown {
			notes = append(notes, fmt.Sprintf("cpu family: %s family %#x model %#x is none upstream knows; reporting %s", id.Vendor, id.Family, id.Model, CPUUnknown))
		}
	}

	ram, err := memTotal(opts.MemInfo)
	if err != nil {
		var si unix.Sysinfo_t
		if serr := unix.Sysinfo(&si); serr != nil || si.Totalram == 0 {
			return Info{}, notes, fmt.Errorf("usable physical memory: %w; sysinfo: %w", err, cmpErr(serr, errors.New("no memory")))
		}
		ram = uint64(si.Totalram) * uint64(max(si.Unit, 1))
		notes = append(notes, fmt.Sprintf("usable physical memory: %v; reporting sysinfo's total", err))
	}
	info.PhysicalRAM = ram

	info.HardwareThreads = usableThreads()
	return info, notes, nil
}

// cmpErr is err, or def when err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// validOverride checks a part or serial the operator gives: reported as it
// is, it must be printable and not padded.
func validOverride(flag, v string) error {
	if v == "" {
		return nil
	}
	if strings.TrimSpace(v) != v || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%s %q: must be printable, without leading or trailing spaces", flag, v)
	}
	return nil
}

func readCPUID(path string) (cpuID, error) {
	f, err := os.Open(path)
	if err != nil {
		return cpuID{}, err
	}
	defer f.Close()
	return parseCPUInfo(f)
}

func memTotal(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseMemInfo(f)
}

// parseMemInfo reads MemTotal from a /proc/meminfo: the RAM the kernel can
// use (the physical RAM less what firmware reserves and the kernel's own
// image), as upstream reports the pages the kernel has (physmem).
func parseMemInfo(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("meminfo MemTotal %q: want a number of kB", strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb == 0 || kb > (1<<64-1)/1024 {
			return 0, fmt.Errorf("meminfo MemTotal %q: want a number of kB", strings.TrimSpace(rest))
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	return 0, errors.New("meminfo has no MemTotal")
}

// usableThreads is how many hardware threads this process may run on: its
// CPU affinity, which a cpuset or taskset narrows, else every CPU the Go
// runtime sees. Upstream counts the online processors; on a sled the agent
// is not confined, so the two agree there.
func usableThreads() uint32 {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		if n := set.Count(); n > 0 {
			return uint32(n)
		}
	}
	return uint32(max(goruntime.NumCPU(), 1))
}
