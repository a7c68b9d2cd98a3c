package hardware

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// cpuID is what CPUID leaves 0 and 1 say of the processor: its vendor and
// its family and model, with the extended bits already folded in.
type cpuID struct {
	Vendor string
	Family uint32
	Model  uint32
}

// parseCPUInfo reads the first processor of a /proc/cpuinfo. Linux prints
// "cpu family" and "model" already combined with their extended fields
// (base family + extended family when the base is 0xF; extended model << 4
// | base model from family 6 up), which for AMD's families 0x19 and 0x1A is
// exactly the computation upstream does on CPUID leaf 1 (AMD APM volume 3,
// E.3.2), so the numbers can be matched against upstream's ranges as they
// are. A cpuinfo without them (not x86) is an error.
func parseCPUInfo(r io.Reader) (cpuID, error) {
	var id cpuID
	var haveFamily, haveModel bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			if haveFamily || haveModel || id.Vendor != "" {
				break // the end of the first processor
			}
			continue
		}
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch key {
		case "vendor_id":
			id.Vendor = value
		case "cpu family", "model":
			n, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				return cpuID{}, fmt.Errorf("cpuinfo %s %q: not a number", key, value)
			}
			if key == "model" {
				id.Model, haveModel = uint32(n), true
			} else {
				id.Family, haveFamily = uint32(n), true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return cpuID{}, fmt.Errorf("reading cpuinfo: %w", err)
	}
	if id.Vendor == "" || !haveFamily || !haveModel {
		return cpuID{}, fmt.Errorf("cpuinfo names no vendor_id, cpu family and model (vendor %q, family found %t, model found %t)", id.Vendor, haveFamily, haveModel)
	}
	return id, nil
}

// amdVendor is CPUID leaf 0's vendor string of AMD processors.
const amdVendor = "AuthenticAMD"

// family maps a processor to upstream's SledCpuFamily with upstream's rule
// (omicron sled-hardware/src/lib.rs, detect_cpu_family): only AMD parts are
// known, and client parts are reported as the server part they match:
//
//	family 0x19, models 0x00-0x0F (Milan, Zen 3 Threadripper)  amd_milan
//	family 0x19, models 0x10-0x1F (Genoa, Zen 4 Threadripper)  amd_milan (Milan is what a guest may choose; Zen 4 EPYC is rounded down to it)
//	family 0x19, models 0x20-0x2F (Vermeer, client Zen 3)      amd_milan
//	family 0x19, models 0x60-0x6F (Raphael, client Zen 4)      amd_milan
//	family 0x1A, models 0x00-0x0F (Turin)                      amd_turin
//	family 0x1A, models 0x10-0x1F (Turin Dense, Zen 5c)        amd_turin_dense
//	family 0x1A, models 0x40-0x4F (Granite Ridge, client Zen 5) amd_turin
//
// Everything else (other models of those families, mostly mobile parts;
// other families; other vendors) is unknown.
func (id cpuID) family() CPUFamily {
	if id.Vendor != amdVendor {
		return CPUUnknown
	}
	m := id.Model
	switch id.Family {
	case 0x19:
		switch {
		case m <= 0x0F, m >= 0x10 && m <= 0x1F, m >= 0x20 && m <= 0x2F, m >= 0x60 && m <= 0x6F:
			return CPUAMDMilan
		}
	case 0x1A:
		switch {
		case m <= 0x0F, m >= 0x40 && m <= 0x4F:
			return CPUAMDTurin
		case m >= 0x10 && m <= 0x1F:
			return CPUAMDTurinDns
		}
	}
	return CPUUnknown
}
